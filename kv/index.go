package kv

// Table maps block hashes to values of type V with open addressing and
// linear probing. Block hashes are already uniform, so a hash's low bits
// pick its slot directly: a lookup usually touches one cache line, where
// Go's map touches two or three, and a small V lives in the slot itself. It
// grows by doubling and deletes by backward shift, so it never holds
// tombstones. The zero value is an empty table ready to use. Not safe for
// concurrent use.
type Table[V any] struct {
	slots    []tableSlot[V]
	mask     uint64
	n        int
	zero     bool // whether hash 0 is present (0 marks empty slots)
	zeroVal  V
	minSlots int
}

type tableSlot[V any] struct {
	key BlockHash
	val V
}

// Index is a Table of int32 values (slot numbers, ids).
type Index = Table[int32]

// NewIndex returns an index sized to hold n entries without growing.
func NewIndex(n int) *Index { return NewTable[int32](n) }

// NewTable returns a table sized to hold n entries without growing.
func NewTable[V any](n int) *Table[V] {
	x := &Table[V]{}
	x.init(n)
	return x
}

func (x *Table[V]) init(n int) {
	size := 16
	for size < 2*n {
		size <<= 1
	}
	x.slots = make([]tableSlot[V], size)
	AdviseHugePages(x.slots)
	x.mask = uint64(size - 1)
	x.minSlots = size
}

// Len is the number of entries.
func (x *Table[V]) Len() int {
	if x.zero {
		return x.n + 1
	}
	return x.n
}

// Get returns the value of h and whether it is present.
func (x *Table[V]) Get(h BlockHash) (V, bool) {
	if p := x.Ptr(h); p != nil {
		return *p, true
	}
	var zero V
	return zero, false
}

// Ptr returns where h's value is stored, or nil if h is absent. The pointer
// is valid until the next Put, PutNew or Delete.
func (x *Table[V]) Ptr(h BlockHash) *V {
	if h == 0 {
		if !x.zero {
			return nil
		}
		return &x.zeroVal
	}
	if x.slots == nil {
		return nil
	}
	for i := uint64(h) & x.mask; ; i = (i + 1) & x.mask {
		s := &x.slots[i]
		if s.key == h {
			return &s.val
		}
		if s.key == 0 {
			return nil
		}
	}
}

// Prefetch fetches the slot where each hash in hs starts its probe. A walk
// that will look up a run of hashes in turn, each likely a cache miss,
// lets the processor fetch their cache lines in parallel this way rather
// than one after the other. On amd64 it issues prefetch instructions and
// returns at once; elsewhere it reads the slots, and the result only keeps
// those reads alive.
func (x *Table[V]) Prefetch(hs []BlockHash) BlockHash {
	if x.slots == nil || len(hs) == 0 {
		return 0
	}
	return x.prefetch(hs)
}

// PrefetchOne reads the slot where h starts its probe, as Prefetch does
// for a run of hashes, for callers whose hashes are not in one slice.
func (x *Table[V]) PrefetchOne(h BlockHash) BlockHash {
	if x.slots == nil {
		return 0
	}
	return x.slots[uint64(h)&x.mask].key
}

// Has reports whether h is present.
func (x *Table[V]) Has(h BlockHash) bool { return x.Ptr(h) != nil }

// Put sets h's value, or adds h. It reports whether h was added.
func (x *Table[V]) Put(h BlockHash, v V) bool {
	p, added := x.PutNew(h, v)
	if !added {
		*p = v
	}
	return added
}

// PutNew adds h with value v unless h is present; it returns where h's
// value is stored afterwards (valid until the next change) and whether h was
// added. One probe sequence does both.
func (x *Table[V]) PutNew(h BlockHash, v V) (*V, bool) {
	if h == 0 {
		if x.zero {
			return &x.zeroVal, false
		}
		x.zero, x.zeroVal = true, v
		return &x.zeroVal, true
	}
	if x.slots == nil {
		x.init(8)
	}
	if 2*(x.n+1) > len(x.slots) {
		x.resize(2 * len(x.slots))
	}
	for i := uint64(h) & x.mask; ; i = (i + 1) & x.mask {
		s := &x.slots[i]
		if s.key == h {
			return &s.val, false
		}
		if s.key == 0 {
			s.key, s.val = h, v
			x.n++
			return &s.val, true
		}
	}
}

