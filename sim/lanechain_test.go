package sim

import (
	"slices"
	"testing"

	"github.com/evolvellm/evolve/kv"
)

// A lane's chains reuse its recent prompts' hashes and must equal hashing
// each prompt afresh: extended in place, extended into a new array, a
// sub-agent's prompt between two of the main branch's, a rewrite, and a
// prompt shorter than the last.
func TestLaneChainMatchesFreshHashes(t *testing.T) {
	const bs = 4
	words := func(seed uint32, n int) []uint32 {
		out := make([]uint32, n)
		for i := range out {
			out[i] = seed*1000 + uint32(i)
		}
		return out
	}
	system := words(1, 10)
	main := append(make([]uint32, 0, 64), system...)
	main = append(main, words(2, 7)...)
	sub := append(slices.Clip(system), words(3, 9)...)
	var prompts [][]uint32
	prompts = append(prompts, main[:len(main):len(main)])
	main = append(main, words(4, 5)...) // in place
	prompts = append(prompts, main[:len(main):len(main)], sub)
	main = append(main, words(5, 6)...)
	prompts = append(prompts, main[:len(main):len(main)])
	main = append(slices.Clone(main), words(6, 40)...) // a new array
	prompts = append(prompts, main, append(slices.Clone(system), words(7, 3)...), system[:6], main)

	var ls laneState
	for i, p := range prompts {
		if got, want := ls.chain(p, bs), kv.ChainHashes(p, bs); !slices.Equal(got, want) {
			t.Fatalf("prompt %d (%d tokens): chain %x, want %x", i, len(p), got, want)
		}
	}
}
