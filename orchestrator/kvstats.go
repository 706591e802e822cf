package orchestrator

import (
	"sort"
	"sync/atomic"

	"github.com/evolvellm/evolve/controlapi"
	"github.com/evolvellm/evolve/kv"
	"github.com/evolvellm/evolve/protocol"
)

// kvCounters are the front door's totals of where prompt tokens' KV came
// from and of what moved between nodes.
type kvCounters struct {
	gpu, localHost, remoteHost, recomputed atomic.Int64 // prompt tokens
	lostReuse                              atomic.Int64 // recomputed tokens some engine had computed before
	fetchedBlocks, transferredTokens       atomic.Int64
}

// everRecent is how many blocks stored and since evicted everywhere the
// router remembers at least (for lost KV reuse; blocks some engine holds
// are known from the directory): two generations of this many, 16 MiB
// each once filled. A block evicted longer ago and computed again is not
// counted as lost, rather than memory growing with the run's history.
const everRecent = 3<<19 - 1

// pendingRecent is how many pending hints the router remembers at least;
// a hint waits for a store event that comes within moments of the request
// that made it, or never.
const pendingRecent = 1 << 16

// everStored is the set of blocks some engine has computed, as far as the
// router remembers: those held now, and those stored lately.
type everStored struct {
	dir    *kv.Directory
	recent *kv.RecentSet
}

func (e everStored) Has(h kv.BlockHash) bool { return e.recent.Has(h) || e.dir.Has(h) }

// KVNode is one node's KV as the control API reports it.
type KVNode struct {
	ID              string  `json:"id"`
	Role            string  `json:"role"`
	State           string  `json:"state"`
	GPUCapacity     int     `json:"gpu_capacity_blocks"`
	GPUUsage        float64 `json:"gpu_usage"` // share of GPU KV in use by sequences
	HostCapacity    int     `json:"host_capacity_blocks"`
	HostUsage       float64 `json:"host_usage"`
	GPUCached       int     `json:"gpu_cached_blocks"` // copies the directory knows
	HostCached      int     `json:"host_cached_blocks"`
	GPUReferenced   int     `json:"gpu_referenced_blocks"` // of those, referenced by a live branch
	HostReferenced  int     `json:"host_referenced_blocks"`
	ReferencedShare float64 `json:"referenced_share"` // of its cached copies
	// Copies of blocks a live branch referenced that the node evicted
	// since it joined, per tier, and of those the ones that were the last
	// copy in the cluster (that context must be recomputed).
	RefEvictedGPU  int64 `json:"referenced_evicted_gpu_blocks"`
	RefEvictedHost int64 `json:"referenced_evicted_host_blocks"`
	RefLost        int64 `json:"referenced_lost_blocks"`
}

// KVPool is the cluster-wide KV capacity and what fills it, per tier, in
// blocks: capacity, copies cached (in use or not), copies of referenced
// blocks, and free room (capacity not cached).
type KVPool struct {
	GPUCapacity    int `json:"gpu_capacity_blocks"`
	GPUCached      int `json:"gpu_cached_blocks"`
	GPUReferenced  int `json:"gpu_referenced_blocks"`
	GPUFree        int `json:"gpu_free_blocks"`
	HostCapacity   int `json:"host_capacity_blocks"`
	HostCached     int `json:"host_cached_blocks"`
	HostReferenced int `json:"host_referenced_blocks"`
	HostFree       int `json:"host_free_blocks"`
}

// KVStatus is the cluster's KV summary. JSON names are stable.
type KVStatus struct {
	BlockSize        int      `json:"block_size"`
	KVBytesPerToken  int      `json:"kv_bytes_per_token"`
	Blocks           int      `json:"blocks"`   // distinct blocks in the directory
	Replicas         int      `json:"replicas"` // copies
	ReferencedBlocks int      `json:"referenced_blocks"`
	LiveBranches     int      `json:"live_branches"`
	Nodes            []KVNode `json:"nodes"`
	// Pool is the cluster's KV as one pool: every serving node's tiers
	// added up.
	Pool KVPool `json:"pool"`
	// Prompt tokens by where their KV came from when routed, and the
	// shares of all prompt tokens.
	PromptTokens     int64   `json:"prompt_tokens"`
	GPUHitTokens     int64   `json:"gpu_hit_tokens"`
	LocalHostTokens  int64   `json:"local_host_hit_tokens"`
	RemoteHostTokens int64   `json:"remote_fetched_tokens"`
	RecomputedTokens int64   `json:"recomputed_tokens"`
	GPUHitRate       float64 `json:"gpu_hit_rate"`
	HostHitRate      float64 `json:"host_hit_rate"` // own host tier and fetched
	LostKVReuse      int64   `json:"lost_kv_reuse_tokens"`
	BytesMoved       int64   `json:"bytes_moved"` // fetched blocks and prefill-to-decode transfers
}

