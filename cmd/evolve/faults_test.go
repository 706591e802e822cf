package main

import (
	"strings"
	"syscall"
	"testing"
	"time"
)

// An engine stopped by SIGSTOP for longer than the heartbeat limit is
// marked down; continued, it serves again within seconds, and a request
// reaches it. Before, it stayed down for good while its heartbeats
// arrived.
func TestStoppedEngineServesAgainWhenContinued(t *testing.T) {
	c := upCluster(t, "--engines", "2", "--speedup", "10")
	pid := c.state.Engines[0]
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	continued := false
	t.Cleanup(func() {
		if !continued {
			syscall.Kill(pid, syscall.SIGCONT)
		}
	})
	eventually(t, 15*time.Second, "engine-0 marked down while stopped", func() bool {
		return c.node("engine-0")["state"] == "down"
	})
	time.Sleep(2 * time.Second)
	syscall.Kill(pid, syscall.SIGCONT)
	continued = true
	eventually(t, 10*time.Second, "engine-0 serving again after SIGCONT", func() bool {
		return c.node("engine-0")["state"] == "serving"
	})
	// It takes requests again (as prefill or decode node, whichever its
	// role is).
	served := map[string]bool{}
	for i := 0; i < 20 && !served["engine-0"]; i++ {
		code, hdr, body := post(t, c.state.RouterURL+"/v1/completions", map[string]any{"prompt": strings.Repeat("after the stop, a long prompt to prefill ", 40+i), "max_tokens": 2})
		if code != 200 {
			t.Fatalf("request %d after SIGCONT: %d %v", i, code, body)
		}
		served[hdr.Get("X-Evolve-Decode-Node")] = true
		served[hdr.Get("X-Evolve-Prefill-Node")] = true
	}
	if !served["engine-0"] {
		t.Fatalf("20 requests after SIGCONT, none served by engine-0: %v", served)
	}
}
