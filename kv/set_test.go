package kv

import (
	"fmt"
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
				t.Run(fmt.Sprint(k), func(t *testing.T) {
					if !s.Has(k) {
						t.Fatalf("lost %x", k)
					}
				})
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

// A recent set remembers at least its last n distinct hashes, never more
// than 2n, keeps a hash that is added again, and never grows its slots.
func TestRecentSetRemembersTheLastN(t *testing.T) {
	const n = 5000
	r := NewRecentSet(n)
	if r.Has(1) || r.Len() != 0 || r.cur.slots != nil {
		t.Fatal("a new recent set is not empty, or allocated before its first add")
	}
	r.Add(1)
	r.Add(n + 1) // with 1: not enough to fill a generation
	if r.old.slots != nil {
		t.Fatal("the older generation was allocated before the newer filled")
	}
	for i := 1; i <= n; i++ {
		r.Add(BlockHash(i))
	}
	slots := len(r.cur.slots) + len(r.old.slots)
	keep := BlockHash(1 << 40) // added again every 1,000 hashes
	for i := 1; i <= 20*n; i++ {
		r.Add(BlockHash(i))
		if i%1000 == 0 {
			r.Add(keep)
		}
		if r.Len() > 2*n {
			t.Fatalf("after %d adds it holds %d, over 2n", i, r.Len())
		}
	}
	last := BlockHash(20 * n)
	for h := last - n + 1; h <= last; h++ {
		if !r.Has(h) {
			t.Fatalf("forgot %d, among the last %d added", h, n)
		}
	}
	if r.Has(1) || r.Has(last-2*n-1) {
		t.Fatal("remembers hashes older than 2n")
	}
	if !r.Has(keep) {
		t.Fatal("forgot a hash that kept being added")
	}
	if got := len(r.cur.slots) + len(r.old.slots); got != slots {
		t.Fatalf("slots grew from %d to %d", slots, got)
	}
	r.Add(0)
	if !r.Has(0) {
		t.Fatal("hash 0 not remembered")
	}
}
