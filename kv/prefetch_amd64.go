package kv

import "unsafe"

// prefetchSlots asks the processor to fetch, for each hash in hs, the
// cache line of slot hash&mask of the array at base whose slots are size
// bytes. Unlike a load, a prefetch does not hold up the instructions after
// it: the walk that follows runs while the lines arrive.
//
//go:noescape
func prefetchSlots(base, mask, size uintptr, hs []BlockHash)

func (x *Table[V]) prefetch(hs []BlockHash) BlockHash {
	prefetchSlots(uintptr(unsafe.Pointer(&x.slots[0])), uintptr(x.mask), unsafe.Sizeof(x.slots[0]), hs)
	return 0
}

//go:noescape
func prefetchAddr(p uintptr)

// PrefetchLine asks the processor to fetch the cache line holding *p, for
// a walk that will read it soon; it returns at once.
func PrefetchLine[T any](p *T) { prefetchAddr(uintptr(unsafe.Pointer(p))) }
