package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/evolvellm/evolve/internal/wait"
	"github.com/spf13/cobra"
)

// On an idle cluster nodes --watch -o json prints each node once: a
// heartbeat moves only last_seen, which is no change; a switch is.
func TestNodesWatchJSONPrintsChangesOnly(t *testing.T) {
	c := upCluster(t, "--engines", "2", "--prefill", "1", "--profile", "tiny")
	_, out := startBin(t, c.env, "nodes", "-w", "-o", "json")
	lines := func() []string { return strings.Split(strings.TrimSpace(out.String()), "\n") }
	wait.Until(t, 10*time.Second, "the first lines", func() bool { return len(lines()) >= 2 })
	time.Sleep(3500 * time.Millisecond) // three heartbeats of each engine
	if got := lines(); len(got) != 2 {
		t.Fatalf("an idle cluster printed %d lines in 3.5 s, want one per node:\n%s", len(got), out.String())
	}
	if code := func() int { _, code := runBinOut(t, c.env, "role", "set", "engine-1", "prefill"); return code }(); code != 0 {
		t.Fatal("role set failed")
	}
	wait.Until(t, 10*time.Second, "the switch's lines", func() bool {
		for _, l := range lines() {
			var n struct{ ID, Role, State string }
			if json.Unmarshal([]byte(l), &n) != nil {
				t.Fatalf("not a JSON object per line: %q", l)
			}
			if n.ID == "engine-1" && n.Role == "prefill" && n.State == "serving" {
				return true
			}
		}
		return false
	})
}

// JSON output writes what it holds as it is: "a -> b", not "a -\u003e b".
func TestJSONOutputDoesNotEscapeHTML(t *testing.T) {
	cmd := &cobra.Command{Use: "evolve"}
	sub := &cobra.Command{Use: "planner"}
	cmd.AddCommand(sub)
	addOutputFlag(sub, "json")
	config.Set("planner.output", "json")
	defer config.Set("planner.output", nil)
	var b strings.Builder
	sub.SetOut(&b)
	if err := output(sub, map[string]string{"reason": "1:3 -> 2:2 <held> & acted"}, nil); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), `"1:3 -> 2:2 <held> & acted"`) {
		t.Fatalf("json output: %s", b.String())
	}
}
