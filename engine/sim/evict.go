package sim

import (
	"github.com/evolvellm/evolve/kv"
)

// BlockID names a block copy in an engine's BlockTable.
type BlockID int32

// NoBlock is the BlockID of no block.
const NoBlock BlockID = -1

// Block is one KV block copy in one tier of an engine. Blocks with a hash are
// full and shareable; a sequence's last, partly filled block has none.
// Blocks hold no pointers, so that millions of them cost the garbage
// collector nothing.
type Block struct {
	Hash     kv.BlockHash
	Parent   kv.BlockHash
	LastUse  int64 // model pass counter when last taken or released
	Depth    int32 // position in its sequence, 0-based
	ref      int32 // running or held sequences using this GPU copy
	prev     BlockID
	next     BlockID
	list     int16 // LRU list holding the block, -1 if none
	Priority int8  // eviction hint: lower is evicted first (0 = no hint)
	Tier     kv.Tier
	Hashed   bool
}

const (
	chunkBits = 14
	chunkSize = 1 << chunkBits
)

// BlockTable stores the block copies of one engine (both tiers), in chunks
// that never move.
type BlockTable struct {
	chunks [][]Block
	n      int
	free   []BlockID
}

// Get returns the block with that id.
func (t *BlockTable) Get(id BlockID) *Block {
	return &t.chunks[id>>chunkBits][id&(chunkSize-1)]
}

func (t *BlockTable) alloc() BlockID {
	var id BlockID
	if n := len(t.free); n > 0 {
		id = t.free[n-1]
		t.free = t.free[:n-1]
	} else {
		if t.n == len(t.chunks)*chunkSize {
			t.chunks = append(t.chunks, make([]Block, chunkSize))
		}
		id = BlockID(t.n)
		t.n++
	}
	b := t.Get(id)
	*b = Block{prev: NoBlock, next: NoBlock, list: -1}
	return id
}

func (t *BlockTable) release(id BlockID) {
	*t.Get(id) = Block{prev: NoBlock, next: NoBlock, list: -1}
	t.free = append(t.free, id)
}

// EvictionPolicy orders the evictable copies of one tier (GPU copies no
// sequence uses, and every host copy). The model tells it which blocks become
// evictable and which stop being so, and asks it for the next victim.
// Implementations read blocks through the BlockTable they were made with and
// may use Block's exported fields (Priority, LastUse, Depth, Hash).
type EvictionPolicy interface {
	// Add makes a block evictable. Blocks are added in the order they were
	// last used; of one sequence's blocks, the deepest is added first.
	Add(id BlockID)
	// Remove makes a block no longer evictable (in use again, or gone).
	Remove(id BlockID)
	// Victim returns the block to evict next without removing it, or NoBlock.
	Victim() BlockID
	// Len is the number of evictable blocks.
	Len() int
}

// NewLRUPolicy returns the default policy: least recently used first, and
// among one sequence's blocks the deepest suffix first (so that the shared
// head of a prefix survives longest), within priority classes: every block
// of a lower Priority hint goes before any block of a higher one.
func NewLRUPolicy(t *BlockTable) EvictionPolicy { return &lruPolicy{t: t} }

type lruList struct {
	prio       int8
	head, tail BlockID // head is evicted first
}

type lruPolicy struct {
	t     *BlockTable
	lists []lruList // indexed by Block.list; never reordered
	order []int16   // indices of lists by ascending priority
	n     int
}

func (p *lruPolicy) listFor(prio int8) int16 {
	for _, i := range p.order {
		if p.lists[i].prio == prio {
			return i
		}
	}
	i := int16(len(p.lists))
	p.lists = append(p.lists, lruList{prio: prio, head: NoBlock, tail: NoBlock})
	k := 0
	for k < len(p.order) && p.lists[p.order[k]].prio < prio {
		k++
	}
	p.order = append(p.order, 0)
	copy(p.order[k+1:], p.order[k:])
	p.order[k] = i
	return i
}

func (p *lruPolicy) Add(id BlockID) {
	b := p.t.Get(id)
	if b.list >= 0 {
		p.Remove(id)
	}
	li := p.listFor(b.Priority)
	l := &p.lists[li]
	b.list, b.prev, b.next = li, l.tail, NoBlock
	if l.tail != NoBlock {
		p.t.Get(l.tail).next = id
	} else {
		l.head = id
	}
	l.tail = id
	p.n++
}

func (p *lruPolicy) Remove(id BlockID) {
	b := p.t.Get(id)
	if b.list < 0 {
		return
	}
	l := &p.lists[b.list]
	if b.prev != NoBlock {
		p.t.Get(b.prev).next = b.next
	} else {
		l.head = b.next
	}
	if b.next != NoBlock {
		p.t.Get(b.next).prev = b.prev
	} else {
		l.tail = b.prev
	}
	b.prev, b.next, b.list = NoBlock, NoBlock, -1
	p.n--
}

func (p *lruPolicy) Victim() BlockID {
	for _, i := range p.order {
		if h := p.lists[i].head; h != NoBlock {
			return h
		}
	}
	return NoBlock
}

func (p *lruPolicy) Len() int { return p.n }
