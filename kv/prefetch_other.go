//go:build !amd64

package kv

// prefetch reads the slot where each hash in hs starts its probe: plain
// loads, which the processor keeps in flight several at a time.
func (x *Table[V]) prefetch(hs []BlockHash) BlockHash {
	var sink BlockHash
	for _, h := range hs {
		sink ^= x.slots[uint64(h)&x.mask].key
	}
	return sink
}

// PrefetchLine would fetch the cache line holding *p; on this
// architecture it does nothing.
func PrefetchLine[T any](p *T) {}
