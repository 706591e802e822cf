package engine

import (
	"strings"
	"testing"

	"github.com/evolvellm/evolve/protocol"
)

func TestFenceRefusesAnOldTermsRoleCommands(t *testing.T) {
	var g fenceGuard
	old := &protocol.Fence{Lease: "L1", Term: 5, Holder: "orch-a"}
	cur := &protocol.Fence{Lease: "L1", Term: 9, Holder: "orch-b"}
	if err := g.admit(protocol.OpSetRole, old); err != nil {
		t.Fatal(err)
	}
	if err := g.admit(protocol.OpDrain, cur); err != nil {
		t.Fatal(err)
	}
	for _, op := range []string{protocol.OpSetRole, protocol.OpDrain, protocol.OpResume, protocol.OpOffload, protocol.OpHandOver} {
		err := g.admit(op, old)
		if err == nil || !strings.Contains(err.Error(), "orch-b leads in term 9") {
			t.Fatalf("%s from the deposed leader: %v", op, err)
		}
	}
	// What any router asks (KV work) is no role command: not fenced.
	for _, op := range []string{protocol.OpResync, protocol.OpFetch, protocol.OpHints, protocol.OpStatus} {
		if err := g.admit(op, old); err != nil {
			t.Fatalf("%s: %v", op, err)
		}
	}
	if err := g.admit(protocol.OpSetRole, cur); err != nil {
		t.Fatalf("the leader's second command: %v", err)
	}
	// A store made anew (a fresh data directory) counts from 1 again.
	if err := g.admit(protocol.OpSetRole, &protocol.Fence{Lease: "L2", Term: 1}); err != nil {
		t.Fatalf("a new lease store: %v", err)
	}
}
