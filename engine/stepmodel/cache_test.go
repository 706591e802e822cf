package stepmodel

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/evolvellm/evolve/kv"
)

// The GPU hit walk tries the previous block's neighbouring ids before the
// index; it must find exactly the copies the index names, through
// evictions, offloads to host (whose copies take neighbouring ids too),
// write-through, and ids freed and reused.
func TestGPUHitsAgreeWithTheIndex(t *testing.T) {
	for _, c := range []Config{{GPUBlocks: 90, HostBlocks: 60}, {GPUBlocks: 120, WriteThrough: true}} {
		t.Run(fmt.Sprintf("gpu%d,host%d,writethrough=%v", c.GPUBlocks, c.HostBlocks, c.WriteThrough), func(t *testing.T) {
			m := NewModel(tinyProfile(t), c)
			arr := mixedArrivals()
			var chains [][]kv.BlockHash
			for _, a := range arr {
				chains = append(chains, kv.ChainHashes(a.r.Tokens, m.bs))
			}
			hits, neighbours := 0, 0
			stepThrough(t, m, arr, nil, func(time.Duration, Output) {
				for _, chain := range chains {
					got := m.gpuHits(chain, nil)
					var want []BlockID
					for _, h := range chain {
						id, ok := m.gpuByHash.Get(h)
						if !ok {
							break
						}
						want = append(want, BlockID(id))
					}
					if !slices.Equal(got, want) {
						t.Fatalf("walk found %v, the index %v", got, want)
					}
					hits += len(got)
					for i := 1; i < len(got); i++ {
						if d := got[i] - got[i-1]; d == 1 || d == -1 {
							neighbours++
						}
					}
				}
			})
			if neighbours == 0 || neighbours == hits {
				t.Fatalf("%d hits, %d of them beside the previous block: the walk's two ways are not both tested", hits, neighbours)
			}
		})
	}
}

// A host copy of the next block lying beside the previous block's GPU copy
// is not a GPU hit: the walk goes to the index for the GPU copy.
func TestGPUHitsSkipAHostCopyBeside(t *testing.T) {
	m := NewModel(tinyProfile(t), Config{GPUBlocks: 16, HostBlocks: 16})
	chain := []kv.BlockHash{11, 22, 33}
	put := func(h kv.BlockHash, tier kv.Tier) BlockID {
		id := m.blocks.alloc()
		b := m.blocks.Get(id)
		b.Hash, b.Hashed, b.Tier = h, true, tier
		if tier == kv.TierGPU {
			m.gpuByHash.Put(h, int32(id))
		} else {
			m.hostByHash.Put(h, int32(id))
		}
		return id
	}
	a := put(11, kv.TierGPU)
	put(22, kv.TierHost) // a's neighbour
	m.blocks.alloc()     // a private block between
	b := put(22, kv.TierGPU)
	c := put(33, kv.TierGPU)
	if got, want := m.gpuHits(chain, nil), []BlockID{a, b, c}; !slices.Equal(got, want) {
		t.Fatalf("walk found %v, want %v", got, want)
	}
}
