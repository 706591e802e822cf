package orchestrator

import (
	"testing"
	"time"

	"github.com/evolvellm/evolve/kv"
)

// A node's status is marshalled by the watch stream after the cluster lock
// is released, so it must share no memory with the live node: a switch in
// progress changes the phase and appends to the history meanwhile.
func TestNodeStatusSharesNoMemoryWithTheNode(t *testing.T) {
	dir := kv.NewDirectory()
	id, err := dir.Node("e0")
	if err != nil {
		t.Fatal(err)
	}
	n := &node{dir: id, sw: &Switch{To: "prefill", Phase: "draining", Started: time.Now()},
		history: make([]RoleChange, 1, 4)}
	n.history[0] = RoleChange{From: "decode", To: "prefill", Reason: "first"}
	st := n.status("e0", dir)
	n.sw.Phase = "offloading"
	n.history[0].Reason = "changed"
	if st.Switch.Phase != "draining" || st.History[0].Reason != "first" {
		t.Fatalf("status aliases the node: switch %+v, history %+v", st.Switch, st.History)
	}
}
