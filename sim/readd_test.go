package sim

import (
	"testing"
	"time"

	enginesim "github.com/evolvellm/evolve/engine/sim"
	"github.com/evolvellm/evolve/kv"
)

// A worker Dynamo's planner removes and later adds again is a new
// process: the directory forgets the old one's KV, and learns the new
// one's from its first event, so that the router sees what the worker
// holds. (The directory once took the new process's events, numbered from
// 1 again, for the old one's already applied, and routed blind to it.)
func TestReaddedWorkerIsSeenByTheDirectory(t *testing.T) {
	p, err := enginesim.LoadProfile("gb300-glm5")
	if err != nil {
		t.Fatal(err)
	}
	// claude-code-126x36's first quarter hour, in 128-token blocks: the
	// planner adds a prefill worker back at about 9 minutes and routes to
	// it (found by a run whose lost KV reuse exceeded its recomputation).
	if p, err = p.WithBlockSize(128); err != nil {
		t.Fatal(err)
	}
	sc := Scenario{Profile: p, Engines: 9, Workload: "coding", Agents: 126, Warmup: 10 * time.Minute, Duration: 5 * time.Minute, Seed: 1}
	dyn, _ := ParsePolicy("dynamo", 9)
	wasOff := map[int]bool{}
	checked, mismatched := 0, 0
	var m kv.Match
	var last time.Time
	_, err = runWith(sc, dyn, runHooks{inspect: func(r *run) {
		if r.now.Sub(last) < 5*time.Second {
			return
		}
		last = r.now
		for i, e := range r.engines {
			if e.state == engOff {
				wasOff[i] = true
			}
			if e.state != engActive || !wasOff[i] {
				continue
			}
			for _, req := range r.reqs {
				gpu, _ := e.model.Lookup(req.chain)
				if gpu == 0 {
					continue
				}
				r.dir.Match(req.chain, &m)
				checked++
				if got := m.For(e.dir).GPU; got != gpu {
					mismatched++
					if mismatched <= 3 {
						t.Errorf("at %v engine %s, added again, holds %d blocks of %s's prompt on GPU; the directory says %d",
							r.now.Sub(r.start), e.id, gpu, req.id, got)
					}
				}
			}
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	if checked == 0 {
		t.Fatalf("no worker was removed and added again, and then held a prompt (off at some minute: %v): the scenario tests nothing", wasOff)
	}
	if mismatched > 0 {
		t.Fatalf("%d of %d checks disagreed", mismatched, checked)
	}
}
