package kv

// Set is a set of block hashes that only grows: 8 bytes a slot (a Table
// slot is 16), filled up to 3/4, so that remembering every block a long
// run ever computed costs 11 to 21 bytes a block. The zero value is an
// empty set ready to use. Not safe for concurrent use.
type Set struct {
	slots []BlockHash
	mask  uint64
	n     int
	zero  bool // whether hash 0 is in (0 marks empty slots)
}

// Len is the number of hashes in the set.
func (s *Set) Len() int {
	if s.zero {
		return s.n + 1
	}
	return s.n
}

// Has reports whether h is in the set.
func (s *Set) Has(h BlockHash) bool {
	if h == 0 {
		return s.zero
	}
	if s.slots == nil {
		return false
	}
	for i := uint64(h) & s.mask; ; i = (i + 1) & s.mask {
		switch s.slots[i] {
		case h:
			return true
		case 0:
			return false
		}
	}
}

// Add puts h in the set and reports whether it was new.
func (s *Set) Add(h BlockHash) bool {
	if h == 0 {
		was := s.zero
		s.zero = true
		return !was
	}
	if 4*(s.n+1) > 3*len(s.slots) {
		s.grow()
	}
	for i := uint64(h) & s.mask; ; i = (i + 1) & s.mask {
		switch s.slots[i] {
		case h:
			return false
		case 0:
			s.slots[i] = h
			s.n++
			return true
		}
	}
}

func (s *Set) grow() {
	old := s.slots
	size := max(1024, 2*len(old))
	s.slots, s.mask = make([]BlockHash, size), uint64(size-1)
	AdviseHugePages(s.slots)
	for _, h := range old {
		if h == 0 {
			continue
		}
		i := uint64(h) & s.mask
		for s.slots[i] != 0 {
			i = (i + 1) & s.mask
		}
		s.slots[i] = h
	}
}

// Clear empties the set and keeps its slots for reuse.
func (s *Set) Clear() {
	clear(s.slots)
	s.n, s.zero = 0, false
}

// reserve sizes an empty set for n hashes, so that adding them never grows
// it.
func (s *Set) reserve(n int) {
	size := 1024
	for 3*size < 4*(n+1) {
		size *= 2
	}
	s.slots, s.mask = make([]BlockHash, size), uint64(size-1)
	AdviseHugePages(s.slots)
}

// RecentSet remembers the hashes added lately in bounded memory: at least
// the last n distinct ones and at most 2n. It keeps two generations of n;
// when the newer one is full, the older is emptied and becomes the newer.
// A hash added again while remembered moves to the newer generation, so
// what keeps being seen is never forgotten. Each generation is sized for n
// when first used (the newer at the first Add, the older when the newer
// first fills) and never grows: memory is at most two Sets of n (11 to 21
// bytes a hash), however long the run. Not safe for concurrent use.
type RecentSet struct {
	cur, old Set
	n        int
}

// NewRecentSet returns a set that remembers at least the last n (> 0)
// distinct hashes added.
func NewRecentSet(n int) *RecentSet {
	return &RecentSet{n: max(n, 1)}
}

// Add remembers h.
func (r *RecentSet) Add(h BlockHash) {
	if r.cur.Has(h) {
		return
	}
	if r.cur.Len() >= r.n {
		r.cur, r.old = r.old, r.cur
		r.cur.Clear()
	}
	if r.cur.slots == nil {
		r.cur.reserve(r.n)
	}
	r.cur.Add(h)
}

// Has reports whether h is remembered.
func (r *RecentSet) Has(h BlockHash) bool { return r.cur.Has(h) || r.old.Has(h) }

// Len is how many hashes the two generations hold (a hash added again
// while in the older one counts in both until the older is emptied).
func (r *RecentSet) Len() int { return r.cur.Len() + r.old.Len() }
