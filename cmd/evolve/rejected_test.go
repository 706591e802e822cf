package main

import (
	"strings"
	"testing"
	"time"
)

// An engine the cluster rejects (a mistyped --served-model-name) says so
// in its own log, with why, and exits with status 3 once rejected for
// --exit-when-rejected: before, its log said only "engine ready", and the
// cluster it joined first was locked to its name.
func TestRejectedEngineSaysWhyAndExits(t *testing.T) {
	c := upCluster(t, "--engines", "2")
	e := startEngine(t, "--id", "typo", "--served-model-name", "evolve-tinyy", "--nats", c.state.NATSURL, "--nats-token-file", c.state.NATSTokenFile, "--exit-when-rejected", "2s")
	select {
	case <-e.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("the rejected engine still runs after 30 s:\n%s", e.logText())
	}
	if code := e.cmd.ProcessState.ExitCode(); code != 3 {
		t.Fatalf("exit status %d, want 3:\n%s", code, e.logText())
	}
	log := e.logText()
	for _, want := range []string{"the cluster rejected this engine", "serves evolve-tinyy", "this cluster serves evolve-tiny"} {
		if !strings.Contains(log, want) {
			t.Errorf("the engine's log does not say %q:\n%s", want, log)
		}
	}
	// The cluster serves its two engines' model, which requests name.
	if code, _, body := post(t, c.state.RouterURL+"/v1/completions", map[string]any{"model": "evolve-tiny", "prompt": "hi", "max_tokens": 2}); code != 200 {
		t.Fatalf("a request for the cluster's model: %d %v", code, body)
	}
}
