package orchestrator

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/evolvellm/evolve/internal/wait"
	"github.com/evolvellm/evolve/protocol"
	"github.com/evolvellm/evolve/roles"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// A prefill node that stops taking prefill legs after the router chose it
// (its switch to decode began; it was the last prefill node) costs no
// request: the decode node serves it whole. Before, such requests failed
// with 503 "a decode engine takes no prefill-only leg".
func TestPrefillLegRefusedForItsRoleIsServedWhole(t *testing.T) {
	tc := startTestClusterWith(t, Config{Policy: "dynamo", PlannerMode: PlannerOff}, nil, roles.Prefill, roles.Decode)
	// The engine switches before the orchestrator hears of it.
	if _, err := tc.o.control("e0", protocol.ControlRequest{Op: protocol.OpSetRole, Role: "decode"}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		status, body := postJSON(t, tc.o.RouterURL()+"/v1/completions",
			fmt.Sprintf(`{"prompt": %q, "max_tokens": 2}`, strings.Repeat(fmt.Sprintf("prompt %d to prefill elsewhere ", i), 60)))
		if status != 200 {
			t.Fatalf("request %d while the last prefill node switches: %d %v", i, status, body)
		}
	}
	// Served where they were routed, with no second routing.
	if n := testutil.ToFloat64(tc.o.met.decisions.WithLabelValues("dynamo", "true")) + testutil.ToFloat64(tc.o.met.decisions.WithLabelValues("dynamo", "false")); n != 3 {
		t.Fatalf("%v routing decisions for 3 requests", n)
	}
}

// Switching the last prefill node to decode under load fails no request.
func TestSwitchingTheLastPrefillNodeFailsNoRequest(t *testing.T) {
	tc := startTestClusterWith(t, Config{PlannerMode: PlannerOff}, nil, roles.Prefill, roles.Decode, roles.Decode)
	stop := make(chan struct{})
	failures := make(chan string, 1000)
	var wg sync.WaitGroup
	var sent atomic.Int64
	for w := 0; w < 12; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				sent.Add(1)
				body := fmt.Sprintf(`{"prompt": %q, "max_tokens": 2}`, strings.Repeat(fmt.Sprintf("worker %d prompt %d ", w, i), 80))
				resp, err := http.Post(tc.o.RouterURL()+"/v1/completions", "application/json", strings.NewReader(body))
				if err != nil {
					failures <- err.Error()
					continue
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					failures <- fmt.Sprintf("%d %s", resp.StatusCode, b)
				}
			}
		}()
	}
	// Each switch happens under load: requests sent before it and after.
	underLoad := func(what string) {
		from := sent.Load()
		wait.Until(t, 10*time.Second, fmt.Sprintf("24 requests sent %s", what), func() bool { return sent.Load() >= from+24 })
	}
	underLoad("before the first switch")
	for _, role := range []string{"decode", "prefill", "decode"} {
		if _, err := tc.o.SetRole("e0", role, false, "operator"); err != nil {
			t.Fatal(err)
		}
		wait.Until(t, 10*time.Second, "e0 "+role, func() bool {
			st, _ := tc.o.NodeStatus("e0")
			return st.Role == role && st.State == StateServing
		})
		underLoad("after the switch to " + role)
	}
	close(stop)
	wg.Wait()
	close(failures)
	for f := range failures {
		t.Errorf("a request failed across the switches (of %d): %s", sent.Load(), f)
	}
}
