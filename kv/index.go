package kv

// Index maps block hashes to int32 values (slot numbers, node ids) with
// open addressing and linear probing. Block hashes are already uniform, so a
// hash's low bits pick its slot directly: a lookup usually touches one cache
// line, where Go's map touches two or three. It grows by doubling and
// deletes by backward shift, so it never holds tombstones. The zero value is
// an empty index ready to use. Not safe for concurrent use.
type Index struct {
	slots    []indexSlot
	mask     uint64
	n        int
	zero     bool // whether hash 0 is present (0 marks empty slots)
	zeroVal  int32
	minSlots int
}

type indexSlot struct {
	key BlockHash
	val int32
}

// NewIndex returns an index sized to hold n entries without growing.
func NewIndex(n int) *Index {
	x := &Index{}
	x.init(n)
	return x
}

func (x *Index) init(n int) {
	size := 16
	for size < 2*n {
		size <<= 1
	}
	x.slots = make([]indexSlot, size)
	x.mask = uint64(size - 1)
	x.minSlots = size
}

// Len is the number of entries.
func (x *Index) Len() int {
	if x.zero {
		return x.n + 1
	}
	return x.n
}

// Get returns the value of h and whether it is present.
func (x *Index) Get(h BlockHash) (int32, bool) {
	if h == 0 {
		if !x.zero {
			return 0, false
		}
		return x.zeroVal, true
	}
	if x.slots == nil {
		return 0, false
	}
	for i := uint64(h) & x.mask; ; i = (i + 1) & x.mask {
		s := &x.slots[i]
		if s.key == h {
			return s.val, true
		}
		if s.key == 0 {
			return 0, false
		}
	}
}

// Has reports whether h is present.
func (x *Index) Has(h BlockHash) bool {
	_, ok := x.Get(h)
	return ok
}

// Put sets h's value, or adds h. It reports whether h was added.
func (x *Index) Put(h BlockHash, v int32) bool {
	if h == 0 {
		added := !x.zero
		x.zero, x.zeroVal = true, v
		return added
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
			s.val = v
			return false
		}
		if s.key == 0 {
			s.key, s.val = h, v
			x.n++
			return true
		}
	}
}

// PutNew adds h with value v unless h is present; it returns the value h
// has afterwards and whether it was added. One probe sequence does both.
func (x *Index) PutNew(h BlockHash, v int32) (int32, bool) {
	if h == 0 {
		if x.zero {
			return x.zeroVal, false
		}
		x.zero, x.zeroVal = true, v
		return v, true
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
			return s.val, false
		}
		if s.key == 0 {
			s.key, s.val = h, v
			x.n++
			return v, true
		}
	}
}

// Delete removes h and reports whether it was present.
func (x *Index) Delete(h BlockHash) bool {
	if h == 0 {
		was := x.zero
		x.zero, x.zeroVal = false, 0
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
	x.slots[hole] = indexSlot{}
	x.n--
	if len(x.slots) > x.minSlots && 8*x.n < len(x.slots) {
		x.resize(len(x.slots) / 2)
	}
	return true
}

// Range calls f for every entry until f returns false. The index must not
// change during the call.
func (x *Index) Range(f func(h BlockHash, v int32) bool) {
	if x.zero && !f(0, x.zeroVal) {
		return
	}
	for _, s := range x.slots {
		if s.key != 0 && !f(s.key, s.val) {
			return
		}
	}
}

func (x *Index) resize(size int) {
	old := x.slots
	x.slots = make([]indexSlot, size)
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
