package orchestrator

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/evolvellm/evolve/controlapi"
	"github.com/evolvellm/evolve/kv"
	"github.com/evolvellm/evolve/roles"
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
	n := &node{dir: id, sw: &controlapi.Switch{To: "prefill", Phase: "draining", Started: time.Now()},
		history: make([]roles.Change, 1, 4)}
	n.history[0] = roles.Change{From: "decode", To: "prefill", Reason: "first"}
	st := n.status("e0", dir)
	n.sw.Phase = "offloading"
	n.history[0].Reason = "changed"
	if st.Switch.Phase != "draining" || st.History[0].Reason != "first" {
		t.Fatalf("status aliases the node: switch %+v, history %+v", st.Switch, st.History)
	}
}

// With a NATS token, the event plane refuses clients that do not present
// it (engines on the cluster network must).
func TestNATSTokenIsRequired(t *testing.T) {
	o, err := New(Config{RouterAddr: "127.0.0.1:0", ControlAddr: "127.0.0.1:0", NATSListen: "127.0.0.1:0", DataDir: t.TempDir(), NATSToken: "s3cret"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	ready := make(chan struct{})
	go func() { o.Run(ctx, func() { close(ready) }); close(done) }()
	defer func() { cancel(); <-done }()
	<-ready
	if nc, err := nats.Connect(o.NATSURL()); err == nil {
		nc.Close()
		t.Fatal("connected without the token")
	}
	nc, err := nats.Connect(strings.Replace(o.NATSURL(), "nats://", "nats://s3cret@", 1))
	if err != nil {
		t.Fatalf("with the token: %v", err)
	}
	nc.Close()
}
