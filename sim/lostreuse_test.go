package sim

import (
	"testing"
	"time"

	enginesim "github.com/evolvellm/evolve/engine/sim"
	"github.com/evolvellm/evolve/kv"
	"github.com/evolvellm/evolve/orchestrator/routing"
	"github.com/evolvellm/evolve/workload"
)

// Lost KV reuse counts what a placement leaves to recompute of blocks the
// cluster had computed, and then what the engine recomputed beyond that
// plan: blocks the placement counted on that were evicted while the
// request waited.
func TestLostReuseCountsRecomputeBeyondThePlan(t *testing.T) {
	const bs = 16
	p := &enginesim.Profile{BlockSize: bs}
	r := &run{sc: Scenario{Profile: p}, engines: []*engine{{dir: 3}}, ever: &kv.Set{}, res: Result{Timeline: []Window{{}}}}
	tokens := make([]uint32, 10*bs+5) // 10 whole blocks and 5 tokens
	for i := range tokens {
		tokens[i] = uint32(i)
	}
	chain := kv.ChainHashes(tokens, bs)
	for _, h := range chain[:9] { // the cluster computed 9 blocks before
		r.ever.Add(h)
	}
	// Placed on a node holding 4 blocks, with a fetch bringing blocks 4..6.
	req := &request{call: workload.Call{Tokens: tokens}, chain: chain, scored: true,
		dec: routing.Decision{Fetches: []routing.Fetch{{From: 4, End: 7}}}}
	m := kv.Match{Nodes: []kv.NodeMatch{{Node: 3, GPU: 4, Local: 4}}}
	r.countLostReuse(req, &m, true)
	if got, want := r.res.LostKVReuse, int64(2*bs); got != want { // blocks 7 and 8
		t.Fatalf("lost at placement %d tokens, want %d", got, want)
	}
	if want := 3*bs + 5; req.planned != want {
		t.Fatalf("planned %d tokens to compute, want %d", req.planned, want)
	}
	// The engine computed as planned: nothing more is lost; it computed
	// two blocks more (evicted while it waited): they are.
	if n := lostOnTheWay(req, req.planned); n != 0 {
		t.Fatalf("computing the plan lost %d tokens", n)
	}
	if n := lostOnTheWay(req, req.planned+2*bs); n != 2*bs {
		t.Fatalf("computing 2 blocks beyond the plan lost %d tokens, want %d", n, 2*bs)
	}
	// A retried placement renews the plan without counting twice.
	m = kv.Match{Nodes: []kv.NodeMatch{{Node: 3, GPU: 10, Local: 10}}}
	req.dec.Fetches = nil
	r.countLostReuse(req, &m, false)
	if r.res.LostKVReuse != int64(2*bs) || req.planned != 5 {
		t.Fatalf("retry: lost %d, planned %d; want %d and 5", r.res.LostKVReuse, req.planned, 2*bs)
	}
	// A prompt of whole blocks, all cached, still computes its last block.
	whole := &request{call: workload.Call{Tokens: tokens[:10*bs]}, chain: chain[:10]}
	r.countLostReuse(whole, &m, false)
	if whole.planned != bs {
		t.Fatalf("a fully cached prompt plans %d tokens, want %d (its last block)", whole.planned, bs)
	}
}

// The split a result reports is the one its scored windows served, or
// where a planner took it from and to.
func TestScoredSplit(t *testing.T) {
	w := func(min, p, d int) Window {
		return Window{Start: time.Duration(min) * time.Minute, Prefill: p, Decode: d}
	}
	for _, c := range []struct {
		tl   []Window
		want string
	}{
		{[]Window{w(0, 3, 6), w(1, 2, 7), w(2, 2, 7)}, "2:7"}, // moved in the warm-up only
		{[]Window{w(0, 3, 6), w(1, 3, 6), w(2, 4, 5), w(3, 2, 7)}, "3:6 -> 2:7"},
		{[]Window{w(0, 3, 6), w(1, 8, 1), w(2, 7, 1), w(3, 8, 1)}, "8:1, varied"},
		{[]Window{w(0, 3, 6)}, "1:8"}, // nothing scored
	} {
		if got := scoredSplit(c.tl, time.Minute, "1:8"); got != c.want {
			t.Errorf("%v: %q, want %q", c.tl, got, c.want)
		}
	}
}
