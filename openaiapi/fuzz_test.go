package openaiapi

import "testing"

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
