package sim

import (
	"testing"
	"time"

	"github.com/evolvellm/evolve/engine/stepmodel"
	"github.com/evolvellm/evolve/kv"
	"github.com/evolvellm/evolve/orchestrator/routing"
	"github.com/evolvellm/evolve/workload"
)

// A placement counts, for lost KV reuse, what its prefill node holds and
// what the decision fetches; a retried placement keeps the first one's
// view (kv.PlacedReuse counts the rest).
func TestLostReuseFollowsThePlacement(t *testing.T) {
	const bs = 16
	p := &stepmodel.Profile{BlockSize: bs}
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
	r.notePlacement(req, &m, true)
	prefilled := func(hitBlocks int) stepmodel.Usage {
		return stepmodel.Usage{PromptTokens: len(tokens), GPUHitTokens: hitBlocks * bs, ComputedTokens: len(tokens) - hitBlocks*bs}
	}
	if got := r.lostReuse(req, prefilled(7)); got != 2*bs {
		t.Fatalf("computed as placed: lost %d tokens, want %d (blocks 7 and 8)", got, 2*bs)
	}
	if got := r.lostReuse(req, prefilled(4)); got != 5*bs {
		t.Fatalf("the fetch came too late: lost %d tokens, want %d (blocks 4 to 8)", got, 5*bs)
	}
	// A retried placement on a node holding it all keeps the first view.
	m = kv.Match{Nodes: []kv.NodeMatch{{Node: 3, GPU: 10, Local: 10}}}
	req.dec.Fetches = nil
	r.notePlacement(req, &m, false)
	if got := r.lostReuse(req, prefilled(7)); got != 2*bs {
		t.Fatalf("retry: lost %d tokens, want %d", got, 2*bs)
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
		t.Run(c.want, func(t *testing.T) {
			if got := scoredSplit(c.tl, time.Minute, "1:8"); got != c.want {
				t.Errorf("%v: %q, want %q", c.tl, got, c.want)
			}
		})
	}
}
