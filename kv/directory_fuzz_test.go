package kv

import (
	"slices"
	"testing"
)

// FuzzDirectoryFollowsEvents applies arbitrary event streams from three
// nodes, with duplicates, gaps, resyncs and dropped nodes, and checks the
// directory against a plain model of which node holds which block in
// which tier: every block's holders, every node's counts, and that a match
// never claims a block nobody holds.
func FuzzDirectoryFollowsEvents(f *testing.F) {
	f.Add([]byte{0x00, 0x11, 0x22, 0x40, 0x13, 0x81, 0x02, 0xc0})
	f.Add([]byte{0x00, 0x01, 0x02, 0x03, 0x60, 0x04, 0xa0, 0x05, 0x10, 0xe1})
	f.Fuzz(func(t *testing.T, ops []byte) {
		const nodes, universe = 3, 8
		d := NewDirectory()
		ids := make([]NodeID, nodes)
		for i := range ids {
			var err error
			if ids[i], err = d.Node(string(rune('a' + i))); err != nil {
				t.Fatal(err)
			}
		}
		hash := func(i int) BlockHash { return BlockHash(0x9e3779b97f4a7c15 * uint64(i+1)) }
		type copyKey struct {
			n    int
			tier Tier
		}
		held := map[BlockHash]map[copyKey]bool{}
		seq := make([]uint64, nodes)
		resync := make([]bool, nodes)
		for i, op := range ops {
			n := int(op>>6) % nodes
			h := hash(int(op) % universe)
			tier := Tier(op>>3) & 1
			ev := Event{Seq: seq[n] + 1, Tier: tier, Hash: h, Depth: int32(int(op) % universe)}
			if ev.Depth > 0 {
				ev.Parent = hash(int(ev.Depth) - 1)
			}
			switch (op >> 4) & 3 {
			case 0, 1:
				ev.Kind = BlockStored
				if i%7 == 3 {
					ev.Kind = BlockRemoved
				}
			case 2:
				ev.Kind = AllCleared
			case 3:
				switch i % 3 {
				case 0: // a lost event: a gap, then nothing until a resync
					ev.Seq, ev.Kind = seq[n]+2, BlockStored
				case 1: // a duplicate delivery
					ev.Seq, ev.Kind = max(seq[n], 1), BlockStored
				case 2: // the node went down: its next process numbers
					// its events from 1 again, in step from the start
					d.DropNode(ids[n])
					seq[n], resync[n] = 0, false
					for _, cs := range held {
						delete(cs, copyKey{n, TierGPU})
						delete(cs, copyKey{n, TierHost})
					}
					continue
				}
			}
			d.Apply(ids[n], ev)
			switch {
			case ev.Kind == AllCleared:
				seq[n], resync[n] = ev.Seq, false
				for _, cs := range held {
					delete(cs, copyKey{n, TierGPU})
					delete(cs, copyKey{n, TierHost})
				}
			case resync[n] || ev.Seq <= seq[n] && seq[n] > 0:
			case ev.Seq != seq[n]+1:
				resync[n] = true
			default:
				seq[n] = ev.Seq
				if held[h] == nil {
					held[h] = map[copyKey]bool{}
				}
				if ev.Kind == BlockStored {
					held[h][copyKey{n, tier}] = true
				} else {
					delete(held[h], copyKey{n, tier})
				}
			}
			if got := d.NeedsResync(ids[n]); got != resync[n] {
				t.Fatalf("op %d: node %d needs resync %v, want %v", i, n, got, resync[n])
			}
		}
		counts := make([][2]int, nodes)
		total := 0
		var chain []BlockHash
		for b := range universe {
			h := hash(b)
			chain = append(chain, h)
			var want, got []Replica
			for k := range held[h] {
				want = append(want, MakeReplica(ids[k.n], k.tier))
				counts[k.n][k.tier]++
				total++
			}
			got = d.Holders(h, got)
			slices.Sort(want)
			slices.Sort(got)
			if !slices.Equal(got, want) {
				t.Fatalf("block %d: holders %v, want %v", b, got, want)
			}
		}
		for n := range nodes {
			if g, h := d.NodeReplicas(ids[n]); g != counts[n][TierGPU] || h != counts[n][TierHost] {
				t.Fatalf("node %d counts %d GPU, %d host; want %v", n, g, h, counts[n])
			}
		}
		if d.Replicas() != total {
			t.Fatalf("%d copies in all, want %d", d.Replicas(), total)
		}
		var m Match
		d.Match(chain, &m)
		for i := range m.Cluster {
			if len(held[chain[i]]) == 0 {
				t.Fatalf("match claims block %d of %d, which no node holds", i, m.Cluster)
			}
		}
	})
}
