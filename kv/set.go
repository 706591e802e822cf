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
