package openaiapi

import (
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
