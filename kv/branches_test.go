package kv

import (
	"fmt"
	"testing"
	"time"
)

var bt0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// chainOf makes a chain of n blocks from a seed: chains from the same seed
// share their prefix, chains from different seeds share nothing.
func chainOf(seed uint64, n int) []BlockHash {
	out := make([]BlockHash, n)
	for i := range out {
		out[i] = BlockHash(seed<<32 | uint64(i+1))
	}
	return out
}

// grow returns c extended by n blocks of another seed (a new turn).
func grow(c []BlockHash, seed uint64, n int) []BlockHash {
	return append(append([]BlockHash(nil), c...), chainOf(seed, n)...)
}

func refsOf(b *Branches, c []BlockHash) []int {
	out := make([]int, len(c))
	for i, h := range c {
		out[i] = b.Refs(h)
	}
	return out
}

func TestBranchesExplicitIdentity(t *testing.T) {
	b := NewBranches(time.Minute)
	sys := chainOf(1, 4)
	main1 := grow(sys, 2, 3)
	turn := b.Begin(bt0, Identity{Session: "s", Branch: "main"}, main1)
	if turn.Kind != TurnNew || turn.Added != 7 || b.Live() != 1 {
		t.Fatalf("first turn %+v, live %d", turn, b.Live())
	}
	b.Finish(bt0.Add(time.Second), "s", "main")
	// The next turn extends the context: only the new blocks are added.
	main2 := grow(main1, 3, 2)
	if turn = b.Begin(bt0.Add(2*time.Second), Identity{Session: "s", Branch: "main"}, main2); turn.Kind != TurnContinue || turn.Added != 2 {
		t.Fatalf("continue %+v", turn)
	}
	b.Finish(bt0.Add(3*time.Second), "s", "main")
	// A sub-agent forks from the system prompt: main lives on, the shared
	// blocks are referenced twice.
	sub := grow(sys, 4, 2)
	if turn = b.Begin(bt0.Add(4*time.Second), Identity{Session: "s", Branch: "sub1", Parent: "main"}, sub); turn.Kind != TurnFork || turn.Parent != "main" {
		t.Fatalf("fork %+v", turn)
	}
	if got := refsOf(b, sys); got[0] != 2 || got[3] != 2 || b.Refs(main2[8]) != 1 || b.Live() != 2 {
		t.Fatalf("refs of the shared prefix %v, of main's tail %d, live %d", got, b.Refs(main2[8]), b.Live())
	}
	b.Finish(bt0.Add(5*time.Second), "s", "sub1")
	b.End("s", "sub1")
	if b.Refs(sys[0]) != 1 || b.Refs(sub[5]) != 0 || b.Live() != 1 {
		t.Fatalf("after the sub-agent ended: sys %d, sub tail %d, live %d", b.Refs(sys[0]), b.Refs(sub[5]), b.Live())
	}
	// Compaction: a rewrite branch replaces main; main's whole context
	// past the shared system prompt is dead at once.
	compact := grow(sys, 5, 1)
	turn = b.Begin(bt0.Add(6*time.Second), Identity{Session: "s", Branch: "main.c1", Parent: "main", Rewrite: true}, compact)
	if turn.Kind != TurnRewrite || turn.Dropped != 9 {
		t.Fatalf("rewrite %+v", turn)
	}
	if b.Refs(main2[5]) != 0 || b.Refs(sys[0]) != 1 || b.Refs(compact[4]) != 1 || b.Live() != 1 {
		t.Fatalf("after compaction: old tail %d, sys %d, summary %d, live %d", b.Refs(main2[5]), b.Refs(sys[0]), b.Refs(compact[4]), b.Live())
	}
	// Ending the session drops everything.
	if n := b.End("s", ""); n != 1 || b.Refs(sys[0]) != 0 || b.Live() != 0 {
		t.Fatalf("session end: %d branches, sys refs %d", n, b.Refs(sys[0]))
	}
}

// The same branch sending a context that diverges before its end: the old
// tail is dead (a rewritten window), the shared part stays referenced.
func TestBranchesRewriteInPlace(t *testing.T) {
	b := NewBranches(time.Minute)
	c1 := grow(chainOf(1, 5), 2, 5)
	b.Begin(bt0, Identity{Session: "s", Branch: "w"}, c1)
	b.Finish(bt0, "s", "w")
	b.Changes()
	c2 := grow(chainOf(1, 5), 3, 2)
	turn := b.Begin(bt0, Identity{Session: "s", Branch: "w"}, c2)
	if turn.Kind != TurnRewrite || turn.Dropped != 5 || turn.Added != 2 {
		t.Fatalf("turn %+v", turn)
	}
	if b.Refs(c1[7]) != 0 || b.Refs(c1[2]) != 1 || b.Refs(c2[6]) != 1 {
		t.Fatalf("refs %v / %v", refsOf(b, c1), refsOf(b, c2))
	}
	// Changes names the blocks whose count crossed zero: five dropped, two added.
	if ch := b.Changes(); len(ch) != 7 {
		t.Fatalf("changes %d, want 7", len(ch))
	}
}

