package orchestrator

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/evolvellm/evolve/internal/wait"
	"github.com/evolvellm/evolve/kv"
	"github.com/evolvellm/evolve/orchestrator/routing"
	"github.com/evolvellm/evolve/protocol"
	"github.com/nats-io/nats.go"
)

// FuzzEventPlaneHandlers feeds the orchestrator's event-plane handlers
// what anyone on the event plane can publish: raw bytes on every subject,
// then a program of well-formed but arbitrary registrations, heartbeats,
// KV batches, goodbyes and pass records from a few engines, with requests
// routed between them. No message may panic the orchestrator, serve a node
// of another model or block size, or leave a node that is down holding
// KV in the directory.
func FuzzEventPlaneHandlers(f *testing.F) {
	f.Add([]byte{0, 0, 1, 0, 2, 0, 5, 0}, []byte(`{"id":"e0"}`))
	f.Add([]byte{0, 1, 0, 3, 2, 1, 1, 2, 5, 4, 3, 0, 5, 1}, []byte(`{"engine":"e1","events":[{"seq":1,"kind":"BlockStored","tier":"gpu","hash":7}]}`))
	f.Add([]byte{0, 2, 0, 6, 7, 1, 9, 2, 2, 2, 3, 5, 0, 2, 0, 0}, []byte(`not json`))
	f.Add([]byte{0, 0, 0, 1, 2, 5, 2, 0, 9, 0, 1, 6, 3, 0, 1, 0, 5, 3}, []byte(`{"id":"../../etc"}`))
	tc := startTestClusterWith(f, Config{}, nil)
	o := tc.o
	handlers := []func(*nats.Msg){o.onRegister, o.onHeartbeat, o.onKV, o.onDeregister, o.onStats}
	f.Fuzz(func(t *testing.T, prog, raw []byte) {
		forgetEngines(o) // each input meets an orchestrator no engine has joined
		for _, h := range handlers {
			h(&nats.Msg{Data: raw})
		}
		p := fuzzProgram{b: prog}
		for p.more() {
			op := p.next() % 6
			id := fmt.Sprint("e", p.next()%3)
			var msg any
			switch op {
			case 0:
				bs := []int{16, 16, 16, 32, 0, -16}[p.next()%6]
				msg = protocol.Registration{ID: id, URL: "http://127.0.0.1:9", Model: []string{"m", "m", "other"}[p.next()%3],
					Role: []string{"prefill", "decode", "", "wizard"}[p.next()%4], BlockSize: bs, GPUBlocks: p.int() * 64,
					HostBlocks: p.int() * 64, KVBytesPerToken: p.int(), MaxModelLen: p.int() * 512, MaxNumSeqs: p.int(),
					Speedup: float64(p.int()), PrefillUsPerToken: float64(p.int()), HostGBps: float64(p.int()),
					StartedAt: time.Unix(int64(p.next()%2), 0)}
			case 1:
				msg = protocol.Heartbeat{ID: id, Draining: p.next()%2 == 0, Running: p.int(), Waiting: p.int(),
					GPUKVUsage: float64(p.int()) / 50, TokensTotal: uint64(p.next()), LastKVSeq: uint64(p.next())}
			case 2:
				b := protocol.KVEventBatch{Engine: id}
				for range p.next() % 8 {
					b.Events = append(b.Events, kv.Event{Seq: uint64(p.next() % 16), Kind: kv.EventKind(p.next()%4 + 1),
						Tier: kv.Tier(p.next() % 2), Hash: kv.BlockHash(p.next() % 8), Parent: kv.BlockHash(p.next() % 8), Depth: int32(p.int())})
				}
				msg = b
			case 3:
				msg = protocol.Deregistration{ID: id}
			case 4:
				msg = map[string]any{"engine": id, "passes": []map[string]any{{"duration_s": float64(p.int()) / 100,
					"prefill_tokens": p.int() * 100, "decode_seqs": p.int(), "decode_context": p.int() * 1000}}}
			case 5:
				fuzzRoute(o, p.next())
				continue
			}
			data, err := json.Marshal(msg)
			if err != nil {
				t.Fatal(err)
			}
			handlers[op](&nats.Msg{Data: data})
		}
		checkEventPlaneState(t, o)
	})
}

// forgetEngines takes o back to before any engine registered.
func forgetEngines(o *Orchestrator) {
	o.c.mu.Lock()
	defer o.c.mu.Unlock()
	for id, n := range o.c.nodes {
		o.c.dir.DropNode(n.dir)
		delete(o.c.nodes, id)
	}
	o.model, o.blockSize = "", 0
}

