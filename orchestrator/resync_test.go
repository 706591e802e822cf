package orchestrator

import (
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/evolvellm/evolve/engine/stepmodel"
	"github.com/evolvellm/evolve/internal/wait"
	"github.com/evolvellm/evolve/kv"
	"github.com/evolvellm/evolve/protocol"
	"github.com/evolvellm/evolve/roles"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// slowResyncEngine is an engine on the event plane that answers a resync
// at once and publishes its blocks a moment later, as an engine with a
// big pool does: the orchestrator must wait for the events, not the reply.
type slowResyncEngine struct {
	id     string
	blocks int
	nc     *nats.Conn

	mu      *sync.Mutex
	sending *int // engines between a resync request and its last event
	most    *int // the most at once
}

func (e *slowResyncEngine) start(t *testing.T, natsURL string) {
	t.Helper()
	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	e.nc = nc
	reg := protocol.Registration{ID: e.id, URL: "http://127.0.0.1:9", Backend: "test", Model: "evolve-tiny", Role: "decode",
		BlockSize: 16, GPUBlocks: 1 << 20, StartedAt: time.Now()}
	register := func() {
		b, _ := json.Marshal(reg)
		nc.Publish(protocol.SubjectRegister, b)
	}
	var seq uint64
	_, err = nc.Subscribe(protocol.ControlSubject(e.id), func(m *nats.Msg) {
		var req protocol.ControlRequest
		json.Unmarshal(m.Data, &req)
		rep := protocol.ControlReply{OK: true, Role: "decode"}
		if req.Op != protocol.OpResync {
			b, _ := json.Marshal(rep)
			m.Respond(b)
			return
		}
		e.mu.Lock()
		*e.sending++
		*e.most = max(*e.most, *e.sending)
		e.mu.Unlock()
		events := []kv.Event{{Kind: kv.AllCleared}}
		for i := range e.blocks {
			events = append(events, kv.Event{Kind: kv.BlockStored, Tier: kv.TierGPU, Hash: kv.BlockHash(1000*len(e.id) + i + 1)})
		}
		for i := range events {
			seq++
			events[i].Seq = seq
		}
		rep.Blocks, rep.Seq = e.blocks, seq
		b, _ := json.Marshal(rep)
		m.Respond(b)
		go func() {
			time.Sleep(300 * time.Millisecond)
			for len(events) > 0 {
				n := min(len(events), 100)
				if n == len(events) {
					// Done sending once the last batch leaves: counted
					// before it is published, as the orchestrator may
					// apply it and ask the next engine before Publish
					// or Flush returns here.
					e.mu.Lock()
					*e.sending--
					e.mu.Unlock()
				}
				b, _ := json.Marshal(protocol.KVEventBatch{Engine: e.id, Events: events[:n]})
				nc.Publish(protocol.KVSubject(e.id), b)
				events = events[n:]
			}
			nc.Flush()
		}()
	})
	if err != nil {
		t.Fatal(err)
	}
	nc.Subscribe(protocol.SubjectAnnounce, func(*nats.Msg) { register() })
	nc.Flush()
	register()
	go func() {
		tick := time.NewTicker(protocol.HeartbeatInterval)
		defer tick.Stop()
		for range tick.C {
			if nc.IsClosed() {
				return
			}
			b, _ := json.Marshal(protocol.Heartbeat{ID: e.id, Time: time.Now()})
			nc.Publish(protocol.HeartbeatSubject(e.id), b)
		}
	}()
}

// Engines that join together (as every engine does when a restarted
// orchestrator announces itself) send their KV one at a time: the next
// is asked to resync once the directory has applied the last one's
// events, so that one engine's KV, not all of theirs, waits in the
// orchestrator's memory. Every engine's KV still reaches the directory.
func TestResyncsArePaced(t *testing.T) {
	tc := startTestClusterWith(t, Config{}, nil)
	var mu sync.Mutex
	var sending, most int
	engines := make([]*slowResyncEngine, 4)
	for i := range engines {
		engines[i] = &slowResyncEngine{id: fmt.Sprint("r", i), blocks: 500 + 100*i, mu: &mu, sending: &sending, most: &most}
		engines[i].start(t, tc.o.NATSURL())
	}
	p, _ := stepmodel.BuiltinProfile("tiny")
	tc.addEngine(t, "e0", p, roles.Decode) // a simulated engine says how far its resync goes too
	wait.Until(t, 20*time.Second, "every engine's KV in the directory", func() bool {
		tc.o.c.mu.Lock()
		defer tc.o.c.mu.Unlock()
		for _, e := range engines {
			n := tc.o.c.nodes[e.id]
			if n == nil {
				return false
			}
			if gpu, _ := tc.o.c.dir.NodeReplicas(n.dir); gpu != e.blocks {
				return false
			}
		}
		return true
	})
	wait.Until(t, 20*time.Second, "every resync applied", func() bool {
		return testutil.ToFloat64(tc.o.met.resyncs.WithLabelValues("applied")) == 5
	})
	mu.Lock()
	defer mu.Unlock()
	if most != 1 {
		t.Fatalf("%d engines were sending their whole KV at once; want 1", most)
	}
}

// A resync asked for again while one waits for its turn is the same
// resync: an engine with a gap in its events in every batch is asked once
// per turn, not once per batch.
func TestResyncQueuedOnceForAnEngine(t *testing.T) {
	q := newResyncQueue()
	o := &Orchestrator{resyncs: q, c: newCluster(0)}
	q.slot <- struct{}{} // another engine's resync in progress
	done := make(chan struct{})
	go func() { o.resync("e0"); close(done) }()
	wait.Until(t, 5*time.Second, "e0 queued", func() bool {
		q.mu.Lock()
		defer q.mu.Unlock()
		return q.queued["e0"]
	})
	second := make(chan struct{})
	go func() { o.resync("e0"); close(second) }()
	select {
	case <-second:
	case <-time.After(5 * time.Second):
		t.Fatal("a second resync for a queued engine waits for a turn of its own")
	}
	<-q.slot
	select {
	case <-done: // e0 is not a node: nothing to ask
	case <-time.After(5 * time.Second):
		t.Fatal("the queued resync did not run when the slot freed")
	}
}
