package responsesapi

import (
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/evolvellm/evolve/openaiapi"
)

// chatOf is what ToChat made, read back.
type chatOf struct {
	Model    string `json:"model"`
	Messages []struct {
		Role       string          `json:"role"`
		Content    json.RawMessage `json:"content"`
		ToolCallID string          `json:"tool_call_id"`
		ToolCalls  []struct {
			ID       string `json:"id"`
			Function struct{ Name, Arguments string }
		} `json:"tool_calls"`
	} `json:"messages"`
	Tools []struct {
		Function struct {
			Name        string          `json:"name"`
			Description string          `json:"description"`
			Parameters  json.RawMessage `json:"parameters"`
		} `json:"function"`
	} `json:"tools"`
	ToolChoice        any               `json:"tool_choice"`
	ParallelToolCalls *bool             `json:"parallel_tool_calls"`
	MaxTokens         *int              `json:"max_tokens"`
	Stream            bool              `json:"stream"`
	Metadata          map[string]string `json:"metadata"`
	ResponseFormat    map[string]any    `json:"response_format"`
	ReasoningEffort   string            `json:"reasoning_effort"`
}

func toChat(t *testing.T, body string) (chatOf, Info) {
	t.Helper()
	b, info, err := ToChat([]byte(body))
	if err != nil {
		t.Fatalf("refused: %v", err)
	}
	if _, perr := openaiapi.Parse(b, true, 0); perr != nil {
		t.Fatalf("its chat request %s is refused: %v", b, perr)
	}
	var c chatOf
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	return c, info
}

// A turn of Codex 0.171, as it sends it (its texts shortened), after a
// few turns: developer messages, a user message with an image, its
// earlier reasoning (dropped), an answer with three calls (a function, a
// namespaced function, a custom tool) and their outputs; its tools
// include a namespace, a custom tool and the hosted web_search.
func TestCodexTurnTranslates(t *testing.T) {
	body, err := os.ReadFile("testdata/codex-0.171-turn.json")
	if err != nil {
		t.Fatal(err)
	}
	c, info := toChat(t, string(body))
	var roles []string
	for _, m := range c.Messages {
		roles = append(roles, m.Role)
	}
	want := []string{"system", "system", "user", "user", "assistant", "tool", "tool", "assistant", "tool", "user"}
	if !slices.Equal(roles, want) {
		t.Fatalf("messages %v, want %v", roles, want)
	}
	calls := c.Messages[4].ToolCalls
	if string(c.Messages[4].Content) != `"I'll list the files."` || len(calls) != 2 || calls[0].Function.Name != "exec_command" ||
		calls[1].Function.Name != "multi_agent_v1__spawn_agent" || calls[1].ID != "call_2" {
		t.Fatalf("the answer's text and calls: %s %+v", c.Messages[4].Content, calls)
	}
	if c.Messages[5].ToolCallID != "call_1" || !strings.Contains(string(c.Messages[5].Content), "README.md") ||
		c.Messages[6].ToolCallID != "call_2" || string(c.Messages[6].Content) != `"agent started"` {
		t.Fatalf("the calls' outputs: %+v %+v", c.Messages[5], c.Messages[6])
	}
	patch := c.Messages[7].ToolCalls
	if len(patch) != 1 || patch[0].Function.Name != "apply_patch" || patch[0].Function.Arguments != `{"input":"*** Begin Patch\n*** End Patch\n"}` {
		t.Fatalf("the custom tool's call: %+v", patch)
	}
	if !strings.Contains(string(c.Messages[9].Content), `"image_url"`) || !strings.Contains(string(c.Messages[9].Content), "data:image/png") {
		t.Fatalf("the image: %s", c.Messages[9].Content)
	}
	var names []string
	for _, tl := range c.Tools {
		names = append(names, tl.Function.Name)
	}
	for _, n := range []string{"exec_command", "multi_agent_v1__spawn_agent", "multi_agent_v1__close_agent", "apply_patch"} {
		if !slices.Contains(names, n) {
			t.Errorf("tool %s missing from %v", n, names)
		}
	}
	if slices.Contains(names, "web_search") || !slices.Equal(info.Dropped, []string{"web_search"}) {
		t.Errorf("tools %v, dropped %v: web_search is hosted", names, info.Dropped)
	}
	if tn := info.Tools["multi_agent_v1__spawn_agent"]; tn.Name != "spawn_agent" || tn.Namespace != "multi_agent_v1" || !info.Tools["apply_patch"].Custom {
		t.Errorf("tool names kept for the answer: %+v", info.Tools)
	}
	if c.ToolChoice != "auto" || c.ParallelToolCalls == nil || !*c.ParallelToolCalls || !c.Stream || c.MaxTokens != nil {
		t.Errorf("tool_choice %v, parallel %v, stream %v, max_tokens %v", c.ToolChoice, c.ParallelToolCalls, c.Stream, c.MaxTokens)
	}
	key := c.Metadata["prompt_cache_key"]
	if key == "" || c.Metadata["thread_id"] != key || c.Metadata["session_id"] != key || c.Metadata["x-codex-turn-metadata"] == "" {
		t.Errorf("metadata %v: the session's names pass on", c.Metadata)
	}
}

