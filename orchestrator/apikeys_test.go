package orchestrator

import (
	"encoding/json"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// With API keys, the agents' API answers only requests that carry one,
// as a bearer token or in x-api-key, and says so in the shape of the API
// asked; health and metrics stay open.
func TestAPIKeysGuardTheAgentsAPI(t *testing.T) {
	for _, bad := range []string{"a key with spaces", "sk-one,sk-two", "team/a sk-one", ""} {
		if _, err := New(Config{NATSURL: "nats://127.0.0.1:1", ControlAddr: "127.0.0.1:0", APIKeys: []string{bad}}); err == nil {
			t.Errorf("API key entry %q was taken", bad)
		}
	}
	o, err := New(Config{NATSURL: "nats://127.0.0.1:1", ControlAddr: "127.0.0.1:0", APIKeys: []string{"sk-one", "team-b sk-two"}, PlannerMode: PlannerOff})
	if err != nil {
		t.Fatal(err)
	}
	h := o.routerHandler()
	for _, c := range []struct {
		method, path string
		header       [2]string
		status       int
		errType      string // the error's type: OpenAI's, or Anthropic's
	}{
		{"GET", "/v1/models", [2]string{}, 401, "invalid_request_error"},
		{"GET", "/v1/models", [2]string{"Authorization", "Bearer sk-two"}, 200, ""},
		{"GET", "/v1/models", [2]string{"Authorization", "bearer sk-one"}, 200, ""},
		{"GET", "/v1/models", [2]string{"x-api-key", "sk-one"}, 200, ""},
		{"GET", "/v1/models", [2]string{"Authorization", "Bearer sk-three"}, 401, "invalid_request_error"},
		{"GET", "/v1/models", [2]string{"Authorization", "sk-one"}, 401, "invalid_request_error"},
		{"POST", "/v1/messages", [2]string{"x-api-key", "sk-on"}, 401, "authentication_error"},
		{"POST", "/v1/chat/completions", [2]string{}, 401, "invalid_request_error"},
		{"DELETE", "/v1/sessions/s1", [2]string{}, 401, "invalid_request_error"},
		{"GET", "/health", [2]string{}, 200, ""},
		{"GET", "/metrics", [2]string{}, 200, ""},
	} {
		t.Run(c.method, func(t *testing.T) {
			r := httptest.NewRequest(c.method, c.path, nil)
			if c.header[0] != "" {
				r.Header.Set(c.header[0], c.header[1])
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != c.status {
				t.Errorf("%s %s with %v: %d, want %d: %s", c.method, c.path, c.header, w.Code, c.status, w.Body)
				return
			}
			if c.status != 401 {
				return
			}
			var e struct {
				Type  string `json:"type"`
				Error struct {
					Type string `json:"type"`
					Code string `json:"code"`
				} `json:"error"`
			}
			json.Unmarshal(w.Body.Bytes(), &e)
			if e.Error.Type != c.errType || w.Header().Get("WWW-Authenticate") == "" ||
				(c.errType == "invalid_request_error" && e.Error.Code != "invalid_api_key") ||
				(c.errType == "authentication_error" && e.Type != "error") {
				t.Errorf("%s %s: 401 body %s, headers %v", c.method, c.path, w.Body, w.Header())
			}
		})
	}
	if got := testutil.ToFloat64(o.met.requests.WithLabelValues("evolve", "unauthorized")); got != 6 {
		t.Errorf("%v unauthorized requests counted, want 6", got)
	}
}

// A path the router serves asked with another method is a 405 with Allow,
// and a path it does not serve a 404, in the shape of the API asked:
// Anthropic's on /v1/messages or for its clients (issue #56: a GET of
// /v1/messages was answered in OpenAI's shape, which Anthropic's SDKs do
// not read).
func TestRefusedRoutesAreAnsweredInTheAPIsShape(t *testing.T) {
	o, err := New(Config{NATSURL: "nats://127.0.0.1:1", ControlAddr: "127.0.0.1:0", PlannerMode: PlannerOff})
	if err != nil {
		t.Fatal(err)
	}
	h := o.routerHandler()
	for _, c := range []struct {
		method, path, anthropicVersion string
		status                         int
		anthropic                      bool
	}{
		{"GET", "/v1/messages", "", 405, true},
		{"PUT", "/v1/messages/count_tokens", "", 405, true},
		{"GET", "/v1/messages/nope", "", 404, true},
		{"GET", "/v1/chat/completions", "2023-06-01", 405, true},
		{"GET", "/v1/chat/completions", "", 405, false},
		{"POST", "/v1/embeddings", "", 404, false},
	} {
		t.Run(c.method+c.path, func(t *testing.T) {
			r := httptest.NewRequest(c.method, c.path, nil)
			if c.anthropicVersion != "" {
				r.Header.Set("anthropic-version", c.anthropicVersion)
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != c.status {
				t.Fatalf("%d, want %d: %s", w.Code, c.status, w.Body)
			}
			if c.status == 405 && w.Header().Get("Allow") == "" {
				t.Error("a 405 without Allow")
			}
			var e struct {
				Type  string `json:"type"`
				Error struct {
					Type    string `json:"type"`
					Message string `json:"message"`
				} `json:"error"`
			}
			if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil || e.Error.Message == "" {
				t.Fatalf("not an error body: %s", w.Body)
			}
			if got := e.Type == "error"; got != c.anthropic {
				t.Errorf("Anthropic's shape (type error): %v, want %v: %s", got, c.anthropic, w.Body)
			}
		})
	}
}
