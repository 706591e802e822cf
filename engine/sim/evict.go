package sim

import (
	"github.com/evolvellm/evolve/kv"
)

// Block is one KV block copy in one tier of an engine. Blocks with a hash are
// full and shareable; a sequence's last, partly filled block has none.
type Block struct {
	Hash     kv.BlockHash
	Parent   kv.BlockHash
	Depth    int32 // position in its sequence, 0-based
	Hashed   bool
	Tier     kv.Tier
	Priority int8  // eviction hint: lower is evicted first (0 = no hint)
	LastUse  int64 // model pass counter when last referenced

	ref        int32 // running or held sequences using this GPU copy
	prev, next *Block
	list       *lruList
}

// EvictionPolicy orders the evictable copies of one tier (GPU copies no
// sequence uses, and every host copy). The model tells it which blocks become
// evictable and which stop being so, and asks it for the next victim.
// Implementations may use Block's exported fields (Priority, LastUse, Depth).
type EvictionPolicy interface {
	// Add makes b evictable. Blocks are added in the order they were last
	// used; of one sequence's blocks, the deepest is added first.
	Add(b *Block)
	// Remove makes b no longer evictable (it is in use again, or gone).
	Remove(b *Block)
	// Victim returns the block to evict next without removing it, or nil.
	Victim() *Block
	// Len is the number of evictable blocks.
	Len() int
}

// NewLRUPolicy returns the default policy: least recently used first, and
// among one sequence's blocks the deepest suffix first (so that the shared
// head of a prefix survives longest), within priority classes: every block
// of a lower Priority hint goes before any block of a higher one.
func NewLRUPolicy() EvictionPolicy { return &lruPolicy{} }

type lruList struct {
	prio       int8
	head, tail *Block // head is evicted first
	n          int
}

type lruPolicy struct {
	lists []*lruList // sorted by priority, ascending
	n     int
}

func (p *lruPolicy) list(prio int8) *lruList {
	for i, l := range p.lists {
		if l.prio == prio {
			return l
		}
		if l.prio > prio {
			nl := &lruList{prio: prio}
			p.lists = append(p.lists, nil)
			copy(p.lists[i+1:], p.lists[i:])
			p.lists[i] = nl
			return nl
		}
	}
	nl := &lruList{prio: prio}
	p.lists = append(p.lists, nl)
	return nl
}

func (p *lruPolicy) Add(b *Block) {
	if b.list != nil {
		p.Remove(b)
	}
	l := p.list(b.Priority)
	b.list, b.prev, b.next = l, l.tail, nil
	if l.tail != nil {
		l.tail.next = b
	} else {
		l.head = b
	}
	l.tail = b
	l.n++
	p.n++
}

func (p *lruPolicy) Remove(b *Block) {
	l := b.list
	if l == nil {
		return
	}
	if b.prev != nil {
		b.prev.next = b.next
	} else {
		l.head = b.next
	}
	if b.next != nil {
		b.next.prev = b.prev
	} else {
		l.tail = b.prev
	}
	b.prev, b.next, b.list = nil, nil, nil
	l.n--
	p.n--
}

func (p *lruPolicy) Victim() *Block {
	for _, l := range p.lists {
		if l.head != nil {
			return l.head
		}
	}
	return nil
}

func (p *lruPolicy) Len() int { return p.n }