// The request's other members map to their chat equivalents; what needs
// a stored response is refused, saying what to send instead.
func TestRequestMembers(t *testing.T) {
	c, _ := toChat(t, `{"model": "m", "instructions": "be brief", "input": "hello", "max_output_tokens": 300,
		"temperature": 0.2, "reasoning": {"effort": "high", "summary": "auto"}, "store": true, "include": ["reasoning.encrypted_content"],
		"text": {"format": {"type": "json_schema", "name": "answer", "schema": {"type": "object"}, "strict": true}},
		"tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}], "tool_choice": {"type": "function", "name": "f"}}`)
	if len(c.Messages) != 2 || c.Messages[0].Role != "system" || string(c.Messages[1].Content) != `"hello"` ||
		c.MaxTokens == nil || *c.MaxTokens != 300 || c.ReasoningEffort != "high" || c.ResponseFormat["type"] != "json_schema" {
		t.Fatalf("chat %+v", c)
	}
	if tc, _ := c.ToolChoice.(map[string]any); tc == nil || tc["function"].(map[string]any)["name"] != "f" {
		t.Fatalf("tool_choice %v", c.ToolChoice)
	}
	for body, want := range map[string]string{
		`{"model": "m", "input": "hi", "previous_response_id": "resp_1", "store": true}`: "previous_response_id is not supported",
		`{"model": "m", "input": [{"type": "item_reference", "id": "msg_1"}]}`:           "item_reference is not supported",
		`{"input": "hi"}`:                                       "model: field required",
		`{"model": "m", "input": []}`:                           "at least one message",
		`{"model": "m", "input": "hi", "max_output_tokens": 0}`: "max_output_tokens must be at least 1",
		`{"model": "m", "input": 5}`:                            "input must be a string or a list of items",
		`{"model": "m", "input": [{"type": "message", "role": "robot", "content": "x"}]}`:                         "role must be",
		`{"model": "m", "input": "hi", "tools": [{"type": "function", "name": "f", "parameters": "nope"}]}`:       "must be a JSON schema object",
		`{"model": "m", "input": "hi", "tools": [{"type": "web_search"}], "tool_choice": {"type": "web_search"}}`: "hosted tool",
		`{"model": "m", "input": "hi", "max_output_tokens": "many"}`:                                              "max_output_tokens must be a whole number, not a string",
	} {
		_, _, err := ToChat([]byte(body))
		if err == nil || err.Status != 400 || !strings.Contains(err.Message, want) || strings.Contains(err.Message, "Go ") {
			t.Errorf("%s: %v, want a 400 saying %q", body, err, want)
		}
	}
}
