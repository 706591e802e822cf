package openaiapi

import (
	"encoding/json"
	"slices"
	"testing"
)

// Tools and tool calls take their place in a chat prompt: an agent's
// tool definitions are a prefix every turn shares, and its calls are part
// of the context the next turn extends.
func TestChatPromptRendersToolsAndToolCalls(t *testing.T) {
	parse := func(body string) []uint32 {
		t.Helper()
		p, err := Parse([]byte(body), true, 0)
		if err != nil {
			t.Fatal(err)
		}
		return p.Tokens
	}
	plain := parse(`{"messages":[{"role":"user","content":"fix it"}]}`)
	tools := `"tools":[{"type":"function","function":{"name":"Read","parameters":{"type":"object"}}}]`
	withTools := parse(`{` + tools + `,"messages":[{"role":"user","content":"fix it"}]}`)
	if len(withTools) <= len(plain)+5 || !slices.Equal(withTools[len(withTools)-len(plain):], plain) {
		t.Fatalf("tools come first, then the same messages: %d against %d tokens", len(withTools), len(plain))
	}
	// Spacing in the tools' JSON does not change the prompt.
	spaced := parse(`{"tools": [ {"type": "function", "function": {"name": "Read", "parameters": {"type": "object"}}} ], "messages":[{"role":"user","content":"fix it"}]}`)
	if !slices.Equal(spaced, withTools) {
		t.Error("the tools' JSON spacing changed the prompt")
	}
	call := parse(`{` + tools + `,"messages":[{"role":"user","content":"fix it"},
		{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"Read","arguments":"{\"path\":\"a.go\"}"}}]},
		{"role":"tool","tool_call_id":"c1","content":"package a"}]}`)
	bare := parse(`{` + tools + `,"messages":[{"role":"user","content":"fix it"},
		{"role":"assistant","content":null},
		{"role":"tool","tool_call_id":"c1","content":"package a"}]}`)
	if len(call) < len(bare)+10 {
		t.Errorf("the tool call is not in the prompt: %d against %d tokens", len(call), len(bare))
	}
	if !slices.Equal(call[:len(withTools)-1], withTools[:len(withTools)-1]) {
		t.Error("a later turn does not extend the first one")
	}
	for _, empty := range []string{`"tools":null,`, `"tools":[],`} {
		if got := parse(`{` + empty + `"messages":[{"role":"user","content":"fix it"}]}`); !slices.Equal(got, plain) {
			t.Errorf("%s changed the prompt", empty)
		}
	}
}

// continue_final_message and add_generation_prompt shape a chat prompt's
// end as vLLM's do, and a request asking for both, or continuing no
// assistant message, is refused.
func TestChatPromptContinuesAFinalMessage(t *testing.T) {
	ask, err := Parse([]byte(`{"messages":[{"role":"user","content":"fix it"}]}`), true, 0)
	if err != nil {
		t.Fatal(err)
	}
	cont, err := Parse([]byte(`{"messages":[{"role":"user","content":"fix it"},{"role":"assistant","content":" baca"}],
		"continue_final_message":true,"add_generation_prompt":false}`), true, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cont.Tokens[:len(ask.Tokens)], ask.Tokens) || len(cont.Tokens) != len(ask.Tokens)+1 {
		t.Fatalf("continued %v, asked %v", cont.Tokens, ask.Tokens)
	}
	for _, body := range []string{
		`{"messages":[{"role":"assistant","content":"x"}],"continue_final_message":true,"add_generation_prompt":true}`,
		`{"messages":[{"role":"user","content":"x"}],"continue_final_message":true}`,
	} {
		if _, err := Parse([]byte(body), true, 0); err == nil || err.Status != 400 || err.Param != "continue_final_message" {
			t.Errorf("%s: %v", body, err)
		}
	}
}

// An engine given the router's ids in PromptTokensMember reads the same
// request as from its messages, without them; a client cannot hand the
// router ids in their place.
func TestChatPromptGivenAsTokens(t *testing.T) {
	chat := []byte(`{"model": "m", "messages": [{"role": "system", "content": "You are a coding agent."},
		{"role": "user", "content": "fix the scheduler"}], "tools": [{"type": "function", "function": {"name": "Read"}}],
		"tool_choice": "required", "max_tokens": 9, "stream": true}`)
	want, perr := Parse(chat, true, 0)
	if perr != nil {
		t.Fatal(perr)
	}
	b, err := ParseObject(chat)
	if err != nil {
		t.Fatal(err)
	}
	ids, _ := json.Marshal(want.Tokens)
	for _, leg := range [][]byte{
		b.With(map[string]json.RawMessage{"messages": nil, PromptTokensMember: ids}),
		b.With(map[string]json.RawMessage{PromptTokensMember: ids}), // the ids win over messages
	} {
		got, perr := Parse(leg, true, 0)
		if perr != nil {
			t.Fatalf("%s: %v", leg, perr)
		}
		if !slices.Equal(got.Tokens, want.Tokens) || got.MaxTokens != 9 || !got.Req.Stream || string(got.Req.ToolChoice) != `"required"` ||
			len(got.Req.Tools) == 0 || got.Req.Model != "m" {
			t.Fatalf("%s read as %+v, want %+v", leg, got, want)
		}
	}
	for _, bad := range []string{`[]`, `"hi"`, `[1, -2]`, `[131072]`} {
		leg := b.With(map[string]json.RawMessage{"messages": nil, PromptTokensMember: json.RawMessage(bad)})
		if _, perr := Parse(leg, true, 0); perr == nil || perr.Param != PromptTokensMember {
			t.Fatalf("%s: %v", leg, perr)
		}
	}
	// The router reads a client's messages, whatever ids it adds.
	sly := b.With(map[string]json.RawMessage{PromptTokensMember: json.RawMessage(`[1, 2, 3]`)})
	if p, _, perr := ParseBody(sly, true, 0); perr != nil || !slices.Equal(p.Tokens, want.Tokens) {
		t.Fatalf("router read %v, %v", p, perr)
	}
}
