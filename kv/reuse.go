package kv

import "slices"

// Ever is the set of blocks some engine of the cluster has computed.
type Ever interface{ Has(BlockHash) bool }

// PlacedReuse is what a request's placement knew of its prompt, for its
// lost KV reuse (the research system's metric: prompt tokens computed
// again that some engine had computed before): how many leading blocks
// the chosen node held or was to fetch, and which later blocks some
// engine had computed. Counting once the engine has computed the prompt
// (Lost) leaves out what it found cached after all: a request of the
// same prefix may have computed it meanwhile.
type PlacedReuse struct {
	held int
	ever []int32 // block positions at or after held, in order
	set  bool
}

// NotePlacement records a prompt of chain placed on a node that holds (or
// is to fetch) its first held blocks.
func NotePlacement(chain []BlockHash, held int, ever Ever) PlacedReuse {
	p := PlacedReuse{held: min(max(held, 0), len(chain)), set: true}
	for i := p.held; i < len(chain); i++ {
		if ever.Has(chain[i]) {
			p.ever = append(p.ever, int32(i))
		}
	}
	return p
}

// Noted reports whether a placement was recorded.
func (p PlacedReuse) Noted() bool { return p.set }

// Planned is the lost KV reuse as placed, in tokens of bs-token blocks:
// the blocks past those held that some engine had computed. It is the
// figure for an engine that does not say what it found cached.
func (p PlacedReuse) Planned(bs int) int64 { return int64(len(p.ever) * bs) }

// Lost is the lost KV reuse of the prompt (blocks of its chain,
// promptTokens long) once its engine has prefilled it, finding cached of
// its tokens (whole blocks) and computing computed: the blocks it
// computed that were held at placement (evicted while the request
// waited, a fetch that came too late) or that some engine had computed
// before, and whatever it computed beyond the prompt's uncached part
// (recomputation after a preemption). A prompt of whole blocks computes
// its last block however much is cached: that block is not lost.
func (p PlacedReuse) Lost(blocks, promptTokens, cached, computed, bs int) int64 {
	extra := max(0, computed-(promptTokens-cached))
	from, to := cached/bs, blocks
	if promptTokens%bs == 0 {
		to = blocks - 1
	}
	lost := 0
	if from < to {
		lost += max(0, min(p.held, to)-from)
		i, _ := slices.BinarySearch(p.ever, int32(max(from, p.held)))
		j, _ := slices.BinarySearch(p.ever, int32(to))
		lost += max(0, j-i)
	}
	return int64(lost*bs + extra)
}
