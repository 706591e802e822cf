package main

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/evolvellm/evolve/internal/wait"
)

// Role overrides whose JetStream data is damaged (a block truncated, or
// overwritten with garbage) are not lost silently: the orchestrator says
// at warn which it lost, naming each, and writes them back from its copy
// in the data directory, so the pins hold.
func TestDamagedRoleDataIsSaidAndRestored(t *testing.T) {
	for _, damage := range []struct {
		name string
		do   func(path string) error
	}{
		{"truncated", func(p string) error { return os.Truncate(p, 40) }},
		{"garbage", func(p string) error {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			for i := range b {
				b[i] = byte(i*131 + 7)
			}
			return os.WriteFile(p, b, 0o600)
		}},
	} {
		t.Run(damage.name, func(t *testing.T) {
			do := orchestratorOn(t, filepath.Join(t.TempDir(), "data"))
			orch := do.start()
			for _, id := range []string{"e0", "e1", "e2"} {
				startEngine(t, "--id", id, "--nats", do.natsURL)
			}
			nodes := func() string {
				out, _ := runBinOut(t, nil, "nodes", "--server", do.server)
				return out
			}
			wait.Until(t, 20*time.Second, "three engines serving", func() bool { return strings.Count(nodes(), "serving") == 3 })
			for id, role := range map[string]string{"e0": "decode", "e1": "prefill"} {
				if out, code := runBinOut(t, nil, "role", "set", id, role, "--pin", "--server", do.server); code != 0 {
					t.Fatalf("pin %s: %d %s", id, code, out)
				}
			}
			orch.Process.Signal(syscall.SIGTERM)
			orch.Wait()
			blocks, _ := filepath.Glob(filepath.Join(do.data, "jetstream", "*", "streams", "KV_evolve_roles", "msgs", "*.blk"))
			if len(blocks) == 0 {
				t.Fatal("no block of the roles bucket")
			}
			for _, b := range blocks {
				if err := damage.do(b); err != nil {
					t.Fatal(err)
				}
			}
			do.start()
			wait.Until(t, 30*time.Second, "the pins back", func() bool {
				out := nodes()
				return strings.Count(out, "pinned") == 2 && strings.Count(out, "serving") == 3
			})
			log := do.lastLog()
			if !strings.Contains(log, "had lost role overrides") || !strings.Contains(log, "e0 decode (pinned)") || !strings.Contains(log, "e1 prefill (pinned)") {
				t.Fatalf("the restarted orchestrator does not name what was lost:\n%s", log)
			}
		})
	}
}
