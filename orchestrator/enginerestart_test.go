package orchestrator

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/evolvellm/evolve/engine/stepmodel"
	"github.com/evolvellm/evolve/internal/wait"
	"github.com/evolvellm/evolve/roles"
)

// An engine that restarts under the same name is a new process whose KV
// events are numbered from 1 again: the directory forgets the old one's
// copies when it stops and learns the new one's (the orchestrator asks a
// newly registered engine to resync, and the directory takes a dropped
// node's events from 1), rather than taking them for duplicates of the
// old process's and routing blind to the engine. What the old process
// computed and the new one computes again is lost KV reuse.
func TestRestartedEngineKVIsSeen(t *testing.T) {
	tc := startTestCluster(t, roles.Decode)
	held := func() (gpu int, seq uint64) {
		tc.o.c.mu.Lock()
		defer tc.o.c.mu.Unlock()
		n := tc.o.c.nodes["e0"]
		gpu, _ = tc.o.c.dir.NodeReplicas(n.dir)
		return gpu, tc.o.c.dir.LastSeq(n.dir)
	}
	prompt := func(tag string, words int) string {
		var b strings.Builder
		for i := 0; i < words; i++ {
			fmt.Fprintf(&b, "%s%d ", tag, i)
		}
		return b.String()
	}
	for i := 0; i < 6; i++ {
		if status, body := postJSON(t, tc.o.RouterURL()+"/v1/completions",
			fmt.Sprintf(`{"prompt": %q, "max_tokens": 2}`, prompt(fmt.Sprint("old", i, "-"), 300))); status != 200 {
			t.Fatalf("request %d: %d %v", i, status, body)
		}
	}
	var before uint64
	wait.Until(t, 10*time.Second, "the first process's KV events applied", func() bool {
		gpu, seq := held()
		before = seq
		return gpu > 0 && seq > 100
	})

	tc.engines[0]()
	wait.Until(t, 10*time.Second, "e0 down", func() bool {
		st, ok := tc.o.NodeStatus("e0")
		return ok && st.State == StateDown
	})
	if gpu, _ := held(); gpu != 0 {
		t.Fatalf("e0 stopped, and the directory still lists %d GPU copies on it", gpu)
	}
	p, _ := stepmodel.BuiltinProfile("tiny")
	tc.addEngine(t, "e0", p, roles.Decode)
	wait.Until(t, 10*time.Second, "e0 serving again", func() bool {
		st, ok := tc.o.NodeStatus("e0")
		return ok && st.State == StateServing
	})
	if status, body := postJSON(t, tc.o.RouterURL()+"/v1/completions", fmt.Sprintf(`{"prompt": %q, "max_tokens": 2}`, prompt("new-", 100))); status != 200 {
		t.Fatalf("request to the new process: %d %v", status, body)
	}
	wait.Until(t, 10*time.Second, "the new process's KV in the directory", func() bool {
		gpu, seq := held()
		return gpu > 0 && seq < before
	})

	// A prompt the old process computed is computed again from scratch:
	// every whole block of it is lost KV reuse.
	lost := tc.o.KV().LostKVReuse
	status, body := postJSON(t, tc.o.RouterURL()+"/v1/completions", fmt.Sprintf(`{"prompt": %q, "max_tokens": 2}`, prompt("old0-", 300)))
	usage, _ := body["usage"].(map[string]any)
	n, _ := usage["prompt_tokens"].(float64)
	if status != 200 || n < 64 {
		t.Fatalf("the old prompt again: %d %v", status, body)
	}
	bs := p.BlockSize
	// Its whole blocks, but for the last of a prompt of whole blocks,
	// which is computed anyway.
	want := int64((int(n) - 1) / bs * bs)
	wait.Until(t, 10*time.Second, "the recomputed prompt counted as lost KV reuse", func() bool { return tc.o.KV().LostKVReuse-lost == want })
}
