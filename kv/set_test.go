package kv

import (
	"math/rand/v2"
	"testing"
)

// The set agrees with a map under adds of new, repeated and zero hashes,
// across many growths.
func TestSetMatchesAMap(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	var s Set
	ref := map[BlockHash]bool{}
	for i := 0; i < 200000; i++ {
		h := BlockHash(r.Uint64N(150000)) // repeats, and 0 sometimes
		if i%7 == 0 {
			h = BlockHash(r.Uint64()) // spread over the whole key space
		}
		if added := s.Add(h); added == ref[h] {
			t.Fatalf("add %x: added %v, already in %v", h, added, ref[h])
		}
		ref[h] = true
		if i%9973 == 0 {
			for k := range ref {
				if !s.Has(k) {
					t.Fatalf("lost %x", k)
				}
			}
			if s.Len() != len(ref) || s.Has(BlockHash(1<<63+uint64(i))) != ref[BlockHash(1<<63+uint64(i))] {
				t.Fatalf("len %d, map %d", s.Len(), len(ref))
			}
		}
	}
	var empty Set
	if empty.Has(0) || empty.Has(5) || empty.Len() != 0 {
		t.Fatal("the zero Set is not empty")
	}
}
