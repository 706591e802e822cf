package sim

import (
	"time"

	"github.com/evolvellm/evolve/kv"
)

// emit records a KV event for the next Output.
func (m *Model) emit(kind kv.EventKind, tier kv.Tier, b *Block) {
	if m.delivered {
		m.out.Events = m.out.Events[:0]
		m.delivered = false
	}
	m.eventSeq++
	m.out.Events = append(m.out.Events, kv.Event{
		Seq: m.eventSeq, Kind: kind, Tier: tier, Hash: b.Hash, Parent: b.Parent, Depth: b.Depth,
	})
}

func (m *Model) newBlock() *Block {
	if n := len(m.spare); n > 0 {
		b := m.spare[n-1]
		m.spare = m.spare[:n-1]
		return b
	}
	return &Block{}
}

func (m *Model) recycle(b *Block) {
	*b = Block{}
	m.spare = append(m.spare, b)
}

// gpuAvailable is the number of GPU blocks that can be allocated now,
// evicting cached blocks nobody uses.
func (m *Model) gpuAvailable() int {
	return m.cfg.GPUBlocks - m.gpuUsed + m.gpuPolicy.Len()
}

// allocGPU returns a private GPU block, evicting (and offloading) a cached
// block when the tier is full, or nil when every block is in use.
func (m *Model) allocGPU() *Block {
	if m.gpuUsed < m.cfg.GPUBlocks {
		m.gpuUsed++
		b := m.newBlock()
		b.Tier = kv.TierGPU
		b.ref = 1
		b.LastUse = m.pass
		return b
	}
	v := m.gpuPolicy.Victim()
	if v == nil {
		return nil
	}
	m.evictGPU(v)
	m.gpuUsed++
	b := m.newBlock()
	b.Tier = kv.TierGPU
	b.ref = 1
	b.LastUse = m.pass
	return b
}

// evictGPU drops an unused cached GPU block, offloading it to host first.
func (m *Model) evictGPU(v *Block) {
	m.gpuPolicy.Remove(v)
	delete(m.gpuByHash, v.Hash)
	m.emit(kv.BlockRemoved, kv.TierGPU, v)
	if m.storeHost(v.Hash, v.Parent, v.Depth) {
		m.out.Stats.OffloadBlocks++
		m.counters.OffloadedBlocks++
	}
	m.gpuUsed--
	m.recycle(v)
}

// storeHost puts a copy of a block in the host tier, evicting the host's
// victim when full. It reports whether a new copy was made.
func (m *Model) storeHost(h, parent kv.BlockHash, depth int32) bool {
	if b := m.hostByHash[h]; b != nil {
		m.touchHost(b)
		return false
	}
	if m.cfg.HostBlocks <= 0 {
		return false
	}
	if len(m.hostByHash) >= m.cfg.HostBlocks {
		v := m.hostPolicy.Victim()
		if v == nil {
			return false
		}
		m.hostPolicy.Remove(v)
		delete(m.hostByHash, v.Hash)
		m.emit(kv.BlockRemoved, kv.TierHost, v)
		if m.gpuByHash[v.Hash] == nil {
			delete(m.hints, v.Hash)
		}
		m.recycle(v)
	}
	b := m.newBlock()
	b.Hash, b.Parent, b.Depth, b.Hashed, b.Tier = h, parent, depth, true, kv.TierHost
	b.Priority = m.hints[h]
	b.LastUse = m.pass
	m.hostByHash[h] = b
	m.hostPolicy.Add(b)
	m.emit(kv.BlockStored, kv.TierHost, b)
	return true
}

func (m *Model) touchHost(b *Block) {
	b.LastUse = m.pass
	m.hostPolicy.Remove(b)
	m.hostPolicy.Add(b)
}

// acquireCached takes a reference on a cached GPU block.
func (m *Model) acquireCached(b *Block) {
	if b.ref == 0 {
		m.gpuPolicy.Remove(b)
	}
	b.ref++
	b.LastUse = m.pass
}

// commitBlock gives a freshly filled private block its hash and caches it,
// unless another copy is cached already (then it stays private).
func (m *Model) commitBlock(b *Block, h, parent kv.BlockHash, depth int) {
	if m.gpuByHash[h] != nil {
		return
	}
	b.Hash, b.Parent, b.Depth, b.Hashed = h, parent, int32(depth), true
	b.Priority = m.hints[h]
	m.gpuByHash[h] = b
	m.emit(kv.BlockStored, kv.TierGPU, b)
}

// release drops one reference; a cached block nobody uses becomes
// evictable, a private one is freed.
func (m *Model) release(b *Block) {
	b.ref--
	if b.ref > 0 {
		return
	}
	if b.Hashed {
		b.LastUse = m.pass
		m.gpuPolicy.Add(b)
		return
	}
	m.gpuUsed--
	m.recycle(b)
}

// freeSeq releases every block of s, deepest first, so that under LRU the
// tail of a sequence is evicted before its head.
func (m *Model) freeSeq(s *seq) {
	for i := len(s.blocks) - 1; i >= 0; i-- {
		m.release(s.blocks[i])
		s.blocks[i] = nil
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
			if m.gpuByHash[f.chain[i]] == nil && m.storeHost(f.chain[i], parent, int32(i)) {
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
