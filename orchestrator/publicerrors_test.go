package orchestrator

import (
	"fmt"
	"log/slog"
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
		for _, m := range []string{"request failed on every engine tried", "request failed: no engine left to try"} {
			if r := rec.find(m, "request", id); r != nil && strings.Contains(fmt.Sprint(r["err"]), "127.0.0.1") {
				return true
			}
		}
		return false
	})
}
