package kv

import "testing"

// Lost KV reuse counts the tokens an engine computed of blocks the
// cluster had computed before the request was placed: what the node held
// or fetched and still computed, and later blocks computed elsewhere; not
// what the engine found cached after all, nor the last block a prompt of
// whole blocks computes however much is cached.
func TestLostReuseCountsWhatTheEngineRecomputed(t *testing.T) {
	const bs = 16
	tokens := make([]uint32, 10*bs+5) // 10 whole blocks and 5 tokens
	for i := range tokens {
		tokens[i] = uint32(i)
	}
	chain := ChainHashes(tokens, bs)
	ever := &Set{}
	for _, h := range chain[:9] { // the cluster computed 9 blocks before
		ever.Add(h)
	}
	// Placed on a node that holds or fetches 7 blocks.
	p := NotePlacement(chain, 7, ever)
	if !p.Noted() || p.Planned(bs) != 2*bs {
		t.Fatalf("as placed: %d tokens, want %d (blocks 7 and 8)", p.Planned(bs), 2*bs)
	}
	for _, c := range []struct {
		what       string
		hit, extra int // blocks found cached; tokens recomputed after a preemption
		want       int // tokens lost
	}{
		{"as placed: blocks 7 and 8 were computed before", 7, 0, 2 * bs},
		{"two blocks evicted while it waited, and 7 and 8", 5, 0, 4 * bs},
		{"7 and 8 found cached after all (a request of the same prefix computed them meanwhile)", 9, 0, 0},
		{"nothing cached: the 9 blocks computed before", 0, 0, 9 * bs},
		{"a preemption recomputed 40 tokens", 7, 40, 2*bs + 40},
	} {
		t.Run(c.what, func(t *testing.T) {
			hit := c.hit * bs
			if got := p.Lost(len(chain), len(tokens), hit, len(tokens)-hit+c.extra, bs); got != int64(c.want) {
				t.Errorf("%s: lost %d tokens, want %d", c.what, got, c.want)
			}
		})
	}
	// A prompt of whole blocks computes its last block, cached or not.
	ever.Add(chain[9])
	whole := NotePlacement(chain[:10], 10, ever)
	if got := whole.Lost(10, 10*bs, 9*bs, bs, bs); got != 0 {
		t.Fatalf("a fully cached prompt lost %d tokens, want 0", got)
	}
	if got := whole.Lost(10, 10*bs, 8*bs, 2*bs, bs); got != bs {
		t.Fatalf("a whole-block prompt whose last two blocks were evicted lost %d tokens, want %d (the last is computed anyway)", got, bs)
	}
	if (PlacedReuse{}).Noted() {
		t.Fatal("an empty record says it was noted")
	}
}