// KV summarises the cluster's KV: capacity and use per node and tier,
// referenced versus unreferenced copies, hit rates by tier, lost reuse and
// bytes moved.
func (o *Orchestrator) KV() KVStatus {
	o.c.mu.Lock()
	defer o.c.mu.Unlock()
	st := KVStatus{Blocks: o.c.dir.Blocks(), Replicas: o.c.dir.Replicas(), ReferencedBlocks: o.c.branches.Referenced(),
		LiveBranches: o.c.branches.Live(), BlockSize: o.blockSize}
	byDir := map[kv.NodeID]*KVNode{}
	for id, n := range o.c.nodes {
		if st.KVBytesPerToken == 0 {
			st.KVBytesPerToken = n.reg.KVBytesPerToken
		}
		g, h := o.c.dir.NodeReplicas(n.dir)
		rg, rh := o.c.dir.NodeReferenced(n.dir)
		kn := &KVNode{ID: id, Role: n.role.String(), State: n.state, GPUCapacity: n.reg.GPUBlocks, GPUUsage: n.hb.GPUKVUsage,
			HostCapacity: n.reg.HostBlocks, HostUsage: n.hb.HostKVUsage, GPUCached: g, HostCached: h,
			GPUReferenced: rg, HostReferenced: rh,
			RefEvictedGPU: n.refEvicted[kv.TierGPU], RefEvictedHost: n.refEvicted[kv.TierHost], RefLost: n.refLost}
		byDir[n.dir] = kn
	}
	for _, kn := range byDir {
		if c := kn.GPUCached + kn.HostCached; c > 0 {
			kn.ReferencedShare = float64(kn.GPUReferenced+kn.HostReferenced) / float64(c)
		}
		st.Nodes = append(st.Nodes, *kn)
		if kn.State == StateServing {
			p := &st.Pool
			p.GPUCapacity += kn.GPUCapacity
			p.GPUCached += kn.GPUCached
			p.GPUReferenced += kn.GPUReferenced
			p.GPUFree += max(0, kn.GPUCapacity-kn.GPUCached)
			p.HostCapacity += kn.HostCapacity
			p.HostCached += kn.HostCached
			p.HostReferenced += kn.HostReferenced
			p.HostFree += max(0, kn.HostCapacity-kn.HostCached)
		}
	}
	sort.Slice(st.Nodes, func(i, j int) bool { return controlapi.CompareIDs(st.Nodes[i].ID, st.Nodes[j].ID) < 0 })
	k := &o.kvc
	st.GPUHitTokens, st.LocalHostTokens, st.RemoteHostTokens, st.RecomputedTokens = k.gpu.Load(), k.localHost.Load(), k.remoteHost.Load(), k.recomputed.Load()
	st.PromptTokens = st.GPUHitTokens + st.LocalHostTokens + st.RemoteHostTokens + st.RecomputedTokens
	if st.PromptTokens > 0 {
		st.GPUHitRate = float64(st.GPUHitTokens) / float64(st.PromptTokens)
		st.HostHitRate = float64(st.LocalHostTokens+st.RemoteHostTokens) / float64(st.PromptTokens)
	}
	st.LostKVReuse = k.lostReuse.Load()
	st.BytesMoved = (k.fetchedBlocks.Load()*int64(st.BlockSize) + k.transferredTokens.Load()) * int64(st.KVBytesPerToken)
	return st
}

// referencedShareLocked is, per node, the share of its GPU copies that
// live agent branches reference: the planner moves the node that loses
// least. The directory keeps the counts current, so this is O(nodes).
// Call with mu held.
func (o *Orchestrator) referencedShareLocked() map[kv.NodeID]float64 {
	out := make(map[kv.NodeID]float64, len(o.c.nodes))
	for _, n := range o.c.nodes {
		if g, _ := o.c.dir.NodeReplicas(n.dir); g > 0 {
			rg, _ := o.c.dir.NodeReferenced(n.dir)
			out[n.dir] = float64(rg) / float64(g)
		}
	}
	return out
}

// noteStoredLocked records blocks an engine stored, for lost KV reuse, and
// returns the pending hints for them. Call with mu held.
func (o *Orchestrator) noteStoredLocked(events []kv.Event) []protocol.Hint {
	var hints []protocol.Hint
	for _, e := range events {
		if e.Kind != kv.BlockStored {
			continue
		}
		if o.c.pendingHints.Len() > 0 {
			if p, ok := o.c.pendingHints.Get(e.Hash); ok {
				if o.c.branches.Refs(e.Hash) == 0 {
					hints = append(hints, protocol.Hint{Hash: e.Hash, Priority: p})
				} else {
					o.c.pendingHints.Delete(e.Hash) // referenced again
				}
			}
		}
		o.c.ever.Add(e.Hash)
	}
	return hints
}

// noteReferencedEvictionsLocked counts, after a node's events are applied,
// the copies of referenced blocks it evicted, and those that were the
// last copy anywhere. Call with mu held.
func (o *Orchestrator) noteReferencedEvictionsLocked(n *node, events []kv.Event) {
	var holders []kv.Replica
	for _, e := range events {
		if e.Kind != kv.BlockRemoved || o.c.branches.Refs(e.Hash) == 0 {
			continue
		}
		n.refEvicted[e.Tier&1]++
		if holders = o.c.dir.Holders(e.Hash, holders[:0]); len(holders) == 0 {
			n.refLost++
		}
	}
}
