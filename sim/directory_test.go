package sim

import (
	"testing"
	"time"

	"github.com/evolvellm/evolve/engine/stepmodel"
	"github.com/evolvellm/evolve/kv"
)

// The directory the router decides by holds, for every prompt in flight,
// what each serving engine holds of it, on GPU and on GPU or host, in
// evolve's policies and in Dynamo's. A worker Dynamo's planner removes and
// later adds again is a new process: the directory forgets the old one's
// KV and learns the new one's from its first event. (It once took the new
// process's events, numbered from 1 again, for the old one's already
// applied, and Dynamo's router routed blind to what the worker cached.)
func TestDirectoryHoldsWhatTheEnginesHold(t *testing.T) {
	p, err := stepmodel.BuiltinProfile("gb300-glm5")
	if err != nil {
		t.Fatal(err)
	}
	// claude-code-126x36's first ten minutes, in 128-token blocks: the
	// planner adds a prefill worker back at about 9 minutes and routes to
	// it (found by a run whose lost KV reuse exceeded its recomputation).
	if p, err = p.WithBlockSize(128); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"dynamo", "evolve"} {
		sc := Scenario{Profile: p, Engines: 9, Workload: "coding", Agents: 126, Warmup: 8 * time.Minute, Duration: 2 * time.Minute, Seed: 1}
		if name == "evolve" {
			sc.Warmup, sc.Duration = 0, 3*time.Minute // nothing to wait for
		}
		pol, _ := ParsePolicy(name, 9)
		wasOff := map[int]bool{}
		checked, readded, mismatched := 0, 0, 0
		var m kv.Match
		var last time.Time
		res, err := runWith(sc, pol, runHooks{inspect: func(r *run) {
			if r.now.Sub(last) < 15*time.Second {
				return
			}
			last = r.now
			for i, e := range r.engines {
				if e.state == engOff {
					wasOff[i] = true
				}
				if e.state != engActive {
					continue
				}
				for _, req := range r.reqs {
					gpu, local := e.model.Lookup(req.chain)
					r.dir.Match(req.chain, &m)
					checked++
					if wasOff[i] && gpu > 0 {
						readded++
					}
					if got := m.For(e.dir); got.GPU != gpu || got.Local != local {
						mismatched++
						if mismatched <= 3 {
							t.Errorf("%s at %v: engine %s (added again: %v) holds %d blocks of %s's prompt on GPU, %d on GPU or host; the directory says %d and %d",
								name, r.now.Sub(r.start), e.id, wasOff[i], gpu, req.id, local, got.GPU, got.Local)
						}
					}
				}
			}
		}})
		if err != nil {
			t.Fatal(err)
		}
		if name == "dynamo" && readded == 0 {
			t.Fatalf("no worker was removed and added again, and then held a prompt (off at some point: %v): the scenario tests nothing", wasOff)
		}
		if checked == 0 || mismatched > 0 {
			t.Fatalf("%s: %d of %d checks disagreed", name, mismatched, checked)
		}
		// Lost reuse is recomputation: it cannot exceed what was computed.
		if res.LostKVReuse > res.ComputedTokens {
			t.Fatalf("%s: %d tokens of lost KV reuse, %d computed", name, res.LostKVReuse, res.ComputedTokens)
		}
	}
}
