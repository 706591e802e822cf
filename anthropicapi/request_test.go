package anthropicapi

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// A Claude Code-like turn: system blocks, tools, an earlier tool call and
// its result, and the metadata that names the session.
const codingTurn = `{
  "model": "glm-5", "max_tokens": 512, "stream": true,
  "system": [{"type": "text", "text": "You are a coding agent."}, {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
  "tools": [{"name": "Read", "description": "Read a file", "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}],
  "tool_choice": {"type": "auto", "disable_parallel_tool_use": true},
  "stop_sequences": ["</done>"], "temperature": 0.5, "top_k": 40,
  "metadata": {"user_id": "user_abc_account_42_session_7f3e-9a"},
  "messages": [
    {"role": "user", "content": "Fix the bug in main.go"},
    {"role": "assistant", "content": [
      {"type": "thinking", "thinking": "look first", "signature": "s"},
      {"type": "text", "text": "Reading it."},
      {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"path": "main.go"}}]},
    {"role": "user", "content": [
      {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "package main"}]},
      {"type": "text", "text": "Go on."}]}
  ]
}`

func TestToChatTranslatesACodingTurn(t *testing.T) {
	b, info, err := ToChat([]byte(codingTurn))
	if err != nil {
		t.Fatal(err)
	}
	if info.Model != "glm-5" || !info.Stream || len(info.StopSequences) != 1 {
		t.Fatalf("info %+v", info)
	}
	var chat struct {
		Model         string `json:"model"`
		MaxTokens     int    `json:"max_tokens"`
		Stream        bool   `json:"stream"`
		StreamOptions struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
		Stop        []string `json:"stop"`
		Temperature float64  `json:"temperature"`
		TopK        int      `json:"top_k"`
		Messages    []struct {
			Role       string          `json:"role"`
			Content    json.RawMessage `json:"content"`
			ToolCallID string          `json:"tool_call_id"`
			ToolCalls  []toolCall      `json:"tool_calls"`
		} `json:"messages"`
		Tools []struct {
			Type     string `json:"type"`
			Function struct {
				Name        string          `json:"name"`
				Description string          `json:"description"`
				Parameters  json.RawMessage `json:"parameters"`
			} `json:"function"`
		} `json:"tools"`
		ToolChoice        string          `json:"tool_choice"`
		ParallelToolCalls *bool           `json:"parallel_tool_calls"`
		Metadata          map[string]any  `json:"metadata"`
		Continue          json.RawMessage `json:"continue_final_message"`
	}
	if err := json.Unmarshal(b, &chat); err != nil {
		t.Fatalf("%v in %s", err, b)
	}
	if chat.Model != "glm-5" || chat.MaxTokens != 512 || !chat.Stream || !chat.StreamOptions.IncludeUsage ||
		chat.Stop[0] != "</done>" || chat.Temperature != 0.5 || chat.TopK != 40 {
		t.Errorf("parameters: %s", b)
	}
	roles := []string{}
	for _, m := range chat.Messages {
		roles = append(roles, m.Role)
	}
	if got := strings.Join(roles, ","); got != "system,user,assistant,tool,user" {
		t.Fatalf("roles %s in %s", got, b)
	}
	str := func(raw json.RawMessage) string {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			t.Fatalf("content %s is not a string", raw)
		}
		return s
	}
	if s := str(chat.Messages[0].Content); s != "You are a coding agent.\nBe brief." {
		t.Errorf("system %q", s)
	}
	as := chat.Messages[2]
	if str(as.Content) != "Reading it." || len(as.ToolCalls) != 1 || as.ToolCalls[0].ID != "toolu_1" ||
		as.ToolCalls[0].Type != "function" || as.ToolCalls[0].Function.Name != "Read" ||
		as.ToolCalls[0].Function.Arguments != `{"path": "main.go"}` {
		t.Errorf("assistant turn (thinking dropped, tool_use a tool call): %+v", as)
	}
	if tr := chat.Messages[3]; tr.ToolCallID != "toolu_1" || str(tr.Content) != "package main" {
		t.Errorf("tool result: %+v", tr)
	}
	if s := str(chat.Messages[4].Content); s != "Go on." {
		t.Errorf("user text after the tool result: %q", s)
	}
	if len(chat.Tools) != 1 || chat.Tools[0].Type != "function" || chat.Tools[0].Function.Name != "Read" ||
		chat.Tools[0].Function.Description != "Read a file" || !strings.Contains(string(chat.Tools[0].Function.Parameters), `"path"`) {
		t.Errorf("tools: %+v", chat.Tools)
	}
	if chat.ToolChoice != "auto" || chat.ParallelToolCalls == nil || *chat.ParallelToolCalls {
		t.Errorf("tool choice %q, parallel %v", chat.ToolChoice, chat.ParallelToolCalls)
	}
	if chat.Metadata["session"] != nil || chat.Metadata["user_id"] != "user_abc_account_42_session_7f3e-9a" {
		t.Errorf("metadata %v", chat.Metadata)
	}
	if chat.Continue != nil {
		t.Errorf("a turn ending with the user's message continues nothing: %s", chat.Continue)
	}
}

