package orchestrator

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/evolvellm/evolve/internal/wait"
	"github.com/evolvellm/evolve/roles"
)

// routerMetric reads one unlabelled metric from the router's /metrics.
func routerMetric(t *testing.T, tc *testCluster, name string) string {
	t.Helper()
	resp, err := http.Get(tc.o.RouterURL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return v
		}
	}
	t.Fatalf("no %s in /metrics", name)
	return ""
}

// bigPrompt is a completion request of about n bytes.
func bigPrompt(n int) string {
	b, _ := json.Marshal(map[string]any{"prompt": strings.Repeat("lorem ipsum dolor sit amet, ", n/28), "max_tokens": 4})
	return string(b)
}

// Large bodies wait for room in the router's budget for them, and a small
// one does not wait behind them; a client that leaves while its body
// waits gives its place up. Before, every one of eight 31 MB prompts was
// read, parsed and tokenized at once, and the orchestrator, short of CPU,
// lost its engines' heartbeats.
func TestLargeBodiesWaitForRoom(t *testing.T) {
	tc := startTestClusterWith(t, Config{Limits: HTTPLimits{LargeBodyBudget: 4 << 20}}, nil, roles.Decode)
	wait.Until(t, 10*time.Second, "the engine serving", func() bool { return tc.o.servingNodes() == 1 })
	// Another large request holds the whole budget.
	if err := tc.o.bodies.sem.Acquire(context.Background(), 4<<20); err != nil {
		t.Fatal(err)
	}
	answered := make(chan int, 1)
	go func() {
		code, _ := postJSON(t, tc.o.RouterURL()+"/v1/completions", bigPrompt(2<<20))
		answered <- code
	}()
	wait.Until(t, 10*time.Second, "the large request waiting", func() bool { return routerMetric(t, tc, "evolve_router_large_body_waits_total") == "1" })
	if code, body := postJSON(t, tc.o.RouterURL()+"/v1/completions", `{"prompt": "a usual turn", "max_tokens": 2}`); code != 200 {
		t.Fatalf("a small request while the budget is full: %d %v", code, body)
	}
	select {
	case code := <-answered:
		t.Fatalf("a large request was served while the budget was full: %d", code)
	case <-time.After(200 * time.Millisecond):
	}

	// A client that gives up while waiting.
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", tc.o.RouterURL()+"/v1/completions", strings.NewReader(bigPrompt(2<<20)))
	gone := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		gone <- err
	}()
	wait.Until(t, 10*time.Second, "the second large request waiting", func() bool { return routerMetric(t, tc, "evolve_router_large_body_waits_total") == "2" })
	cancel()
	<-gone

	tc.o.bodies.sem.Release(4 << 20)
	select {
	case code := <-answered:
		if code != 400 { // longer than the engine's context
			t.Fatalf("the large request, once there was room: %d", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the large request still waits with the budget free")
	}
	wait.Until(t, 10*time.Second, "the budget free again", func() bool { return tc.o.bodies.sem.TryAcquire(4 << 20) })
	if v := routerMetric(t, tc, "evolve_router_large_body_bytes"); v != "0" {
		t.Fatalf("large-body bytes in work after every request: %s", v)
	}
}

// The router gives back the memory a huge request took, once it is
// answered: it kept it before (an idle router seldom collects), 235 MB of
// it after one 31 MB prompt.
func TestHugeRequestGivesItsMemoryBack(t *testing.T) {
	tc := startTestClusterWith(t, Config{}, nil, roles.Decode)
	wait.Until(t, 10*time.Second, "the engine serving", func() bool { return tc.o.servingNodes() == 1 })
	if code, _ := postJSON(t, tc.o.RouterURL()+"/v1/completions", bigPrompt(16<<20)); code != 400 {
		t.Fatalf("a 16 MB prompt: %d", code)
	}
	wait.Until(t, 10*time.Second, "the memory given back", func() bool { return routerMetric(t, tc, "evolve_router_memory_returns_total") == "1" })
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	if kept := ms.HeapIdle - ms.HeapReleased; kept > 16<<20 {
		t.Fatalf("the process keeps %d MB of free heap from the system", kept>>20)
	}
}
