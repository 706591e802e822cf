package kv

import (
	"errors"
	"fmt"
)

// NodeID is a node's number in a Directory, from 0 in the order names were
// first seen.
type NodeID uint16

// MaxNodes is the most nodes a Directory tells apart.
const MaxNodes = 1 << 15

// Replica is one copy of a block: a node and a tier, packed.
type Replica uint16

// MakeReplica packs a node and a tier.
func MakeReplica(n NodeID, t Tier) Replica { return Replica(n)<<1 | Replica(t&1) }

// Node is the replica's node.
func (r Replica) Node() NodeID { return NodeID(r >> 1) }

// Tier is the replica's tier.
func (r Replica) Tier() Tier { return Tier(r & 1) }

// dirEntry is a block's arena entry; an entry without replicas is free.
type dirEntry struct {
	hash BlockHash
	rs   replicaSet
}

// replicaSet holds up to inlineReplicas copies inline. A block with more
// copies keeps all of them in Directory.extraSlab, and the inline space
// holds that slab's index instead, so no lookup is needed to find them.
type replicaSet struct {
	reps  [inlineReplicas]Replica
	n     uint8 // copies inline; inlineReplicas when the copies are in the slab
	flags uint8
}

const (
	flagMore       = 1 << iota // the copies live in Directory.extraSlab[slab()]
	flagReferenced             // a live agent branch references the block (see SetReferenced)
)

func (s *replicaSet) more() bool       { return s.flags&flagMore != 0 }
func (s *replicaSet) referenced() bool { return s.flags&flagReferenced != 0 }

// slab is the extraSlab index of a set whose copies live there.
func (s *replicaSet) slab() int32 { return int32(s.reps[0]) | int32(s.reps[1])<<16 }

func (s *replicaSet) setSlab(i int32) { s.reps[0], s.reps[1] = Replica(i), Replica(i>>16) }

const inlineReplicas = 3

// touchBatch is how many blocks ahead Match fetches table slots.
const touchBatch = 64

// ErrGap reports a hole in a node's event sequence: the directory no longer
// knows that node's blocks and ignores its events until a resync (an
// AllBlocksCleared event) starts over.
var ErrGap = errors.New("KV event sequence gap")

// Directory knows, for every KV block, which nodes hold a copy and in which
// tier. It is fed by the engines' KV events, in order per node, and answers
// the router's question: for this chain of blocks, how much does each node
// hold, and where does the rest live? It is pure (no clock, no I/O) and not
// safe for concurrent use.
//
// Layout: each block has a 16-byte entry (hash and up to three replicas
// inline; more go to a side map) in an arena, and an open-addressing index
// from hash to arena position. A block is placed right after its parent
// when that place is free, so a chain stored in one go lies contiguous and
// Match reads it sequentially instead of one random slot per block.
type Directory struct {
	t         Table[int32] // hash -> arena position
	arena     []dirEntry
	free      []int32     // free arena positions
	extraSlab [][]Replica // the copies of blocks with more than inline ones
	extraFree []int32
	nodes     []nodeState
	names     map[string]NodeID
	replicas  int
	lastQuery int32 // arena position last located by a query (see locate)
	refSource func(BlockHash) bool

	sink         BlockHash // keeps Match's prefetching reads alive
	indexLookups uint64    // Match's index lookups (the rest were sequential), for benchmarks

	// Match scratch, indexed by NodeID.
	gpuLen, localLen []int32
	touched          []NodeID
}

type nodeState struct {
	name       string
	lastSeq    uint64
	resync     bool   // a gap was seen: ignore events until AllBlocksCleared
	copies     [2]int // replicas held, per tier
	referenced [2]int // of those, of blocks marked referenced
	everEvents bool
	// Arena positions last located by this node's events, per tier, for
	// stores and for removals (see locate).
	cursors [2][2]int32
}

// NewDirectory returns an empty directory.
func NewDirectory() *Directory {
	return &Directory{names: map[string]NodeID{}}
}

// Node returns the id of the named node, adding it if new.
func (d *Directory) Node(name string) (NodeID, error) {
	if id, ok := d.names[name]; ok {
		return id, nil
	}
	if len(d.nodes) >= MaxNodes {
		return 0, fmt.Errorf("directory: more than %d nodes", MaxNodes)
	}
	id := NodeID(len(d.nodes))
	d.nodes = append(d.nodes, nodeState{name: name})
	d.names[name] = id
	d.gpuLen = append(d.gpuLen, 0)
	d.localLen = append(d.localLen, 0)
	return id, nil
}

