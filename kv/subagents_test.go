package kv

import (
	"testing"
	"time"
)

// A sub-agent named inside its session (Claude Code's agent id, Codex's
// thread) is a child of its parent agent: its first branch forks from the
// parent's, its turns are inferred among its own branches (a sub-agent's
// context that shares the system prompt with the parent's does not
// continue the parent's branch), and ending it leaves the parent live.
func TestSubAgentInsideItsSession(t *testing.T) {
	b := NewBranches(time.Minute)
	sys := chainOf(1, 4)
	root := b.Begin(bt0, Identity{Session: "s"}, grow(sys, 2, 3))
	b.Finish(bt0, "s", root.Branch)
	child := b.Begin(bt0, Identity{Session: "s", Agent: "a1"}, grow(sys, 3, 2))
	if child.Kind != TurnFork || child.Parent != root.Branch || child.Agent != "a1" || child.Branch == root.Branch {
		t.Fatalf("the sub-agent's first turn %+v, its parent agent's branch %s", child, root.Branch)
	}
	b.Finish(bt0, "s", child.Branch)
	// Its next turn extends its own context, not the root's.
	next := b.Begin(bt0, Identity{Session: "s", Agent: "a1"}, grow(grow(sys, 3, 2), 4, 1))
	if next.Branch != child.Branch || next.Kind != TurnContinue {
		t.Fatalf("the sub-agent's second turn %+v, want a continuation of %s", next, child.Branch)
	}
	b.Finish(bt0, "s", next.Branch)
	// A grandchild names its parent agent.
	grand := b.Begin(bt0, Identity{Session: "s", Agent: "a2", ParentAgent: "a1"}, chainOf(9, 2))
	if grand.Parent != child.Branch || grand.Kind != TurnFork {
		t.Fatalf("a sub-agent of the sub-agent: %+v, want a child of %s", grand, child.Branch)
	}
	b.Finish(bt0, "s", grand.Branch)
	if n := b.EndAgent("s", "a1"); n != 1 || b.Live() != 2 {
		t.Fatalf("ending sub-agent a1 ended %d branches, %d live", n, b.Live())
	}
	for _, bi := range b.List("s") {
		if bi.Branch == root.Branch && bi.State != BranchWaiting || bi.Agent == "a1" && bi.State != BranchEnded {
			t.Fatalf("after a1 ended: %+v", bi)
		}
	}
}

// A sub-agent that has a session of its own (OpenCode's children,
// Dynamo's x-dynamo-parent-session-id) belongs to the root of its
// parent's tree, however deep: its session, ended, ends its branches
// only, and is forgotten with its root.
func TestSubAgentWithASessionOfItsOwn(t *testing.T) {
	b := NewBranches(time.Minute)
	sys := chainOf(1, 4)
	root := b.Begin(bt0, Identity{Session: "ses_root"}, grow(sys, 2, 3))
	b.Finish(bt0, "ses_root", root.Branch)
	child := b.Begin(bt0, Identity{Session: "ses_child", ParentSession: "ses_root"}, grow(sys, 3, 2))
	if child.Session != "ses_root" || child.Agent != "ses_child" || child.Parent != root.Branch {
		t.Fatalf("the child session's first turn %+v", child)
	}
	b.Finish(bt0, "ses_root", child.Branch)
	grand := b.Begin(bt0, Identity{Session: "ses_grand", ParentSession: "ses_child"}, grow(grow(sys, 3, 2), 5, 1))
	if grand.Session != "ses_root" || grand.Agent != "ses_grand" || grand.Parent != child.Branch {
		t.Fatalf("the grandchild's first turn %+v, want a child of %s in ses_root", grand, child.Branch)
	}
	b.Finish(bt0, "ses_root", grand.Branch)
	// A later turn of the child that names only its own session still
	// belongs to the root.
	again := b.Begin(bt0, Identity{Session: "ses_child"}, grow(grow(sys, 3, 2), 6, 1))
	if again.Session != "ses_root" || again.Agent != "ses_child" || again.Branch != child.Branch {
		t.Fatalf("the child's turn without its parent %+v", again)
	}
	b.Finish(bt0, "ses_root", again.Branch)
	if len(b.List("ses_child")) != 1 || len(b.List("ses_root")) != 3 {
		t.Fatalf("listed %d branches for the child, %d for the root", len(b.List("ses_child")), len(b.List("ses_root")))
	}
	if n := b.End("ses_child", ""); n != 1 || b.Live() != 2 {
		t.Fatalf("ending the child's session ended %d, %d live", n, b.Live())
	}
	if n := b.End("ses_root", ""); n != 2 || b.Live() != 0 || len(b.roots) != 0 {
		t.Fatalf("ending the root ended %d, %d live, %d sub-agent sessions remembered", n, b.Live(), len(b.roots))
	}
	// Forgotten: the child's id is a session of its own again.
	if t2 := b.Begin(bt0, Identity{Session: "ses_child"}, chainOf(7, 1)); t2.Session != "ses_child" || t2.Agent != "" {
		t.Fatalf("after its root ended, %+v", t2)
	}
}
