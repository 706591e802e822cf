package orchestrator

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/evolvellm/evolve/internal/wait"
	"github.com/evolvellm/evolve/roles"
)

// When every engine fails a request, the agent is told so with the
// request's id, and nothing of the cluster's inside (addresses, dial
// errors); the log keeps the cause under the same id.
func TestFailedRequestTellsTheAgentNoInternals(t *testing.T) {
	rec := &recordLog{}
	tc := startTestClusterLogged(t, slog.New(rec), nil, roles.Decode, roles.Decode)
	tc.servers[0].Close()
	tc.servers[1].Close()
	status, body := postJSON(t, tc.o.RouterURL()+"/v1/completions", `{"prompt": "hello", "max_tokens": 3}`)
	e, _ := body["error"].(map[string]any)
	msg, _ := e["message"].(string)
	if status != 503 || msg == "" {
		t.Fatalf("every engine down: %d %v", status, body)
	}
	for _, leak := range []string{"127.0.0.1", "dial tcp", "connection refused", "http://"} {
		if strings.Contains(msg, leak) {
			t.Fatalf("the agent's error shows %q: %s", leak, msg)
		}
	}
	i := strings.Index(msg, "(request ")
	if i < 0 {
		t.Fatalf("no request id in %q", msg)
	}
	id := strings.TrimSuffix(msg[i+len("(request "):], ")")
	wait.Until(t, 10*time.Second, "the log to keep the cause under the request's id", func() bool {
		r := rec.find("request failed", "request", id)
		return r != nil && strings.Contains(fmt.Sprint(r["cause"]), "127.0.0.1") && r["reason"] == msg &&
			r["status"] == int64(503) && r["api"] == "completions"
	})
}

// Every request the router refuses is logged once, at warn, with its id,
// its API, its status and the reason in the words the client got: bad
// input, an unknown model, a prompt over the context, a path not served.
func TestRefusedRequestsAreLoggedOnce(t *testing.T) {
	rec := &recordLog{}
	tc := startTestClusterLogged(t, slog.New(rec), nil, roles.Decode)
	router := tc.o.RouterURL()
	for i, c := range []struct {
		path, body, api string
		status          int
	}{
		{"/v1/completions", `{"prompt": "hi", "max_tokens": "three"}`, "completions", 400},
		{"/v1/chat/completions", `{"model": "nope", "messages": [{"role": "user", "content": "hi"}]}`, "chat", 404},
		{"/v1/completions", `{"prompt": "hello", "max_tokens": 9000}`, "completions", 400},
		{"/v1/messages", `{"model": "x", "messages": []}`, "messages", 400},
		{"/v1/embeddings", `{}`, "/v1/embeddings", 404},
	} {
		id := fmt.Sprintf("refused-%d", i)
		req, _ := http.NewRequest("POST", router+c.path, strings.NewReader(c.body))
		req.Header.Set("X-Request-Id", id)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body struct {
			Error struct{ Message string }
		}
		json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if resp.StatusCode != c.status || body.Error.Message == "" {
			t.Fatalf("%s %s: answered %d %+v, want %d", c.path, c.body, resp.StatusCode, body, c.status)
		}
		var lines []map[string]any
		for _, r := range rec.all("request failed") {
			if r["request"] == id {
				lines = append(lines, r)
			}
		}
		if len(lines) != 1 || lines[0]["level"] != "WARN" || lines[0]["api"] != c.api || lines[0]["status"] != int64(c.status) ||
			lines[0]["reason"] != body.Error.Message {
			t.Fatalf("%s %s (%q): logged %v", c.path, c.body, body.Error.Message, lines)
		}
	}
}
