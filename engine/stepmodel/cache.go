package stepmodel

import (
	"time"

	"github.com/evolvellm/evolve/kv"
)

// emit records a KV event for the next Output.
func (m *Model) emit(kind kv.EventKind, tier kv.Tier, h, parent kv.BlockHash, depth int32) {
	if m.delivered {
		m.out.Events = m.out.Events[:0]
		m.delivered = false
	}
	m.eventSeq++
	m.out.Events = append(m.out.Events, kv.Event{
		Seq: m.eventSeq, Kind: kind, Tier: tier, Hash: h, Parent: parent, Depth: depth,
	})
}

func (m *Model) emitBlock(kind kv.EventKind, b *Block) {
	m.emit(kind, b.Tier, b.Hash, b.Parent, b.Depth)
}

// walkAhead is how many ids ahead gpuHits fetches a run of neighbours.
const walkAhead = 16

// gpuHits appends to hits the ids of the cached GPU copies of chain's
// leading blocks, up to the first block not cached on GPU.
func (m *Model) gpuHits(chain []kv.BlockHash, hits []BlockID) []BlockID {
	from := len(hits)
	for _, h := range chain {
		id := NoBlock
		if n := len(hits); n > from {
			// A chain cached in one go mostly lies in neighbouring ids
			// (freed blocks are reused in order, either way): try the
			// previous block's neighbours before the index, whose slots
			// lie at random.
			if p := hits[n-1]; m.blocks.cachedOnGPU(p+1, h) {
				id = p + 1
				m.blocks.prefetch(id + walkAhead)
			} else if m.blocks.cachedOnGPU(p-1, h) {
				id = p - 1
				m.blocks.prefetch(id - walkAhead)
			}
		}
		if id == NoBlock {
			v, ok := m.gpuByHash.Get(h)
			if !ok {
				break
			}
			id = BlockID(v)
		}
		hits = append(hits, id)
	}
	return hits
}

// gpuAvailable is the number of GPU blocks that can be allocated now,
// evicting cached blocks nobody uses.
func (m *Model) gpuAvailable() int {
	return m.cfg.GPUBlocks - m.gpuUsed + m.gpuPolicy.Len()
}

// allocGPU returns a private GPU block, evicting (and offloading) a cached
// block when the tier is full, or NoBlock when every block is in use.
func (m *Model) allocGPU() BlockID {
	if m.gpuUsed >= m.cfg.GPUBlocks {
		v := m.gpuPolicy.Victim()
		if v == NoBlock {
			return NoBlock
		}
		m.evictGPU(v)
	}
	m.gpuUsed++
	id := m.blocks.alloc()
	b := m.blocks.Get(id)
	b.Tier, b.ref = kv.TierGPU, 1
	return id
}

// evictGPU drops an unused cached GPU block, offloading it to host first.
func (m *Model) evictGPU(id BlockID) {
	m.gpuPolicy.Remove(id)
	v := m.blocks.Get(id)
	m.gpuByHash.Delete(v.Hash)
	m.emitBlock(kv.BlockRemoved, v)
	if m.storeHost(v.Hash, v.Parent, v.Depth, v.Priority) {
		m.out.Stats.OffloadBlocks++
		m.counters.OffloadedBlocks++
	}
	m.gpuUsed--
	m.blocks.release(id)
}

// storeHost puts a copy of a block in the host tier, evicting the host's
// victim when full. It reports whether a new copy was made.
func (m *Model) storeHost(h, parent kv.BlockHash, depth int32, prio int8) bool {
	if id, ok := m.hostByHash.Get(h); ok {
		m.touchHost(BlockID(id))
		return false
	}
	if m.cfg.HostBlocks <= 0 {
		return false
	}
	if m.hostByHash.Len() >= m.cfg.HostBlocks {
		vid := m.hostPolicy.Victim()
		if vid == NoBlock {
			return false
		}
		m.hostPolicy.Remove(vid)
		v := m.blocks.Get(vid)
		m.hostByHash.Delete(v.Hash)
		m.emitBlock(kv.BlockRemoved, v)
		m.blocks.release(vid)
	}
	id := m.blocks.alloc()
	b := m.blocks.Get(id)
	b.Hash, b.Parent, b.Depth, b.Hashed, b.Tier = h, parent, depth, true, kv.TierHost
	b.Priority = prio
	m.hostByHash.Put(h, int32(id))
	m.hostPolicy.Add(id)
	m.emitBlock(kv.BlockStored, b)
	return true
}

