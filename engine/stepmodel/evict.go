package stepmodel

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
	Depth    int32  // position in its sequence, 0-based
	ref      int32  // running or held sequences using this GPU copy
	lru      uint32 // the stamp of its entry in the LRU queues (see lruPolicy)
	Priority int8   // eviction hint: lower is evicted first (0 = no hint)
	Tier     kv.Tier
	Hashed   bool
	listed   bool // in the LRU queue of its priority
}

// A chunk is 4 MiB, so that at least one aligned huge page lies in it
// (kv.AdviseHugePages).
const (
	chunkBits = 17
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

// cachedOnGPU reports whether id is the cached GPU copy of h: the one
// Model.gpuByHash names, as only that copy of a hash is on GPU and hashed.
func (t *BlockTable) cachedOnGPU(id BlockID, h kv.BlockHash) bool {
	if id < 0 || int(id) >= t.n {
		return false
	}
	b := t.Get(id)
	return b.Hashed && b.Tier == kv.TierGPU && b.Hash == h
}

// prefetch starts fetching id's line, if id is in the table.
func (t *BlockTable) prefetch(id BlockID) {
	if id >= 0 && int(id) < t.n {
		kv.PrefetchLine(t.Get(id))
	}
}

func (t *BlockTable) alloc() BlockID {
	var id BlockID
	if n := len(t.free); n > 0 {
		id = t.free[n-1]
		t.free = t.free[:n-1]
	} else {
		if t.n == len(t.chunks)*chunkSize {
			t.chunks = append(t.chunks, make([]Block, chunkSize))
			kv.AdviseHugePages(t.chunks[len(t.chunks)-1])
		}
		id = BlockID(t.n)
		t.n++
	}
	b := t.Get(id)
	*b = Block{lru: b.lru}
	return id
}

func (t *BlockTable) release(id BlockID) {
	b := t.Get(id)
	*b = Block{lru: b.lru} // a stale queue entry must not match the id's next block
	t.free = append(t.free, id)
}

// EvictionPolicy orders the evictable copies of one tier (GPU copies no
// sequence uses, and every host copy). The model tells it which blocks become
// evictable and which stop being so, and asks it for the next victim.
// Implementations read blocks through the BlockTable they were made with and
// may use Block's exported fields (Priority, Depth, Hash). A block's
// Priority changes only while it is not evictable: the model removes it,
// sets the new hint, and adds it again.
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

// The LRU lists are queues in the order blocks were added, oldest first.
// Removing a block only bumps its stamp, which makes its entry stale; stale
// entries are skipped when they reach the head and dropped in bulk once they
// outnumber the live ones twice over. A linked list would touch a block's
// neighbours, scattered over the table, on every add and removal; the
// queues touch only the block itself and their own array, in order. The
// order, and so every victim, is the linked list's.
type lruEntry struct {
	id    BlockID
	stamp uint32
}

type lruList struct {
	prio int8
	q    []lruEntry // q[head:] in the order added, stale entries among them
	head int
	live int
}

type lruPolicy struct {
	t     *BlockTable
	lists []lruList // never reordered
	order []int16   // indices of lists by ascending priority
	// byPrio[prio+128] is 1 + the index in lists of prio's list (0: none
	// yet): every add and removal finds its list at once.
	byPrio [256]int16
	n      int
}

func (p *lruPolicy) listFor(prio int8) int16 {
	if i := p.byPrio[int(prio)+128]; i > 0 {
		return i - 1
	}
	i := int16(len(p.lists))
	p.byPrio[int(prio)+128] = i + 1
	p.lists = append(p.lists, lruList{prio: prio})
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
	if b.listed {
		p.Remove(id)
	}
	l := &p.lists[p.listFor(b.Priority)]
	if l.head >= maxStale && 2*l.head >= len(l.q) {
		// Victims taken from the head leave room there: reuse it.
		n := copy(l.q, l.q[l.head:])
		l.q, l.head = l.q[:n], 0
	}
	b.lru++
	b.listed = true
	l.q = append(l.q, lruEntry{id: id, stamp: b.lru})
	l.live++
	p.n++
}

// Remove leaves the block's entry stale: a listed block's Priority is the
// priority of its queue (a new hint removes it first).
func (p *lruPolicy) Remove(id BlockID) {
	b := p.t.Get(id)
	if !b.listed {
		return
	}
	l := &p.lists[p.listFor(b.Priority)]
	b.lru++
	b.listed = false
	l.live--
	p.n--
	if stale := len(l.q) - l.head - l.live; stale > 2*l.live+maxStale {
		p.compact(l)
	}
}

// maxStale is how many stale entries beyond twice the live ones a queue
// keeps before it drops them: each compaction visits every entry, so it
// costs at most 1.5 block visits per removal, and a queue holds at most
// three entries per evictable block, plus maxStale.
const maxStale = 1024

// current says e is its block's entry: listed, and not removed since.
func (p *lruPolicy) current(e lruEntry) bool {
	b := p.t.Get(e.id)
	return b.listed && b.lru == e.stamp
}

// compactAhead is how many entries ahead compact fetches blocks.
const compactAhead = 16

// compact drops l's stale entries, keeping the live ones in order.
func (p *lruPolicy) compact(l *lruList) {
	k := 0
	q := l.q[l.head:]
	for j, e := range q {
		if j%compactAhead == 0 {
			// The entries' blocks lie at random: fetch a batch's lines
			// together, a batch ahead, rather than wait for each in turn.
			from := j + compactAhead
			if j == 0 {
				from = 0
			}
			for _, x := range q[min(from, len(q)):min(j+2*compactAhead, len(q))] {
				kv.PrefetchLine(p.t.Get(x.id))
			}
		}
		if p.current(e) {
			l.q[k] = e
			k++
		}
	}
	l.q, l.head = l.q[:k], 0
}

func (p *lruPolicy) Victim() BlockID {
	for _, i := range p.order {
		l := &p.lists[i]
		for l.head < len(l.q) {
			if e := l.q[l.head]; p.current(e) {
				return e.id
			}
			l.head++
		}
		l.q, l.head = l.q[:0], 0
	}
	return NoBlock
}

func (p *lruPolicy) Len() int { return p.n }
