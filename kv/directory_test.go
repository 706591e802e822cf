package kv

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"

	"testing"
)

// feeder numbers each node's events as an engine does.
type feeder struct {
	d   *Directory
	seq map[NodeID]uint64
}

func newFeeder() *feeder { return &feeder{d: NewDirectory(), seq: map[NodeID]uint64{}} }

func (f *feeder) node(t testing.TB, name string) NodeID {
	id, err := f.d.Node(name)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func (f *feeder) ev(t testing.TB, n NodeID, kind EventKind, tier Tier, hashes ...BlockHash) {
	t.Helper()
	for _, h := range hashes {
		f.seq[n]++
		if err := f.d.Apply(n, Event{Seq: f.seq[n], Kind: kind, Tier: tier, Hash: h}); err != nil {
			t.Fatal(err)
		}
	}
}

func span(chain []BlockHash, from, to int) []BlockHash { return chain[from:to] }

func TestDirectoryMatch(t *testing.T) {
	f := newFeeder()
	a, b, c, dn := f.node(t, "a"), f.node(t, "b"), f.node(t, "c"), f.node(t, "d")
	chain := ChainHashes(seqTokens(16*14, 1), 16)
	f.ev(t, a, BlockStored, TierGPU, span(chain, 0, 10)...)
	f.ev(t, b, BlockStored, TierHost, span(chain, 0, 5)...)
	f.ev(t, c, BlockStored, TierGPU, span(chain, 0, 3)...)
	f.ev(t, c, BlockStored, TierHost, span(chain, 3, 7)...)
	f.ev(t, dn, BlockStored, TierHost, span(chain, 10, 12)...)

	var m Match
	f.d.Match(chain, &m)
	want := map[NodeID]NodeMatch{a: {a, 10, 10}, b: {b, 0, 5}, c: {c, 3, 7}}
	if len(m.Nodes) != 3 {
		t.Fatalf("nodes %+v", m.Nodes)
	}
	for _, x := range m.Nodes {
		if want[x.Node] != x {
			t.Errorf("node %s: %+v, want %+v", f.d.NodeName(x.Node), x, want[x.Node])
		}
	}
	if got := m.For(dn); got.Local != 0 {
		t.Errorf("d holds no prefix, got %+v", got)
	}
	if m.Cluster != 12 {
		t.Fatalf("cluster prefix %d, want 12", m.Cluster)
	}
	wantSrc := []Source{{0, 5, b, TierHost}, {5, 7, c, TierHost}, {7, 10, a, TierGPU}, {10, 12, dn, TierHost}}
	if !slices.Equal(m.Sources, wantSrc) {
		t.Fatalf("sources %+v, want %+v", m.Sources, wantSrc)
	}

	// A removal shortens a's GPU prefix but not the cluster's.
	f.ev(t, a, BlockRemoved, TierGPU, chain[4])
	f.d.Match(chain, &m)
	if got := m.For(a); got.GPU != 4 || got.Local != 4 {
		t.Fatalf("a after removal: %+v", got)
	}
	if m.Cluster != 12 {
		t.Fatalf("cluster prefix %d after removal", m.Cluster)
	}
	if f.d.Replicas() != 10+5+3+4+2-1 {
		t.Fatalf("replicas %d", f.d.Replicas())
	}
	if g, h := f.d.NodeReplicas(c); g != 3 || h != 4 {
		t.Fatalf("c holds %d gpu %d host", g, h)
	}
}

func TestDirectoryGapAndResync(t *testing.T) {
	f := newFeeder()
	n := f.node(t, "n")
	chain := ChainHashes(seqTokens(16*6, 2), 16)
	f.ev(t, n, BlockStored, TierGPU, chain[:3]...)
	// A duplicate delivery is ignored.
	if err := f.d.Apply(n, Event{Seq: 2, Kind: BlockRemoved, Tier: TierGPU, Hash: chain[0]}); err != nil {
		t.Fatal(err)
	}
	// Event 5 after 3: a gap.
	err := f.d.Apply(n, Event{Seq: 5, Kind: BlockStored, Tier: TierGPU, Hash: chain[4]})
	if !errors.Is(err, ErrGap) || !f.d.NeedsResync(n) {
		t.Fatalf("gap not reported: %v", err)
	}
	if err := f.d.Apply(n, Event{Seq: 6, Kind: BlockStored, Tier: TierGPU, Hash: chain[5]}); err != nil || f.d.Replicas() != 3 {
		t.Fatalf("event during resync applied: %v, %d replicas", err, f.d.Replicas())
	}
	// The resync: a clear, then the node's blocks again.
	f.d.Apply(n, Event{Seq: 7, Kind: AllCleared})
	if f.d.Replicas() != 0 || f.d.NeedsResync(n) {
		t.Fatalf("after clear: %d replicas, resync %v", f.d.Replicas(), f.d.NeedsResync(n))
	}
	for i, h := range chain {
		if err := f.d.Apply(n, Event{Seq: 8 + uint64(i), Kind: BlockStored, Tier: TierHost, Hash: h}); err != nil {
			t.Fatal(err)
		}
	}
	var m Match
	f.d.Match(chain, &m)
	if got := m.For(n); got.Local != 6 || got.GPU != 0 {
		t.Fatalf("after resync: %+v", got)
	}
}

func TestDirectoryDropNode(t *testing.T) {
	f := newFeeder()
	a, b := f.node(t, "a"), f.node(t, "b")
	chain := ChainHashes(seqTokens(16*50, 3), 16)
	f.ev(t, a, BlockStored, TierGPU, chain...)
	f.ev(t, b, BlockStored, TierHost, chain[:20]...)
	if n := f.d.DropNode(a); n != 50 {
		t.Fatalf("dropped %d", n)
	}
	var m Match
	f.d.Match(chain, &m)
	if m.Cluster != 20 || len(m.Nodes) != 1 || m.Nodes[0].Node != b || f.d.Blocks() != 20 {
		t.Fatalf("after drop: %+v, %d blocks", m, f.d.Blocks())
	}

	// A new process in a's place numbers its events from 1 again: they
	// are its, not duplicates of the old one's.
	f.seq[a] = 0
	f.ev(t, a, BlockStored, TierGPU, chain[:30]...)
	f.d.Match(chain, &m)
	if got := m.For(a); got.GPU != 30 {
		t.Fatalf("a restarted and stored 30 blocks; the directory has %+v", got)
	}

	// The same process back after a drop (its heartbeats were late)
	// goes on from where it was: what it stored before the drop is gone
	// from the directory, so that is a gap, and it must resync.
	f.d.DropNode(b)
	err := f.d.Apply(b, Event{Seq: f.seq[b] + 1, Kind: BlockStored, Tier: TierHost, Hash: chain[20]})
	if !errors.Is(err, ErrGap) || !f.d.NeedsResync(b) {
		t.Fatalf("b's event %d after a drop: %v, resync %v; want a gap", f.seq[b]+1, err, f.d.NeedsResync(b))
	}
}

// naive is the obviously correct model the directory is checked against.
type naive map[BlockHash]map[Replica]bool

func (nv naive) match(chain []BlockHash, nodes int) (map[NodeID]NodeMatch, int) {
	out := map[NodeID]NodeMatch{}
	for n := 0; n < nodes; n++ {
		id := NodeID(n)
		g, l := 0, 0
		for l < len(chain) && (nv[chain[l]][MakeReplica(id, TierGPU)] || nv[chain[l]][MakeReplica(id, TierHost)]) {
			l++
		}
		for g < len(chain) && nv[chain[g]][MakeReplica(id, TierGPU)] {
			g++
		}
		if l > 0 {
			out[id] = NodeMatch{id, g, l}
		}
	}
	c := 0
	for c < len(chain) && len(nv[chain[c]]) > 0 {
		c++
	}
	return out, c
}

// Random stores and removals on many nodes, hot blocks with many copies
// (beyond the inline three), node drops: Match agrees with the naive model.
func TestDirectoryMatchesNaiveModel(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	const nodes = 12
	f := newFeeder()
	for i := 0; i < nodes; i++ {
		f.node(t, fmt.Sprint("n", i))
	}
	chains := make([][]BlockHash, 8)
	for i := range chains {
		chains[i] = ChainHashes(seqTokens(16*40, uint32(1000*i)), 16)
	}
	nv := naive{}
	refd := map[BlockHash]bool{} // what live branches reference, as the test has it
	f.d.SetReferencedSource(func(h BlockHash) bool { return refd[h] })
	var m Match
	crowded := 0 // checks that saw blocks with more copies than fit inline
	defer func() {
		if crowded == 0 {
			t.Error("no block ever had more than the inline replicas: the side map went untested")
		}
	}()
	for step := 0; step < 20000; step++ {
		n := NodeID(r.IntN(nodes))
		tier := Tier(r.IntN(2))
		ch := chains[r.IntN(len(chains))]
		// Mostly prefixes, as engines hold them; sometimes a stray block.
		k := r.IntN(len(ch))
		hs := ch[:k+1]
		if r.IntN(5) == 0 {
			hs = ch[k : k+1]
		}
		if r.IntN(4) == 0 {
			// A reference crosses zero on a random block, stored or not.
			h := ch[r.IntN(len(ch))]
			refd[h] = !refd[h]
			f.d.SetReferenced(h, refd[h])
		}
		switch op := r.IntN(20); {
		case op < 11:
			f.ev(t, n, BlockStored, tier, hs...)
			for _, h := range hs {
				if nv[h] == nil {
					nv[h] = map[Replica]bool{}
				}
				nv[h][MakeReplica(n, tier)] = true
			}
		case op < 19:
			tail := hs[len(hs)/2:]
			f.ev(t, n, BlockRemoved, tier, tail...)
			for _, h := range tail {
				delete(nv[h], MakeReplica(n, tier))
				if len(nv[h]) == 0 {
					delete(nv, h)
				}
			}
		default:
			f.d.DropNode(n)
			f.seq[n] = 0 // a new process in its place numbers its events from 1
			for h, set := range nv {
				delete(set, MakeReplica(n, TierGPU))
				delete(set, MakeReplica(n, TierHost))
				if len(set) == 0 {
					delete(nv, h)
				}
			}
		}
		if step%50 != 0 {
			continue
		}
		total := 0
		for _, set := range nv {
			total += len(set)
			if len(set) > inlineReplicas {
				crowded++
			}
		}
		if f.d.Replicas() != total || f.d.Blocks() != len(nv) {
			t.Fatalf("step %d: %d replicas %d blocks, naive %d %d", step, f.d.Replicas(), f.d.Blocks(), total, len(nv))
		}
		var wantRef [nodes][2]int
		for h, set := range nv {
			if refd[h] {
				for rep := range set {
					wantRef[rep.Node()][rep.Tier()]++
				}
			}
		}
		for n := 0; n < nodes; n++ {
			if g, hst := f.d.NodeReferenced(NodeID(n)); g != wantRef[n][TierGPU] || hst != wantRef[n][TierHost] {
				t.Fatalf("step %d: node %d holds %d/%d referenced copies (GPU/host), naive %v", step, n, g, hst, wantRef[n])
			}
		}
		for h, set := range nv {
			got := f.d.Holders(h, nil)
			if len(got) != len(set) {
				t.Fatalf("step %d: block %x has holders %v, naive %v", step, h, got, set)
			}
			for _, rep := range got {
				if !set[rep] {
					t.Fatalf("step %d: block %x has holders %v, naive %v", step, h, got, set)
				}
			}
		}
		for _, ch := range chains {
			var wantRes, gotRes [nodes][2]int
			for _, h := range ch {
				for rep := range nv[h] {
					wantRes[rep.Node()][rep.Tier()]++
				}
			}
			for _, c := range f.d.Residency(ch) {
				gotRes[c.Node] = [2]int{c.GPU, c.Host}
			}
			if gotRes != wantRes {
				t.Fatalf("step %d: residency %v, naive %v", step, gotRes, wantRes)
			}
			f.d.Match(ch, &m)
			want, cluster := nv.match(ch, nodes)
			if m.Cluster != cluster || len(m.Nodes) != len(want) {
				t.Fatalf("step %d: cluster %d nodes %d; naive %d %d", step, m.Cluster, len(m.Nodes), cluster, len(want))
			}
			for _, x := range m.Nodes {
				if want[x.Node] != x {
					t.Fatalf("step %d: node %d %+v, naive %+v", step, x.Node, x, want[x.Node])
				}
			}
			// Sources cover [0, Cluster) with holders that really hold.
			next := 0
			for _, s := range m.Sources {
				if s.From != next || s.To <= s.From {
					t.Fatalf("step %d: sources not contiguous: %+v", step, m.Sources)
				}
				for i := s.From; i < s.To; i++ {
					if !nv[ch[i]][MakeReplica(s.Node, s.Tier)] {
						t.Fatalf("step %d: source %+v does not hold block %d", step, s, i)
					}
				}
				next = s.To
			}
			if next != m.Cluster {
				t.Fatalf("step %d: sources end at %d, cluster %d", step, next, m.Cluster)
			}
		}
	}
}

func TestDirectoryNodeLimit(t *testing.T) {
	d := NewDirectory()
	for i := 0; i < MaxNodes; i++ {
		if _, err := d.Node(fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := d.Node("one too many"); err == nil {
		t.Fatal("node limit not enforced")
	}
	if id, err := d.Node("7"); err != nil || id != 7 {
		t.Fatalf("known node: %d %v", id, err)
	}
}

// A resumed answer's pulls come from nodes that did not fail it: where
// the directory still lists the failed node's copies, and Match names it
// the holder (its host copies are preferred), SourcesWithout finds a live
// holder of the same blocks instead, and the chain counts as held only as
// far as live nodes hold it.
func TestDirectorySourcesWithout(t *testing.T) {
	f := newFeeder()
	toks := make([]uint32, 20*16)
	for i := range toks {
		toks[i] = uint32(i)
	}
	chain := ChainHashes(toks, 16)
	holds := func(name string, from, to int, tier Tier) NodeID {
		n := f.node(t, name)
		f.ev(t, n, BlockStored, tier, chain[from:to]...)
		return n
	}
	holds("to", 0, 5, TierGPU)
	p := holds("p", 0, 15, TierGPU)
	q := holds("q", 12, 18, TierHost)
	dead := holds("dead", 0, 20, TierHost)
	var m Match
	f.d.Match(chain, &m)
	if m.Cluster != 20 || len(m.Sources) != 1 || m.Sources[0].Node != dead {
		t.Fatalf("Match: %+v; the test wants it to name the failed node", m)
	}
	cluster, src := f.d.SourcesWithout(chain, 5, func(n NodeID) bool { return n == dead }, nil)
	// p keeps its run while it has the blocks, as in Match; q goes on.
	want := []Source{{From: 5, To: 15, Node: p, Tier: TierGPU}, {From: 15, To: 18, Node: q, Tier: TierHost}}
	if cluster != 18 || !slices.Equal(src, want) {
		t.Fatalf("live sources: held to %d, %+v; want 18, %+v", cluster, src, want)
	}
	// Nothing skipped: the failed node's host copies, as Match has them.
	cluster, src = f.d.SourcesWithout(chain, 5, func(NodeID) bool { return false }, nil)
	if cluster != 20 || !slices.Equal(src, []Source{{From: 5, To: 20, Node: dead, Tier: TierHost}}) {
		t.Fatalf("sources with none skipped: %d, %+v", cluster, src)
	}
}