func (m *Model) touchHost(id BlockID) {
	m.hostPolicy.Remove(id)
	m.hostPolicy.Add(id)
}

// acquireCached takes a reference on a cached GPU block.
func (m *Model) acquireCached(id BlockID) {
	b := m.blocks.Get(id)
	if b.ref == 0 {
		m.gpuPolicy.Remove(id)
	}
	b.ref++
}

// commitBlock gives a freshly filled private block its hash and caches it,
// unless another copy is cached already (then it stays private).
func (m *Model) commitBlock(id BlockID, h, parent kv.BlockHash, depth int) {
	if _, added := m.gpuByHash.PutNew(h, int32(id)); !added {
		return
	}
	b := m.blocks.Get(id)
	b.Hash, b.Parent, b.Depth, b.Hashed = h, parent, int32(depth), true
	if hid, ok := m.hostByHash.Get(h); ok {
		b.Priority = m.blocks.Get(BlockID(hid)).Priority
	} else {
		b.Priority = m.arrivingHint(h)
	}
	m.emitBlock(kv.BlockStored, b)
	if m.cfg.WriteThrough && m.storeHost(h, parent, int32(depth), b.Priority) {
		m.counters.OffloadedBlocks++
	}
}

// release drops one reference; a cached block nobody uses becomes
// evictable, a private one is freed.
func (m *Model) release(id BlockID) {
	b := m.blocks.Get(id)
	b.ref--
	if b.ref > 0 {
		return
	}
	if b.Hashed {
		m.gpuPolicy.Add(id)
		return
	}
	m.gpuUsed--
	m.blocks.release(id)
}

// freeSeq releases every block of s, deepest first, so that under LRU the
// tail of a sequence is evicted before its head.
func (m *Model) freeSeq(s *seq) {
	for i := len(s.blocks) - 1; i >= 0; i-- {
		if k := len(s.blocks) - 1 - i; k%prefetchBatch == 0 {
			// The blocks lie scattered over the table: fetch the next
			// batch's lines together rather than wait for each in turn.
			for _, id := range s.blocks[max(0, i-prefetchBatch+1) : i+1] {
				kv.PrefetchLine(m.blocks.Get(id))
			}
		}
		m.release(s.blocks[i])
	}
	s.blocks = s.blocks[:0]
	s.computed = 0
}

// completeFetches lands the fetches due by now in the host tier.
func (m *Model) completeFetches(now time.Time) {
	k := 0
	for k < len(m.fetches) && !m.fetches[k].ready.After(now) {
		f := m.fetches[k]
		for i := f.from; i < len(f.chain); i++ {
			var parent kv.BlockHash
			if i > 0 {
				parent = f.chain[i-1]
			}
			if !m.gpuByHash.Has(f.chain[i]) && m.storeHost(f.chain[i], parent, int32(i), m.arrivingHint(f.chain[i])) {
				m.counters.FetchedBlocks++
			}
		}
		k++
	}
	if k > 0 {
		copy(m.fetches, m.fetches[k:])
		m.fetches = m.fetches[:len(m.fetches)-k]
	}
}

// arrivingHint is the eviction hint a block gets as its first copy on this
// engine arrives: one given while the engine held no copy of it. From then
// on the copies carry the hint from tier to tier, and it is forgotten when
// the last copy leaves.
func (m *Model) arrivingHint(h kv.BlockHash) int8 {
	if m.hints.Len() == 0 {
		return 0
	}
	p, ok := m.hints.Get(h)
	if ok {
		m.hints.Delete(h)
	}
	return p
}