// NodeName returns the name of a node id.
func (d *Directory) NodeName(n NodeID) string { return d.nodes[n].name }

// Replicas is the number of block copies indexed.
func (d *Directory) Replicas() int { return d.replicas }

// Blocks is the number of distinct blocks indexed.
func (d *Directory) Blocks() int { return d.t.Len() }

// Has reports whether some node holds a copy of h.
func (d *Directory) Has(h BlockHash) bool { return d.entry(h) != nil }

// entry returns the arena entry of h, or nil.
func (d *Directory) entry(h BlockHash) *replicaSet {
	pos, ok := d.locate(h, &d.lastQuery)
	if !ok {
		return nil
	}
	return &d.arena[pos].rs
}

// locate returns h's arena position. Events of one kind and tier come in
// chain order (a chain stored parent first, evicted deepest first) and a
// chain lies contiguous, so the entries beside the last one that cursor
// located are tried before the index.
func (d *Directory) locate(h BlockHash, cursor *int32) (int32, bool) {
	last := *cursor
	for _, p := range [...]int32{last + 1, last - 1, last} {
		if p >= 0 && int(p) < len(d.arena) && d.arena[p].hash == h && d.arena[p].rs.n > 0 {
			*cursor = p
			return p, true
		}
	}
	p, ok := d.t.Get(h)
	if ok {
		*cursor = p
	}
	return p, ok
}

// place finds an arena position for a new block whose parent is parent:
// right after the parent when free, else at the end while the arena is not
// much larger than what it holds, else a freed position.
func (d *Directory) place(parent BlockHash, cursor *int32) int32 {
	if parent != 0 {
		if pp, ok := d.locate(parent, cursor); ok {
			if next := int(pp) + 1; next < len(d.arena) && d.arena[next].rs.n == 0 && d.takeFree(int32(next)) {
				return int32(next)
			}
		}
	}
	if n := len(d.free); n == 0 || len(d.arena) < 2*d.t.Len()+1024 {
		grows := len(d.arena) == cap(d.arena)
		d.arena = append(d.arena, dirEntry{})
		if grows {
			AdviseHugePages(d.arena[:cap(d.arena)])
		}
		return int32(len(d.arena) - 1)
	}
	pos := d.free[len(d.free)-1]
	d.free = d.free[:len(d.free)-1]
	return pos
}

// takeFree removes pos from the free list if it is there (a position just
// past the arena's end-appends is free without being listed).
func (d *Directory) takeFree(pos int32) bool {
	for i := len(d.free) - 1; i >= 0 && i >= len(d.free)-64; i-- {
		if d.free[i] == pos {
			d.free[i] = d.free[len(d.free)-1]
			d.free = d.free[:len(d.free)-1]
			return true
		}
	}
	return false
}

// NodeReplicas returns how many copies node n holds in each tier.
func (d *Directory) NodeReplicas(n NodeID) (gpu, host int) {
	return d.nodes[n].copies[TierGPU], d.nodes[n].copies[TierHost]
}

// NeedsResync reports whether node n's events had a gap and the directory
// waits for its resync.
func (d *Directory) NeedsResync(n NodeID) bool { return d.nodes[n].resync }

// LastSeq is the sequence of the last event applied from node n.
func (d *Directory) LastSeq(n NodeID) uint64 { return d.nodes[n].lastSeq }