// A rewrite into a new branch (a compaction, a computer-use window that
// drops its oldest screenshot) keeps the prefix it shares with its parent
// referenced throughout: Changes names the parent's dead tail and the new
// blocks only, so engines are not re-hinted the whole kept prefix.
func TestBranchesRewriteNewBranchChanges(t *testing.T) {
	b := NewBranches(time.Minute)
	kept := chainOf(1, 6)
	old := grow(kept, 2, 4)
	b.Begin(bt0, Identity{Session: "s", Branch: "w1"}, old)
	b.Finish(bt0, "s", "w1")
	b.Changes()
	next := grow(kept, 3, 3)
	turn := b.Begin(bt0.Add(time.Second), Identity{Session: "s", Branch: "w2", Parent: "w1", Rewrite: true}, next)
	if turn.Kind != TurnRewrite || turn.Dropped != 10 || turn.Added != 9 {
		t.Fatalf("turn %+v", turn)
	}
	want := map[BlockHash]bool{}
	for _, h := range old[6:] {
		want[h] = true
	}
	for _, h := range next[6:] {
		want[h] = true
	}
	ch := b.Changes()
	got := map[BlockHash]bool{}
	for _, h := range ch {
		got[h] = true
	}
	if len(ch) != len(want) || len(got) != len(want) {
		t.Fatalf("changes %v, want the 4 dead and 3 new blocks once each", ch)
	}
	for h := range want {
		t.Run(fmt.Sprint(h), func(t *testing.T) {
			if !got[h] {
				t.Fatalf("changes %v lack %x", ch, h)
			}
		})
	}
	if got := refsOf(b, kept); got[0] != 1 || got[5] != 1 || b.Refs(old[7]) != 0 {
		t.Fatalf("kept prefix refs %v, dead tail %d", got, b.Refs(old[7]))
	}
}

// Without a branch name, the branch is inferred from the session's live
// branches: extending one continues it, diverging forks the closest.
func TestBranchesInference(t *testing.T) {
	b := NewBranches(time.Minute)
	c1 := chainOf(1, 6)
	t1 := b.Begin(bt0, Identity{Session: "s"}, c1)
	if t1.Kind != TurnNew || t1.Branch == "" {
		t.Fatalf("first %+v", t1)
	}
	b.Finish(bt0, "s", t1.Branch)
	t2 := b.Begin(bt0, Identity{Session: "s"}, grow(c1, 2, 3))
	if t2.Kind != TurnContinue || t2.Branch != t1.Branch || t2.Added != 3 {
		t.Fatalf("extension %+v (first %s)", t2, t1.Branch)
	}
	b.Finish(bt0, "s", t2.Branch)
	t3 := b.Begin(bt0, Identity{Session: "s"}, grow(c1[:4], 3, 3))
	if t3.Kind != TurnFork || t3.Parent != t1.Branch || t3.Branch == t1.Branch || b.Live() != 2 {
		t.Fatalf("divergence %+v, live %d", t3, b.Live())
	}
	// Anonymous requests reference nothing.
	if turn := b.Begin(bt0, Identity{}, chainOf(9, 3)); turn.Kind != "" || b.Refs(chainOf(9, 3)[0]) != 0 {
		t.Fatalf("anonymous %+v", turn)
	}
}

// A branch idle past the TTL ends; one in flight or recently used stays.
func TestBranchesTTL(t *testing.T) {
	b := NewBranches(time.Minute)
	c := chainOf(1, 3)
	b.Begin(bt0, Identity{Session: "a", Branch: "x"}, c)
	b.Finish(bt0, "a", "x")
	b.Begin(bt0, Identity{Session: "b", Branch: "y"}, chainOf(2, 3)) // in flight
	if n := b.Expire(bt0.Add(30 * time.Second)); n != 0 {
		t.Fatalf("expired %d too early", n)
	}
	if n := b.Expire(bt0.Add(2 * time.Minute)); n != 1 || b.Refs(c[0]) != 0 || b.Live() != 1 {
		t.Fatalf("expired %d, refs %d, live %d", n, b.Refs(c[0]), b.Live())
	}
	list := b.List("")
	if len(list) != 2 || list[0].State != BranchEnded || list[0].EndReason == "" || list[1].State != BranchActive {
		t.Fatalf("list %+v", list)
	}
	// The ended name can start afresh.
	if turn := b.Begin(bt0.Add(3*time.Minute), Identity{Session: "a", Branch: "x"}, c); turn.Kind != TurnNew || b.Refs(c[0]) != 1 {
		t.Fatalf("restart %+v", turn)
	}
}

// A new turn of a 128K-token branch (2,000 blocks of 64 tokens) adding one
// turn's blocks: the cost must not grow with the context.
func BenchmarkBranchesNewTurn128K(b *testing.B) {
	br := NewBranches(time.Hour)
	c := chainOf(1, 2000)
	br.Begin(bt0, Identity{Session: "s", Branch: "main"}, c)
	br.Finish(bt0, "s", "main")
	next := grow(c, 2, 8)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		// Alternate the last turn so that each call adds 8 blocks and drops 8.
		next[len(next)-1] ^= BlockHash(i&1 + 1)
		br.Begin(bt0, Identity{Session: "s", Branch: "main"}, next)
		br.Finish(bt0, "s", "main")
		br.Changes()
	}
}
