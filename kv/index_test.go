package kv

import (
	"math/rand/v2"
	"testing"
)

// The index behaves as a Go map under a long random mix of operations,
// including hash 0, clusters from keys that share their low bits, growth
// and shrinking.
func TestIndexMatchesMap(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	x := &Index{}
	ref := map[BlockHash]int32{}
	key := func() BlockHash {
		switch r.IntN(4) {
		case 0:
			return BlockHash(r.IntN(3)) // 0, 1, 2: the zero key and near neighbours
		case 1:
			return BlockHash(r.Uint64N(300)+1)<<20 | 7 // same low bits: one long cluster
		}
		return BlockHash(r.Uint64N(5000) * 0x9e3779b97f4a7c15)
	}
	for step := 0; step < 200_000; step++ {
		k := key()
		switch op := r.IntN(10); {
		case op < 4:
			v := int32(r.IntN(1000))
			_, had := ref[k]
			if added := x.Put(k, v); added == had {
				t.Fatalf("step %d: Put(%x) added %v, map had %v", step, uint64(k), added, had)
			}
			ref[k] = v
		case op < 6:
			v := int32(r.IntN(1000))
			got, added := x.PutNew(k, v)
			want, had := ref[k]
			if !had {
				ref[k], want = v, v
			}
			if added == had || *got != want {
				t.Fatalf("step %d: PutNew(%x) = %d,%v; want %d,%v", step, uint64(k), *got, added, want, !had)
			}
		case op < 9:
			_, had := ref[k]
			if x.Delete(k) != had {
				t.Fatalf("step %d: Delete(%x) disagrees", step, uint64(k))
			}
			delete(ref, k)
		default:
			got, ok := x.Get(k)
			want, had := ref[k]
			if ok != had || got != want {
				t.Fatalf("step %d: Get(%x) = %d,%v; want %d,%v", step, uint64(k), got, ok, want, had)
			}
		}
		if x.Len() != len(ref) {
			t.Fatalf("step %d: Len %d, map %d", step, x.Len(), len(ref))
		}
	}
	n := 0
	x.Range(func(h BlockHash, v int32) bool {
		if ref[h] != v {
			t.Fatalf("Range gives %x=%d, map %d", uint64(h), v, ref[h])
		}
		n++
		return true
	})
	if n != len(ref) {
		t.Fatalf("Range visited %d of %d", n, len(ref))
	}
}

func benchKeys(n int) []BlockHash {
	r := rand.New(rand.NewPCG(3, 4))
	keys := make([]BlockHash, n)
	for i := range keys {
		keys[i] = BlockHash(r.Uint64())
	}
	return keys
}

// BenchmarkIndexChurn and BenchmarkGoMapChurn: a cache of 500K blocks where
// each operation looks up a new hash, inserts it and evicts an old one.
func BenchmarkIndexChurn(b *testing.B) {
	keys := benchKeys(1 << 21)
	x := NewIndex(500_000)
	for i := 0; i < 500_000; i++ {
		x.Put(keys[i], int32(i))
	}
	i := 0
	for b.Loop() {
		k := keys[(500_000+i)&(len(keys)-1)]
		x.PutNew(k, 1)
		x.Delete(keys[i&(len(keys)-1)])
		i++
	}
}

func BenchmarkGoMapChurn(b *testing.B) {
	keys := benchKeys(1 << 21)
	m := make(map[BlockHash]int32, 500_000)
	for i := 0; i < 500_000; i++ {
		m[keys[i]] = int32(i)
	}
	i := 0
	for b.Loop() {
		k := keys[(500_000+i)&(len(keys)-1)]
		if _, ok := m[k]; !ok {
			m[k] = 1
		}
		delete(m, keys[i&(len(keys)-1)])
		i++
	}
}

// Prefetch only reads: an empty table answers 0, and a table is unchanged.
func TestPrefetchChangesNothing(t *testing.T) {
	var empty Table[int32]
	if got := empty.Prefetch([]BlockHash{1, 2, 3}); got != 0 {
		t.Fatalf("empty table: Prefetch = %d", got)
	}
	x := NewIndex(4)
	x.Put(7, 70)
	x.Put(9, 90)
	x.Prefetch([]BlockHash{7, 8, 9, 0})
	if v, ok := x.Get(7); !ok || v != 70 || x.Len() != 2 || x.Has(8) {
		t.Fatalf("after Prefetch: Get(7) = %d %v, Len %d, Has(8) %v", v, ok, x.Len(), x.Has(8))
	}
}

// A recent table keeps the last n distinct hashes' values, forgets the
// oldest past 2n, sees deletes in both generations and never grows.
func TestRecentTableRemembersTheLastN(t *testing.T) {
	const n = 3000
	r := NewRecentTable[int8](n)
	for i := 1; i <= n; i++ {
		r.Put(BlockHash(i), int8(i%100))
	}
	if r.old.slots != nil {
		t.Fatal("the older generation was allocated before the newer filled")
	}
	r.Put(n+1, 1)
	slots := len(r.cur.slots) + len(r.old.slots)
	for i := 1; i <= 10*n; i++ {
		r.Put(BlockHash(i), int8(i%100))
		if r.Len() > 2*n {
			t.Fatalf("after %d puts it holds %d, over 2n", i, r.Len())
		}
	}
	last := BlockHash(10 * n)
	for h := last - n + 1; h <= last; h++ {
		if v, ok := r.Get(h); !ok || v != int8(h%100) {
			t.Fatalf("hash %d: %d, %v; want %d", h, v, ok, h%100)
		}
	}
	if _, ok := r.Get(1); ok {
		t.Fatal("remembers the first hash put")
	}
	old := last - n + 1 // the oldest of the last n: in the older generation
	if _, ok := r.old.Get(old); !ok {
		t.Fatalf("%d is not in the older generation", old)
	}
	r.Put(old, 7) // moves to the newer generation with its new value
	if v, _ := r.Get(old); v != 7 {
		t.Fatalf("value %d after a put of 7", v)
	}
	r.Delete(old)
	r.Delete(last)
	if _, ok := r.Get(old); ok {
		t.Fatal("a deleted hash is still there")
	}
	if _, ok := r.Get(last); ok {
		t.Fatal("a deleted hash is still there")
	}
	if got := len(r.cur.slots) + len(r.old.slots); got != slots {
		t.Fatalf("slots grew from %d to %d", slots, got)
	}
}