// ApplyBatch applies a node's consecutive events; see Apply.
func (d *Directory) ApplyBatch(n NodeID, events []Event) error {
	var first error
	for i := range events {
		if err := d.Apply(n, events[i]); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Apply applies one of node n's events. Events must come in sequence order
// (from 1, without gaps); an event whose sequence is already applied is
// ignored (a duplicate delivery). On a gap Apply returns ErrGap, marks the
// node for resync and ignores its events until an AllBlocksCleared event,
// which clears the node's copies and starts its sequence over from there.
func (d *Directory) Apply(n NodeID, e Event) error {
	st := &d.nodes[n]
	if e.Kind == AllCleared {
		d.clearNode(n)
		st.lastSeq, st.resync, st.everEvents = e.Seq, false, true
		return nil
	}
	if st.resync {
		return nil
	}
	if st.everEvents || e.Seq != 1 {
		if e.Seq <= st.lastSeq {
			return nil
		}
		if e.Seq != st.lastSeq+1 {
			st.resync = true
			return fmt.Errorf("%w on node %s: event %d after %d", ErrGap, st.name, e.Seq, st.lastSeq)
		}
	}
	st.lastSeq, st.everEvents = e.Seq, true
	r := MakeReplica(n, e.Tier)
	switch e.Kind {
	case BlockStored:
		d.add(e.Hash, e.Parent, r)
	case BlockRemoved:
		d.remove(e.Hash, r)
	default:
		return fmt.Errorf("directory: unknown event kind %d from node %s", e.Kind, st.name)
	}
	return nil
}

// copies returns every copy of a block (valid until the next change).
func (d *Directory) copies(s *replicaSet) []Replica {
	if s.more() {
		return d.extraSlab[s.slab()]
	}
	return s.reps[:s.n]
}

// toSlab moves a full inline set and one more copy to a slab.
func (d *Directory) toSlab(s *replicaSet, r Replica) {
	var i int32
	if n := len(d.extraFree); n > 0 {
		i = d.extraFree[n-1]
		d.extraFree = d.extraFree[:n-1]
	} else {
		i = int32(len(d.extraSlab))
		d.extraSlab = append(d.extraSlab, nil)
	}
	d.extraSlab[i] = append(append(d.extraSlab[i][:0], s.reps[:s.n]...), r)
	s.setSlab(i)
	s.flags |= flagMore
}

// fromSlab moves a slab's copies back inline once they fit.
func (d *Directory) fromSlab(s *replicaSet) {
	i := s.slab()
	ex := d.extraSlab[i]
	s.flags &^= flagMore
	s.n = uint8(copy(s.reps[:], ex))
	d.extraSlab[i] = ex[:0]
	d.extraFree = append(d.extraFree, i)
}

func (d *Directory) count(s *replicaSet, r Replica, delta int) {
	st := &d.nodes[r.Node()]
	st.copies[r.Tier()&1] += delta
	if s.referenced() {
		st.referenced[r.Tier()&1] += delta
	}
	d.replicas += delta
}

// SetReferencedSource gives the directory the predicate of references:
// whether a live agent branch references a block. A block entering the
// directory is marked by it; after that, SetReferenced keeps the mark.
func (d *Directory) SetReferencedSource(referenced func(BlockHash) bool) { d.refSource = referenced }

// SetReferenced marks block h referenced or not (call it for the blocks
// whose references crossed zero: kv.Branches.Changes), so that each
// node's count of referenced copies (NodeReferenced) stays current at a
// cost proportional to the changes, not to what is referenced.
func (d *Directory) SetReferenced(h BlockHash, on bool) {
	pos, ok := d.locate(h, &d.lastQuery)
	if !ok {
		return // not stored anywhere yet: marked when it is
	}
	s := &d.arena[pos].rs
	if s.referenced() == on {
		return
	}
	delta := 1
	if on {
		s.flags |= flagReferenced
	} else {
		s.flags &^= flagReferenced
		delta = -1
	}
	for _, r := range d.copies(s) {
		d.nodes[r.Node()].referenced[r.Tier()&1] += delta
	}
}

// NodeReferenced returns how many of node n's copies, per tier, are of
// blocks marked referenced.
func (d *Directory) NodeReferenced(n NodeID) (gpu, host int) {
	st := &d.nodes[n]
	return st.referenced[TierGPU], st.referenced[TierHost]
}

func (d *Directory) add(h, parent BlockHash, r Replica) {
	cursor := &d.nodes[r.Node()].cursors[r.Tier()][0]
	var s *replicaSet
	if pos, ok := d.locate(h, cursor); ok {
		s = &d.arena[pos].rs
	} else {
		pos := d.place(parent, cursor)
		d.arena[pos] = dirEntry{hash: h}
		d.t.Put(h, pos)
		*cursor = pos
		s = &d.arena[pos].rs
		if d.refSource != nil && d.refSource(h) {
			s.flags |= flagReferenced
		}
	}
	for _, x := range d.copies(s) {
		if x == r {
			return
		}
	}
	d.count(s, r, 1)
	switch {
	case s.more():
		d.extraSlab[s.slab()] = append(d.extraSlab[s.slab()], r)
	case int(s.n) < inlineReplicas:
		s.reps[s.n] = r
		s.n++
	default:
		d.toSlab(s, r)
	}
}

func (d *Directory) remove(h BlockHash, r Replica) {
	pos, ok := d.locate(h, &d.nodes[r.Node()].cursors[r.Tier()][1])
	if !ok {
		return
	}
	s := &d.arena[pos].rs
	if s.more() {
		i := s.slab()
		ex := d.extraSlab[i]
		for k, x := range ex {
			if x == r {
				d.count(s, r, -1)
				ex[k] = ex[len(ex)-1]
				d.extraSlab[i] = ex[:len(ex)-1]
				if len(ex)-1 <= inlineReplicas {
					d.fromSlab(s)
				}
				return
			}
		}
		return
	}
	for i := 0; i < int(s.n); i++ {
		if s.reps[i] != r {
			continue
		}
		d.count(s, r, -1)
		s.n--
		s.reps[i] = s.reps[s.n]
		if s.n == 0 {
			d.t.Delete(h)
			d.arena[pos] = dirEntry{}
			d.free = append(d.free, pos)
		}
		return
	}
}

// Holders appends to out the copies of block h (node and tier) and
// returns it.
func (d *Directory) Holders(h BlockHash, out []Replica) []Replica {
	s := d.entry(h)
	if s == nil {
		return out
	}
	return append(out, d.copies(s)...)
}

// NodeCopies is how many blocks of a chain one node holds per tier.
type NodeCopies struct {
	Node      NodeID
	GPU, Host int
}

// Residency counts, per node holding any, the blocks of chain it holds on
// GPU and on host, in node id order.
func (d *Directory) Residency(chain []BlockHash) []NodeCopies {
	per := make([][2]int, len(d.nodes))
	var holders []Replica
	for _, h := range chain {
		holders = d.Holders(h, holders[:0])
		for _, r := range holders {
			per[r.Node()][r.Tier()&1]++
		}
	}
	var out []NodeCopies
	for n, c := range per {
		if c != [2]int{} {
			out = append(out, NodeCopies{Node: NodeID(n), GPU: c[TierGPU], Host: c[TierHost]})
		}
	}
	return out
}

// DropNode removes every copy node n holds (the node went down, or is
// resyncing) and reports how many there were. The node keeps its id, and
// its events start over: a new process in its place numbers them from 1,
// and the node, should it come back with more of its old ones, has a gap
// (what it stored before is gone from here) and must resync.
func (d *Directory) DropNode(n NodeID) int {
	before := d.replicas
	d.clearNode(n)
	st := &d.nodes[n]
	st.lastSeq, st.resync, st.everEvents = 0, false, false
	return before - d.replicas
}

func (d *Directory) clearNode(n NodeID) {
	st := &d.nodes[n]
	if st.copies == [2]int{} {
		return
	}
	var gone []BlockHash
	var drop []Replica
	for i := range d.arena {
		h, s := d.arena[i].hash, &d.arena[i].rs
		if s.n == 0 {
			continue
		}
		drop = drop[:0]
		for _, r := range d.copies(s) {
			if r.Node() == n {
				drop = append(drop, r)
			}
		}
		if len(drop) > 0 {
			gone = append(gone, h, BlockHash(len(drop)))
			for _, r := range drop {
				gone = append(gone, BlockHash(r))
			}
		}
	}
	// Remove after the scan: removal frees entries.
	for i := 0; i < len(gone); {
		h, k := gone[i], int(gone[i+1])
		for _, r := range gone[i+2 : i+2+k] {
			d.remove(h, Replica(r))
		}
		i += 2 + k
	}
}

// NodeMatch is how much of a chain one node holds.
type NodeMatch struct {
	Node  NodeID
	GPU   int // leading blocks on the node's GPU
	Local int // leading blocks on the node, GPU or host
}

// Source is a run of a chain's blocks that one node can serve from one
// tier: blocks [From, To).
type Source struct {
	From, To int
	Node     NodeID
	Tier     Tier
}

// Match is the answer for one chain. Reuse it across calls to avoid
// allocating.
type Match struct {
	Nodes   []NodeMatch // every node holding at least the first block
	Cluster int         // leading blocks held somewhere in the cluster
	Sources []Source    // a holder for every block in [0, Cluster), host copies preferred
}

// For returns node n's match (zero if it holds no prefix).
func (m *Match) For(n NodeID) NodeMatch {
	for _, x := range m.Nodes {
		if x.Node == n {
			return x
		}
	}
	return NodeMatch{Node: n}
}

// Match fills m for chain: per node the prefix it holds on GPU and locally,
// the prefix held anywhere, and where each block of that prefix can be
// fetched from. Work is proportional to the blocks of the cluster-wide
// prefix times their copies.
func (d *Directory) Match(chain []BlockHash, m *Match) {
	m.Nodes, m.Sources, m.Cluster = m.Nodes[:0], m.Sources[:0], 0
	d.touched = d.touched[:0]
	pos, touched := int32(-1), 0
	cluster, curFrom, haveCur := 0, 0, false
	var cur Replica
	for i, h := range chain {
		// A chain stored in one go lies contiguous in the arena: try the
		// entry after the previous block's before asking the index.
		if next := int(pos) + 1; pos >= 0 && next < len(d.arena) && d.arena[next].hash == h && d.arena[next].rs.n > 0 {
			pos++
		} else {
			d.indexLookups++
			if i > 0 && i >= touched {
				// The layout broke: fetch the next batch's index slots in
				// parallel, as the walk is now bound by memory latency.
				touched = min(i+touchBatch, len(chain))
				d.sink ^= d.t.Prefetch(chain[i:touched])
			}
			p, ok := d.t.Get(h)
			if !ok {
				break
			}
			pos = p
		}
		reps := d.copies(&d.arena[pos].rs)
		src, keep := reps[0], false
		for _, r := range reps {
			n := r.Node()
			if d.localLen[n] == int32(i) {
				if i == 0 {
					d.touched = append(d.touched, n)
				}
				d.localLen[n]++
			}
			if r.Tier() == TierGPU && d.gpuLen[n] == int32(i) {
				d.gpuLen[n]++
			}
			if r == cur {
				keep = true
			}
			if r.Tier() == TierHost && src.Tier() != TierHost {
				src = r
			}
		}
		cluster = i + 1
		// Keep the current run's holder while it has the blocks.
		if haveCur && keep {
			continue
		}
		if haveCur {
			m.Sources = append(m.Sources, Source{From: curFrom, To: i, Node: cur.Node(), Tier: cur.Tier()})
		}
		cur, curFrom, haveCur = src, i, true
	}
	if haveCur {
		m.Sources = append(m.Sources, Source{From: curFrom, To: cluster, Node: cur.Node(), Tier: cur.Tier()})
	}
	m.Cluster = cluster
	for _, n := range d.touched {
		m.Nodes = append(m.Nodes, NodeMatch{Node: n, GPU: int(d.gpuLen[n]), Local: int(d.localLen[n])})
		d.gpuLen[n], d.localLen[n] = 0, 0
	}
}

// SourcesWithout is Match's Sources for chain from block from on, as if
// the nodes skip names held nothing: a holder for every block while some
// other node holds it, a run keeping its holder while it has the blocks
// and host copies preferred, as Match picks them. It returns how far the
// chain is held so (from if block from is not) and the runs, appended to
// out. Match names a node that has failed but whose copies the directory
// still lists (until its heartbeats stop); this walks the blocks one by
// one through the index, for such rare cases only.
func (d *Directory) SourcesWithout(chain []BlockHash, from int, skip func(NodeID) bool, out []Source) (int, []Source) {
	var cur Replica
	have := false
	i := from
	for ; i < len(chain); i++ {
		s := d.entry(chain[i])
		if s == nil {
			break
		}
		pick, found, keep := Replica(0), false, false
		for _, r := range d.copies(s) {
			if skip(r.Node()) {
				continue
			}
			if have && r == cur {
				keep = true
			}
			if !found || r.Tier() == TierHost && pick.Tier() != TierHost {
				pick, found = r, true
			}
		}
		if !found {
			break
		}
		if keep {
			out[len(out)-1].To = i + 1
			continue
		}
		out = append(out, Source{From: i, To: i + 1, Node: pick.Node(), Tier: pick.Tier()})
		cur, have = pick, true
	}
	return i, out
}
