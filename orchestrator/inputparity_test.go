package orchestrator

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/evolvellm/evolve/roles"
)

// Requests vLLM refuses are refused by the router too, 400, whichever API
// they come through; a body too large is 413, a wrong method 405.
func TestRouterRefusesWhatVLLMRefuses(t *testing.T) {
	tc := startTestCluster(t, roles.Decode)
	base := tc.o.RouterURL()
	chat := func(extra string) string {
		return fmt.Sprintf(`{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4%s}`, extra)
	}
	completion := func(extra string) string { return fmt.Sprintf(`{"prompt": "hi", "max_tokens": 4%s}`, extra) }
	messages := func(extra string) string {
		return fmt.Sprintf(`{"model": "evolve-tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4%s}`, extra)
	}
	bad := []string{`, "temperature": -3`, `, "top_p": 7`, `, "top_p": 0`, `, "top_k": -5`, `, "presence_penalty": 9`, `, "min_p": 2`}
	for _, extra := range bad {
		for path, body := range map[string]string{"/v1/completions": completion(extra), "/v1/chat/completions": chat(extra)} {
			t.Run(path, func(t *testing.T) {
				if status, b := postJSON(t, base+path, body); status != 400 {
					t.Errorf("%s with %s: %d %v", path, extra, status, b)
				}
			})
		}
	}
	for _, extra := range []string{`, "temperature": -3`, `, "top_p": 7`, `, "top_k": -5`} {
		if status, b := postJSON(t, base+"/v1/messages", messages(extra)); status != 400 {
			t.Errorf("/v1/messages with %s: %d %v", extra, status, b)
		}
	}
	for _, c := range []struct{ path, body string }{
		{"/v1/completions", completion(`, "logprobs": 1000000`)},
		{"/v1/chat/completions", chat(`, "logprobs": true, "top_logprobs": 1000000`)},
		{"/v1/chat/completions", `{"messages": [{"role": "wizard", "content": "hi"}], "max_tokens": 4}`},
		{"/v1/completions", completion(`, "stop": 5`)},
		// 2^63-1: refused alike on every path, not overflowed into a pass.
		{"/v1/completions", `{"prompt": "hi", "max_tokens": 9223372036854775807}`},
		{"/v1/chat/completions", `{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 9223372036854775807}`},
		{"/v1/messages", `{"model": "evolve-tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 9223372036854775807}`},
	} {
		t.Run(c.path, func(t *testing.T) {
			if status, b := postJSON(t, base+c.path, c.body); status != 400 {
				t.Errorf("%s %s: %d %v", c.path, c.body, status, b)
			}
		})
	}
	// Within range: served.
	for path, body := range map[string]string{"/v1/completions": completion(`, "temperature": 0.7, "top_p": 1, "logprobs": 5, "stop": ["\n"]`),
		"/v1/chat/completions": chat(`, "temperature": 0, "top_k": -1, "logprobs": true, "top_logprobs": 20`),
		"/v1/messages":         messages(`, "temperature": 1, "top_k": 40`)} {
		t.Run(path, func(t *testing.T) {
			if status, b := postJSON(t, base+path, body); status != 200 {
				t.Errorf("%s in range: %d %v", path, status, b)
			}
		})
	}

	huge := `{"prompt": "` + strings.Repeat("a", 33<<20) + `", "max_tokens": 1}`
	for _, path := range []string{"/v1/completions", "/v1/chat/completions", "/v1/messages"} {
		resp, err := http.Post(base+path, "application/json", strings.NewReader(huge))
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		resp.Body.Close()
		if resp.StatusCode != 413 {
			t.Errorf("a 33 MB body to %s: %d, want 413", path, resp.StatusCode)
		}
	}
	for _, c := range []struct{ method, path, allow string }{
		{"GET", "/v1/completions", "POST"}, {"PUT", "/v1/chat/completions", "POST"}, {"GET", "/v1/messages", "POST"}, {"POST", "/v1/models", "GET"},
		{"POST", "/", "GET"},
	} {
		t.Run(c.method, func(t *testing.T) {
			req, _ := http.NewRequest(c.method, base+c.path, nil)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != 405 || resp.Header.Get("Allow") != c.allow {
				t.Errorf("%s %s: %d Allow %q, want 405 Allow %s", c.method, c.path, resp.StatusCode, resp.Header.Get("Allow"), c.allow)
			}
		})
	}
	if status, _ := postJSON(t, base+"/v1/nothing", `{}`); status != 404 {
		t.Errorf("an unknown path: %d", status)
	}
	// Claude Code checks its base URL with HEAD /.
	if resp, err := http.Head(base + "/"); err != nil || resp.StatusCode != 200 {
		t.Errorf("HEAD /: %v %v", err, resp)
	}
}