func TestToChatContinuesAnAssistantPrefill(t *testing.T) {
	b, _, err := ToChat([]byte(`{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"Say hi"},{"role":"assistant","content":"Hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	var chat map[string]any
	json.Unmarshal(b, &chat)
	if chat["continue_final_message"] != true || chat["add_generation_prompt"] != false {
		t.Errorf("prefill: %s", b)
	}
	if _, ok := chat["stream"]; ok {
		t.Errorf("not streamed: %s", b)
	}
}

func TestToChatImages(t *testing.T) {
	b, _, err := ToChat([]byte(`{"model":"m","max_tokens":8,"messages":[{"role":"user","content":[
		{"type":"text","text":"What is on screen?"},
		{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBOR"}},
		{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"shot"},{"type":"image","source":{"type":"url","url":"https://x/y.png"}}]}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	for _, want := range []string{`"url":"data:image/png;base64,iVBOR"`, `"url":"https://x/y.png"`, `"role":"tool"`, `"tool_call_id":"t1"`} {
		if !strings.Contains(s, want) {
			t.Errorf("missing %s in %s", want, s)
		}
	}
	if strings.Index(s, `"role":"tool"`) > strings.Index(s, `"role":"user"`) {
		t.Errorf("the tool result must come before the user's text: %s", s)
	}
}

func TestToChatRefusesWhatItCannotServe(t *testing.T) {
	for _, c := range []struct{ body, want string }{
		{`{`, "malformed JSON"},
		{`{"max_tokens":8,"messages":[{"role":"user","content":"x"}]}`, "model: field required"},
		{`{"model":"m","messages":[{"role":"user","content":"x"}]}`, "max_tokens: field required"},
		{`{"model":"m","max_tokens":0,"messages":[{"role":"user","content":"x"}]}`, "at least 1"},
		{`{"model":"m","max_tokens":8,"messages":[]}`, "at least one message"},
		{`{"model":"m","max_tokens":8,"messages":[{"role":"wizard","content":"x"}]}`, "messages.0.role: must be user, assistant or system"},
		{`{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"x"},{"role":"system","content":[{"type":"image"}]}]}`, "messages.1.content: a system message.0: only text blocks"},
		{`{"model":"m","max_tokens":8,"messages":[{"role":"user"}]}`, "messages.0.content: content is required"},
		{`{"model":"m","max_tokens":8,"messages":[{"role":"user","content":[{"type":"document","source":{}}]}]}`, "document blocks are not supported"},
		{`{"model":"m","max_tokens":8,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"file"}}]}]}`, `image source type "file"`},
		{`{"model":"m","max_tokens":8,"messages":[{"role":"user","content":[{"type":"tool_result"}]}]}`, "tool_use_id: field required"},
		{`{"model":"m","max_tokens":8,"messages":[{"role":"assistant","content":[{"type":"tool_use","name":"x"}]}]}`, "needs an id and a name"},
		{`{"model":"m","max_tokens":8,"system":[{"type":"image"}],"messages":[{"role":"user","content":"x"}]}`, "system.0: only text"},
		{`{"model":"m","max_tokens":8,"tools":[{"type":"web_search_20250305","name":"web_search"}],"messages":[{"role":"user","content":"x"}]}`, `tool type "web_search_20250305" is not supported`},
		{`{"model":"m","max_tokens":8,"tools":[{"name":"x"}],"messages":[{"role":"user","content":"x"}]}`, "input_schema"},
		{`{"model":"m","max_tokens":8,"tools":[{"name":"x","input_schema":{}}],"tool_choice":{"type":"tool"},"messages":[{"role":"user","content":"x"}]}`, "tool_choice.name"},
		{`{"model":"m","max_tokens":8,"tool_choice":{"type":"any"},"messages":[{"role":"user","content":"x"}]}`, "requires tools"},
		{`{"model":"m","max_tokens":8,"tool_choice":{"type":"maybe"},"messages":[{"role":"user","content":"x"}]}`, "tool_choice.type"},
	} {
		t.Run(c.body, func(t *testing.T) {
			_, _, err := ToChat([]byte(c.body))
			if err == nil || err.Status != 400 || err.Type != "invalid_request_error" || !strings.Contains(err.Message, c.want) {
				t.Errorf("%s: got %+v, want a 400 saying %q", c.body, err, c.want)
			}
		})
	}
}

// Claude Code sends system messages mid-conversation (its agent and skill
// lists, with the beta mid-conversation-system): each becomes a system
// message in its place, after the system prompt. They got a 400 before,
// and no turn of Claude Code's succeeded.
func TestToChatKeepsMidConversationSystemMessages(t *testing.T) {
	b, _, err := ToChat([]byte(`{"model":"m","max_tokens":8,"system":"You are Claude Code.","messages":[
		{"role":"user","content":"hi"},
		{"role":"system","content":[{"type":"text","text":"Available agents:"},{"type":"text","text":"- general-purpose"}]},
		{"role":"assistant","content":"Hello."},
		{"role":"system","content":"Skills: none"},
		{"role":"user","content":"go on"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	var chat struct {
		Messages []struct{ Role, Content string } `json:"messages"`
	}
	if err := json.Unmarshal(b, &chat); err != nil {
		t.Fatal(err)
	}
	want := []struct{ Role, Content string }{{"system", "You are Claude Code."}, {"user", "hi"},
		{"system", "Available agents:\n- general-purpose"}, {"assistant", "Hello."}, {"system", "Skills: none"}, {"user", "go on"}}
	if len(chat.Messages) != len(want) {
		t.Fatalf("messages %+v", chat.Messages)
	}
	for i := range want {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			if chat.Messages[i] != want[i] {
				t.Fatalf("message %d: %+v, want %+v", i, chat.Messages[i], want[i])
			}
		})
	}
}

// Claude Code asks for its session titles as JSON of a schema
// (output_config): vLLM's engines get it as response_format.
func TestToChatAsksForStructuredOutput(t *testing.T) {
	b, _, err := ToChat([]byte(`{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"title?"}],
		"output_config":{"format":{"type":"json_schema","schema":{"type":"object","properties":{"title":{"type":"string"}}}}}}`))
	if err != nil {
		t.Fatal(err)
	}
	var chat struct {
		ResponseFormat struct {
			Type       string `json:"type"`
			JSONSchema struct {
				Schema map[string]any `json:"schema"`
			} `json:"json_schema"`
		} `json:"response_format"`
	}
	if err := json.Unmarshal(b, &chat); err != nil || chat.ResponseFormat.Type != "json_schema" || chat.ResponseFormat.JSONSchema.Schema["type"] != "object" {
		t.Fatalf("response_format %+v (%v) from %s", chat.ResponseFormat, err, b)
	}
	if _, _, err := ToChat([]byte(`{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"x"}],"output_config":{"format":{"type":"xml"}}}`)); err == nil || err.Status != 400 {
		t.Fatalf("an output format other than a JSON schema: %v", err)
	}
}

func TestCountTokensChatNeedsNoMaxTokens(t *testing.T) {
	b, err := CountTokensChat([]byte(`{"model":"m","messages":[{"role":"user","content":"x"}],"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), `"stream"`) {
		t.Errorf("a count is never streamed: %s", b)
	}
	if _, err := CountTokensChat([]byte(`null`)); err == nil {
		t.Error("null accepted")
	}
}

// What Anthropic's API refuses is refused, in its words and never in
// Go's (issue #56: a tool named 5, a budget of -5 thinking tokens and a
// temperature of 5 were accepted, and a max_tokens of "three" answered
// "cannot unmarshal string into Go struct field").
func TestToChatRefusesBadInputsInAnthropicsWords(t *testing.T) {
	msg := func(extra string) string {
		return `{"model":"m","max_tokens":2048,"messages":[{"role":"user","content":"x"}]` + extra + `}`
	}
	stops := `"x"` + strings.Repeat(`,"x"`, 99)
	for _, c := range []struct{ name, body, want string }{
		{"max_tokens a string", `{"model":"m","max_tokens":"three","messages":[{"role":"user","content":"x"}]}`, "max_tokens must be a whole number, not a string"},
		{"messages a string", `{"model":"m","max_tokens":8,"messages":"hi"}`, "messages must be a list, not a string"},
		{"content a number", `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":[{"type":"text","text":5}]}]}`, "text must be a string, not a number"},
		{"a tool named 5", msg(`,"tools":[{"name":5,"input_schema":{"type":"object"}}]`), "tools.name must be a string, not a number"},
		{"input_schema a string", msg(`,"tools":[{"name":"Read","input_schema":"nope"}]`), "tools.0.input_schema: must be a JSON schema object"},
		{"temperature 5", msg(`,"temperature":5`), "temperature: must be between 0 and 1 (got 5)"},
		{"top_p 0", msg(`,"top_p":0`), "top_p: must be greater than 0 and at most 1"},
		{"a budget of -5", msg(`,"thinking":{"type":"enabled","budget_tokens":-5}`), "thinking.budget_tokens: must be at least 1024 (got -5)"},
		{"a budget of 1000", msg(`,"thinking":{"type":"enabled","budget_tokens":1000}`), "must be at least 1024"},
		{"a budget of max_tokens", msg(`,"thinking":{"type":"enabled","budget_tokens":2048}`), "must be less than max_tokens (2048 >= 2048)"},
		{"no budget", msg(`,"thinking":{"type":"enabled"}`), "thinking.budget_tokens: field required"},
		{"a budget of text", msg(`,"thinking":{"type":"enabled","budget_tokens":"lots"}`), "budget_tokens must be a whole number, not a string"},
		{"100 stop sequences", msg(`,"stop_sequences":[` + stops + `]`), "stop_sequences: 100 given; at most 16"},
		{"count_tokens of a bad body", `{"model": }`, "malformed JSON body: not valid JSON"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := ToChat([]byte(c.body))
			if c.name == "count_tokens of a bad body" {
				_, err = CountTokensChat([]byte(c.body))
			}
			if err == nil || err.Status != 400 || err.Type != "invalid_request_error" || !strings.Contains(err.Message, c.want) {
				t.Fatalf("got %+v, want a 400 saying %q", err, c.want)
			}
			for _, goText := range []string{"Go struct", "Go value", "anthropicapi.", "json: ", "unmarshal"} {
				if strings.Contains(err.Message, goText) {
					t.Errorf("%q speaks Go (%q)", err.Message, goText)
				}
			}
		})
	}
	// What Claude Code and the SDKs send passes.
	for _, ok := range []string{
		msg(`,"temperature":1,"top_p":0.9,"top_k":40,"stop_sequences":["</done>"]`),
		`{"model":"m","max_tokens":32000,"thinking":{"type":"enabled","budget_tokens":31999},"messages":[{"role":"user","content":"x"}]}`,
		msg(`,"thinking":{"type":"enabled","budget_tokens":1024}`),
		msg(`,"thinking":{"type":"disabled"}`),
		msg(`,"thinking":{"type":"adaptive"}`),
		msg(`,"temperature":0`),
	} {
		if _, _, err := ToChat([]byte(ok)); err != nil {
			t.Errorf("refused %s: %v", ok, err)
		}
	}
}
