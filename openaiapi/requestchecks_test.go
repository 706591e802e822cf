package openaiapi

import (
	"fmt"
	"strings"
	"testing"
)

// Bad inputs are refused with a 400 that names the member at fault in
// the API's words, never in Go's (issue #56: "json: cannot unmarshal
// string into Go struct field Request.max_tokens of type int"), on the
// engine's Parse and the router's ParseBody alike.
func TestBadInputsAreRefusedInTheAPIsWords(t *testing.T) {
	chat := func(extra string) string {
		return `{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4` + extra + `}`
	}
	for _, c := range []struct {
		name, body   string
		param, words string
	}{
		{"max_tokens a string", chat(`, "max_tokens": "three"`), "max_tokens", "max_tokens must be a whole number, not a string"},
		{"messages a string", `{"messages": "hi"}`, "messages", "messages must be a list, not a string"},
		{"stream a number", chat(`, "stream": 1`), "stream", "stream must be true or false"},
		{"not JSON", `{"messages": [`, "", "malformed JSON body"},
		{"kv_transfer_params of the wrong type", chat(`, "kv_transfer_params": {"do_remote_decode": "yes"}`), "kv_transfer_params", "do_remote_decode must be true or false"},
		{"temperature 5", chat(`, "temperature": 5`), "temperature", "temperature must be in [0, 2], got 5"},
		{"temperature -1", chat(`, "temperature": -1`), "temperature", "temperature must be in [0, 2]"},
		{"top_p 0", chat(`, "top_p": 0`), "top_p", "top_p must be in (0, 1]"},
		{"top_p 1.5", chat(`, "top_p": 1.5`), "top_p", "top_p must be in (0, 1]"},
		{"a tool named 5", chat(`, "tools": [{"type": "function", "function": {"name": 5, "parameters": {}}}]`), "tools[0].function.name", "must be a string, not a number"},
		{"a tool without a name", chat(`, "tools": [{"type": "function", "function": {"parameters": {}}}]`), "tools[0].function.name", "is required"},
		{"parameters a string", chat(`, "tools": [{"type": "function", "function": {"name": "Read", "parameters": "nope"}}]`), "tools[0].function.parameters", "must be a JSON Schema object, not a string"},
		{"tools an object", chat(`, "tools": {"name": "Read"}`), "tools", "tools must be a list of tools"},
		{"a tool of another type", chat(`, "tools": [{"type": "web_search"}]`), "tools[0].type", `must be "function"`},
		{"a tool without its function", chat(`, "tools": [{"type": "function", "name": "Read"}]`), "tools[0].function", "is required"},
		{"response_format xml", chat(`, "response_format": {"type": "xml"}`), "response_format.type", `text, json_object or json_schema (got "xml")`},
		{"response_format a string", chat(`, "response_format": "json"`), "response_format", "must be an object"},
		{"json_schema without its schema", chat(`, "response_format": {"type": "json_schema"}`), "response_format.json_schema", "needs json_schema"},
		{"100 stop strings", chat(`, "stop": [` + strings.TrimSuffix(strings.Repeat(`"x",`, 100), ",") + `]`), "stop", fmt.Sprintf("stop holds 100 strings; at most %d", MaxStopStrings)},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, how := range []string{"Parse", "ParseBody"} {
				var err *Error
				if how == "Parse" {
					_, err = Parse([]byte(c.body), true, 0)
				} else {
					_, _, err = ParseBody([]byte(c.body), true, 0)
				}
				if err == nil {
					t.Fatalf("%s accepted %s", how, c.body)
				}
				if err.Status != 400 || err.Param != c.param || !strings.Contains(err.Message, c.words) {
					t.Errorf("%s: %d param %q %q, want 400 param %q saying %q", how, err.Status, err.Param, err.Message, c.param, c.words)
				}
				for _, goText := range []string{"Go struct", "Go value", "openaiapi.", "json: ", "unmarshal"} {
					if strings.Contains(err.Message, goText) {
						t.Errorf("%s: %q speaks Go (%q)", how, err.Message, goText)
					}
				}
			}
		})
	}
}

// What agents' clients send passes: the OpenAI SDK's and opencode's tools
// (strict, descriptions, empty parameters), structured output, a few stop
// strings, the edges of the ranges.
func TestClientsRequestsPassTheChecks(t *testing.T) {
	for _, body := range []string{
		`{"messages": [{"role": "user", "content": "hi"}], "temperature": 0, "top_p": 1}`,
		`{"messages": [{"role": "user", "content": "hi"}], "temperature": 2, "top_p": 0.01}`,
		`{"messages": [{"role": "user", "content": "hi"}], "tools": [
			{"type": "function", "function": {"name": "bash", "description": "Run a command", "strict": false,
			 "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"], "additionalProperties": false}}},
			{"function": {"name": "noargs"}},
			{"type": "function", "function": {"name": "nulls", "description": null, "parameters": null}}],
		 "tool_choice": "auto", "parallel_tool_calls": true}`,
		`{"messages": [{"role": "user", "content": "hi"}], "tools": null, "response_format": null}`,
		`{"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "text"}}`,
		`{"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_object"}}`,
		`{"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": {"type": "object"}, "strict": true}}}`,
		`{"messages": [{"role": "user", "content": "hi"}], "stop": ["\n\n", "Question:", "</s>", "<|im_end|>", "Q:"]}`,
		`{"messages": [{"role": "user", "content": "hi"}], "stop": "\n"}`,
	} {
		if _, err := Parse([]byte(body), true, 0); err != nil {
			t.Errorf("refused %s: %v", body, err)
		}
		if _, _, err := ParseBody([]byte(body), true, 0); err != nil {
			t.Errorf("the router refused %s: %v", body, err)
		}
	}
	if _, err := Parse([]byte(`{"prompt": "hi", "response_format": {"type": "json_object"}, "stop": ["a", "b"]}`), false, 0); err != nil {
		t.Errorf("a completion with a response_format: %v", err)
	}
}
