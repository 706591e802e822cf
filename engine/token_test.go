package engine

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/evolvellm/evolve/roles"
)

// call sends body (GET when empty, else POST) to url with the given
// Authorization ("" for none) and returns the status and the answer.
func call(t *testing.T, url, auth, body string) (int, []byte) {
	t.Helper()
	method := "POST"
	if body == "" {
		method = "GET"
	}
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// send is call for a JSON answer, decoded.
func send(t *testing.T, url, auth, body string) (int, map[string]any) {
	t.Helper()
	status, b := call(t, url, auth, body)
	var out map[string]any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("POST %s: %d %q is not JSON", url, status, b)
	}
	return status, out
}

// An engine with a token serves /v1/ and /evolve/v1/ only to requests that
// carry it, keeps /health and /metrics open, and sends it to the peer it
// pulls a prefill leg's KV from.
func TestEngineTokenGuardsTheAPIAndTravelsToPeers(t *testing.T) {
	const token = "t0k-3n"
	_, pre := startEngineConfig(t, Config{ID: "pre", Role: roles.Prefill, Speedup: 50, Token: token}, nil)
	_, dec := startEngineConfig(t, Config{ID: "dec", Role: roles.Decode, Speedup: 50, Token: token}, nil)
	_, open := startEngineConfig(t, Config{ID: "open", Role: roles.Decode, Speedup: 50}, nil)

	for _, path := range []string{"/health", "/metrics"} {
		if status, _ := call(t, pre.URL+path, "", ""); status != 200 {
			t.Fatalf("GET %s without the token: %d, want 200 (it stays open)", path, status)
		}
	}
	prompt := `{"prompt": "` + strings.Repeat("Trace the request through the scheduler. ", 12) + `", "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": true}}`
	for _, c := range []struct{ path, auth, body string }{
		{"/v1/completions", "", prompt},
		{"/v1/completions", "Bearer wrong", prompt},
		{"/v1/completions", token, prompt}, // not as a bearer token
		{"/v1/models", "", ""},
		{"/evolve/v1/kv/lookup", "", `{"blocks": [1, 2]}`},
		{"/evolve/v1/kv/pull", "", `{"remote_request_id": "x"}`},
	} {
		t.Run(c.path, func(t *testing.T) {
			if status, b := call(t, pre.URL+c.path, c.auth, c.body); status != 401 || !strings.Contains(string(b), `"invalid_engine_token"`) {
				t.Fatalf("%s with Authorization %q: %d %s, want 401 invalid_engine_token", c.path, c.auth, status, b)
			}
		})
	}

	// The scheme is the same in any case (RFC 7235): "bearer" is "Bearer".
	for _, scheme := range []string{"bearer", "BEARER", "Bearer"} {
		if status, b := call(t, pre.URL+"/v1/models", scheme+" "+token, ""); status != 200 {
			t.Errorf("GET /v1/models with %q: %d %s, want 200", scheme+" TOKEN", status, b)
		}
	}

	// The prefill leg, with the token, holds its KV for a decode engine.
	status, leg := send(t, pre.URL+"/v1/completions", "Bearer "+token, prompt)
	if status != 200 {
		t.Fatalf("prefill leg with the token: %d %v", status, leg)
	}
	kvp, _ := json.Marshal(leg["kv_transfer_params"])
	decodeLeg := strings.Replace(prompt, `"max_tokens": 1, "kv_transfer_params": {"do_remote_decode": true}`, `"max_tokens": 4, "kv_transfer_params": `+string(kvp), 1)

	// A decode engine without the token cannot pull it: the prefill engine
	// refuses, and the decode engine recomputes and says why.
	status, out := send(t, open.URL+"/v1/completions", "", decodeLeg)
	ev, _ := out["evolve"].(map[string]any)
	if status != 200 || !strings.Contains(ev["pull_error"].(string), "401") || ev["transferred_tokens"].(float64) != 0 {
		t.Fatalf("decode leg on an engine without the token: %d %v", status, out)
	}
	// The decode engine with it pulls the KV.
	status, out = send(t, dec.URL+"/v1/completions", "Bearer "+token, decodeLeg)
	ev, _ = out["evolve"].(map[string]any)
	if status != 200 || ev["pull_error"] != nil && ev["pull_error"] != "" || ev["transferred_tokens"].(float64) == 0 {
		t.Fatalf("decode leg on an engine with the token: %d %v", status, out)
	}
}