// fuzzProgram reads a fuzz input a byte at a time, zeros past its end.
type fuzzProgram struct {
	b []byte
	i int
}

func (p *fuzzProgram) more() bool { return p.i < len(p.b) }

func (p *fuzzProgram) next() byte {
	if p.i >= len(p.b) {
		return 0
	}
	p.i++
	return p.b[p.i-1]
}

// int is a small signed number: -8 to 119.
func (p *fuzzProgram) int() int { return int(p.next()%128) - 8 }

// fuzzRoute routes a request of n blocks' worth of tokens as the router
// does, and ends it.
func fuzzRoute(o *Orchestrator, n byte) {
	o.c.mu.Lock()
	bs := o.blockSize
	o.c.mu.Unlock()
	if bs == 0 {
		return // no engine yet
	}
	chain := make([]kv.BlockHash, n%8)
	for i := range chain {
		chain[i] = kv.BlockHash(i + 1)
	}
	var m kv.Match
	v := o.view(chain, &m, nil)
	rr := &routing.Request{ID: fmt.Sprint("fuzz-", n), Tokens: len(chain)*bs + 1, Chain: chain, Match: &m, MaxTokens: int(n)}
	o.policyMu.Lock()
	defer o.policyMu.Unlock()
	if _, err := o.policy.Route(time.Now(), rr, v); err == nil {
		o.policy.Finished(time.Now(), rr.ID)
	}
}

func checkEventPlaneState(t *testing.T, o *Orchestrator) {
	t.Helper()
	o.c.mu.Lock()
	defer o.c.mu.Unlock()
	if o.blockSize < 0 || o.blockSize > protocol.MaxBlockSize {
		t.Fatalf("the cluster hashes prompts by blocks of %d tokens", o.blockSize)
	}
	for id, n := range o.c.nodes {
		if err := protocol.ValidateEngineID(id); err != nil {
			t.Fatalf("node %q joined: %v", id, err)
		}
		gpu, host := o.c.dir.NodeReplicas(n.dir)
		if gpu < 0 || host < 0 {
			t.Fatalf("node %s holds %d GPU and %d host copies", id, gpu, host)
		}
		switch n.state {
		case StateServing, StateDraining:
			if n.reg.Model != o.model || n.reg.BlockSize != o.blockSize {
				t.Fatalf("node %s serves %s with %d-token blocks in a cluster of %s with %d", id, n.reg.Model, n.reg.BlockSize, o.model, o.blockSize)
			}
		case StateDown:
			if gpu+host != 0 {
				t.Fatalf("node %s is down and holds %d copies in the directory", id, gpu+host)
			}
		}
	}
}

// A registration the router cannot use (here a block size of 0, first of
// all) joins as rejected, saying why, and sets nothing of the cluster's:
// dropped instead, its engine's heartbeats from a node never seen would
// ask every engine to register again, each second, unseen by operators.
func TestInvalidRegistrationIsRejectedAndSaysWhy(t *testing.T) {
	tc := startTestClusterWith(t, Config{}, nil)
	nc, err := nats.Connect(tc.o.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	announces, _ := nc.SubscribeSync(protocol.SubjectAnnounce)
	b, _ := json.Marshal(protocol.Registration{ID: "bad", URL: "http://127.0.0.1:9", Model: "m", BlockSize: 0})
	nc.Publish(protocol.SubjectRegister, b)
	wait.Until(t, 10*time.Second, "the node rejected", func() bool {
		st, ok := tc.o.NodeStatus("bad")
		return ok && st.State == StateRejected && st.Reason == "engine bad: block size 0: want 1 to 4096 tokens"
	})
	hb, _ := json.Marshal(protocol.Heartbeat{ID: "bad", Time: time.Now()})
	for range 3 {
		nc.Publish(protocol.HeartbeatSubject("bad"), hb)
	}
	nc.Flush()
	// None may come: wait as long as an answer to them would take.
	if msg, err := announces.NextMsg(300 * time.Millisecond); err == nil {
		t.Fatalf("a rejected node's heartbeats asked every engine to register again: %v", msg.Subject)
	}
	tc.o.c.mu.Lock()
	bs := tc.o.blockSize
	tc.o.c.mu.Unlock()
	if bs != 0 {
		t.Fatalf("an invalid registration set the cluster's block size to %d", bs)
	}
}
