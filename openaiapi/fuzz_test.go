package openaiapi

import (
	"bytes"
	"encoding/json"
	"slices"
	"testing"
)

// FuzzParse sends arbitrary bodies through the parser both front doors
// share: it answers every one with a request or an OpenAI-shaped 4xx,
// never a panic, and what it accepts has a prompt and a token budget.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		`{"prompt": "Hello, agent", "max_tokens": 8}`,
		`{"prompt": [[1, 2, 3]], "kv_transfer_params": {"do_remote_decode": true}}`,
		`{"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "max_completion_tokens": 4}`,
		`{"messages": [{"role": "system", "content": null}], "n": 2}`,
		`{"prompt": ["a"], "metadata": {"session": "s", "branch": 3}}`,
	} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	f.Fuzz(func(t *testing.T, body []byte, chat bool) {
		p, err := Parse(body, chat, 0)
		if err != nil {
			if err.Status < 400 || err.Status >= 500 || err.Message == "" {
				t.Fatalf("error %+v", err)
			}
			return
		}
		if len(p.Tokens) == 0 || p.MaxTokens < 1 {
			t.Fatalf("accepted %d prompt tokens, max_tokens %d", len(p.Tokens), p.MaxTokens)
		}
	})
}

// referencePromptTokens reads a prompt with encoding/json alone: what
// promptTokens did before it read token ids itself.
func referencePromptTokens(raw json.RawMessage) ([]uint32, *Error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, BadRequest("prompt", "prompt is required")
	}
	return decodePrompt(raw)
}

// FuzzPromptTokens: reading token ids in one pass gives what encoding/json
// gives, ids and errors alike, for any prompt a valid body can carry.
func FuzzPromptTokens(f *testing.F) {
	for _, s := range []string{
		`[1, 2, 3]`, `[[1,2,3]]`, ` [ [ 7 ] ] `, `[]`, `[[]]`, `[[1],[2]]`, `[0]`, `[00]`, `[-1]`, `[1.0]`, `[1e3]`,
		`[131071]`, `[131072]`, `[99999999999999999999]`, `["a"]`, `"hi"`, `""`, `[1, "a"]`, `[[1], 2]`, `[1]  `, `{"a": 1}`,
		`[ 1 ,2 , 3 ]`, "[1,\n2\t,3\r]", `[[1, 2]  ]`, `null`, `true`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		if !json.Valid(raw) {
			return // a prompt comes out of a body encoding/json read
		}
		got, gerr := promptTokens(raw)
		want, werr := referencePromptTokens(raw)
		if !slices.Equal(got, want) || (gerr == nil) != (werr == nil) || (gerr != nil && gerr.Message != werr.Message) {
			t.Fatalf("prompt %q: got %v %v, want %v %v", raw, got, gerr, want, werr)
		}
	})
}
