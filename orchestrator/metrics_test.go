package orchestrator

import (
	"bufio"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/evolvellm/evolve/internal/wait"
	"github.com/evolvellm/evolve/roles"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// A client that closes its stream as soon as it reads [DONE] (as many
// SDKs do) got its whole answer: counted ok, never client_gone.
func TestStreamClosedAfterDoneCountsOK(t *testing.T) {
	tc := startTestCluster(t, roles.Decode)
	const n = 40
	for i := 0; i < n; i++ {
		resp, err := http.Post(tc.o.RouterURL()+"/v1/completions", "application/json",
			strings.NewReader(`{"prompt": "a short answer", "max_tokens": 3, "stream": true}`))
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if sc.Text() == "data: [DONE]" {
				break
			}
		}
		resp.Body.Close()
	}
	wait.Until(t, 10*time.Second, "every request counted", func() bool {
		ok := testutil.ToFloat64(tc.o.met.requests.WithLabelValues("evolve", "ok"))
		gone := testutil.ToFloat64(tc.o.met.requests.WithLabelValues("evolve", "client_gone"))
		if gone > 0 {
			t.Fatalf("%v of %d streams read to [DONE] counted client_gone", gone, n)
		}
		return ok == n
	})
}

// The orchestrator's /metrics has the process's own figures, and its
// control API serves Go's profiler (behind its token, when it has one).
func TestOrchestratorExposesProcessMetricsAndProfiles(t *testing.T) {
	tc := startTestCluster(t, roles.Decode)
	resp, err := http.Get(tc.o.RouterURL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, m := range []string{"go_goroutines ", "go_memstats_heap_inuse_bytes ", "process_resident_memory_bytes ", "process_open_fds "} {
		if !strings.Contains(string(b), "\n"+m) {
			t.Errorf("/metrics has no %s", m)
		}
	}
	resp, err = http.Get(tc.o.ControlURL() + "/debug/pprof/goroutine?debug=1")
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), "goroutine profile:") {
		t.Fatalf("pprof on the control API: %d %.200s", resp.StatusCode, b)
	}
}