// Delete removes h and reports whether it was present.
func (x *Table[V]) Delete(h BlockHash) bool {
	if h == 0 {
		was := x.zero
		var zero V
		x.zero, x.zeroVal = false, zero
		return was
	}
	if x.slots == nil {
		return false
	}
	i := uint64(h) & x.mask
	for {
		s := &x.slots[i]
		if s.key == 0 {
			return false
		}
		if s.key == h {
			break
		}
		i = (i + 1) & x.mask
	}
	// Backward-shift: move later entries of the cluster into the hole when
	// their home slot does not lie between the hole and them.
	hole := i
	for j := (i + 1) & x.mask; ; j = (j + 1) & x.mask {
		s := x.slots[j]
		if s.key == 0 {
			break
		}
		home := uint64(s.key) & x.mask
		if (j-home)&x.mask >= (j-hole)&x.mask {
			x.slots[hole] = s
			hole = j
		}
	}
	x.slots[hole] = tableSlot[V]{}
	x.n--
	if len(x.slots) > x.minSlots && 8*x.n < len(x.slots) {
		x.resize(len(x.slots) / 2)
	}
	return true
}

// Range calls f for every entry until f returns false. The index must not
// change during the call.
func (x *Table[V]) Range(f func(h BlockHash, v V) bool) {
	if x.zero && !f(0, x.zeroVal) {
		return
	}
	for _, s := range x.slots {
		if s.key != 0 && !f(s.key, s.val) {
			return
		}
	}
}

func (x *Table[V]) resize(size int) {
	old := x.slots
	x.slots = make([]tableSlot[V], size)
	AdviseHugePages(x.slots)
	x.mask = uint64(size - 1)
	for _, s := range old {
		if s.key == 0 {
			continue
		}
		i := uint64(s.key) & x.mask
		for x.slots[i].key != 0 {
			i = (i + 1) & x.mask
		}
		x.slots[i] = s
	}
}

// RecentTable is a Table that remembers the entries put lately in bounded
// memory, as RecentSet does: at least the last n distinct hashes put and
// at most 2n, in two generations, each sized for n when first used. Get
// and Delete see both; Put writes the newer, and emptying a full newer
// generation drops the older. Not safe for concurrent use.
type RecentTable[V any] struct {
	cur, old *Table[V]
	n        int
}

// NewRecentTable returns a table that remembers at least the last n (> 0)
// distinct hashes put.
func NewRecentTable[V any](n int) *RecentTable[V] {
	n = max(n, 1)
	return &RecentTable[V]{cur: &Table[V]{}, old: &Table[V]{}, n: n}
}

// Get returns h's value and whether h is remembered.
func (r *RecentTable[V]) Get(h BlockHash) (V, bool) {
	if v, ok := r.cur.Get(h); ok {
		return v, true
	}
	return r.old.Get(h)
}

// Put sets h's value in the newer generation.
func (r *RecentTable[V]) Put(h BlockHash, v V) {
	if p := r.cur.Ptr(h); p != nil {
		*p = v
		return
	}
	r.old.Delete(h)
	if r.cur.Len() >= r.n {
		r.cur, r.old = r.old, r.cur
		r.cur.clear()
	}
	if r.cur.slots == nil {
		r.cur.init(r.n)
	}
	r.cur.Put(h, v)
}

// Delete forgets h.
func (r *RecentTable[V]) Delete(h BlockHash) {
	r.cur.Delete(h)
	r.old.Delete(h)
}

// Len is how many hashes are remembered.
func (r *RecentTable[V]) Len() int { return r.cur.Len() + r.old.Len() }

// clear empties the table and keeps its slots.
func (x *Table[V]) clear() {
	clear(x.slots)
	var zero V
	x.n, x.zero, x.zeroVal = 0, false, zero
}
