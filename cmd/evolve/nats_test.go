package main

import (
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/evolvellm/evolve/internal/wait"
	"github.com/evolvellm/evolve/kv"
	"github.com/evolvellm/evolve/protocol"
	"github.com/evolvellm/evolve/tokenizer"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

func startNATS(t *testing.T) *server.Server {
	t.Helper()
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("NATS server not ready")
	}
	t.Cleanup(s.Shutdown)
	return s
}

// recorder keeps every message seen on evolve.engine.>.
type recorder struct {
	mu   sync.Mutex
	msgs []*nats.Msg
}

func (r *recorder) find(subject string, match func(data []byte) bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range r.msgs {
		if m.Subject == subject && (match == nil || match(m.Data)) {
			return true
		}
	}
	return false
}

func (r *recorder) kvEvents(engine string) []kv.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []kv.Event
	for _, m := range r.msgs {
		if m.Subject == protocol.KVSubject(engine) {
			var b protocol.KVEventBatch
			if err := json.Unmarshal(m.Data, &b); err == nil {
				out = append(out, b.Events...)
			}
		}
	}
	return out
}

func control(t *testing.T, nc *nats.Conn, id string, req protocol.ControlRequest) protocol.ControlReply {
	t.Helper()
	b, _ := json.Marshal(req)
	msg, err := nc.Request(protocol.ControlSubject(id), b, 5*time.Second)
	if err != nil {
		t.Fatalf("control %s on %s: %v", req.Op, id, err)
	}
	var rep protocol.ControlReply
	if err := json.Unmarshal(msg.Data, &rep); err != nil {
		t.Fatal(err)
	}
	return rep
}

func TestEngineOverNATS(t *testing.T) {
	ns := startNATS(t)
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	rec := &recorder{}
	if _, err := nc.Subscribe("evolve.engine.>", func(m *nats.Msg) {
		rec.mu.Lock()
		rec.msgs = append(rec.msgs, m)
		rec.mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	nc.Flush()

	a := startEngine(t, "--profile", "tiny", "--speedup", "20", "--id", "a", "--nats", ns.ClientURL())
	wait.Until(t, 5*time.Second, "registration and heartbeat of a", func() bool {
		return rec.find(protocol.SubjectRegister, func(d []byte) bool {
			var r protocol.Registration
			return json.Unmarshal(d, &r) == nil && r.ID == "a" && r.URL == a.url && r.BlockSize == 16 && r.GPUBlocks == 512 && r.HostBlocks == 2048
		}) && rec.find(protocol.HeartbeatSubject("a"), nil)
	})

	prompt := strings.Repeat("Read the failing test and the function it calls. ", 20)
	chain := kv.ChainHashes(tokenizer.Encode(prompt), 16)
	status, _, body := post(t, a.url+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 4})
	if status != 200 {
		t.Fatalf("completion: %d %v", status, body)
	}
	wait.Until(t, 5*time.Second, "KV events for the prompt's blocks", func() bool { return len(rec.kvEvents("a")) >= len(chain) })
	events := rec.kvEvents("a")
	stored := map[kv.BlockHash]bool{}
	for i, e := range events {
		if e.Seq != uint64(i+1) {
			t.Fatalf("event %d has sequence %d: the stream has a gap", i, e.Seq)
		}
		if e.Kind == kv.BlockStored && e.Tier == kv.TierGPU {
			stored[e.Hash] = true
		}
	}
	for i, h := range chain {
		if !stored[h] {
			t.Fatalf("block %d of the prompt was never announced as stored on GPU", i)
		}
	}
	wait.Until(t, 5*time.Second, "a pass record with the prefill", func() bool {
		return rec.find(protocol.StatsSubject("a"), func(d []byte) bool {
			var b protocol.StatsBatch
			if json.Unmarshal(d, &b) != nil {
				return false
			}
			for _, p := range b.Passes {
				if p.PrefillTokens > 0 && p.DurationSec > 0 {
					return true
				}
			}
			return false
		})
	})

	// Roles and drains, by control request.
	if rep := control(t, nc, "a", protocol.ControlRequest{Op: protocol.OpSetRole, Role: "decode"}); !rep.OK || rep.Role != "decode" {
		t.Fatalf("set_role: %+v", rep)
	}
	if status, _, _ := post(t, a.url+"/v1/completions", map[string]any{"prompt": "x", "kv_transfer_params": map[string]any{"do_remote_decode": true}}); status != 503 {
		t.Fatalf("decode engine took a prefill leg: %d", status)
	}
	if rep := control(t, nc, "a", protocol.ControlRequest{Op: protocol.OpDrain}); !rep.OK || !rep.Draining {
		t.Fatalf("drain: %+v", rep)
	}
	if status, _, body := post(t, a.url+"/v1/completions", map[string]any{"prompt": "x"}); status != 503 || obj(body["error"])["code"] != "engine_draining" {
		t.Fatalf("draining engine: %d %v", status, body)
	}
	if rep := control(t, nc, "a", protocol.ControlRequest{Op: protocol.OpSetRole, Role: "both"}); !rep.OK || rep.Draining {
		t.Fatalf("set_role after drain: %+v", rep)
	}
	if status, _, _ := post(t, a.url+"/v1/completions", map[string]any{"prompt": "x", "max_tokens": 1}); status != 200 {
		t.Fatalf("engine does not serve after the drain ended: %d", status)
	}
	if rep := control(t, nc, "a", protocol.ControlRequest{Op: "explode"}); rep.OK || !strings.Contains(rep.Error, "unknown control op") {
		t.Fatalf("unknown op: %+v", rep)
	}

	// Offload copies the GPU's blocks to host and says so in events.
	rep := control(t, nc, "a", protocol.ControlRequest{Op: protocol.OpOffload})
	if !rep.OK || rep.Blocks < len(chain) || rep.Seconds <= 0 {
		t.Fatalf("offload: %+v", rep)
	}
	wait.Until(t, 5*time.Second, "host-tier stored events after offload", func() bool {
		n := 0
		for _, e := range rec.kvEvents("a") {
			if e.Kind == kv.BlockStored && e.Tier == kv.TierHost {
				n++
			}
		}
		return n >= len(chain)
	})
	hints := []protocol.Hint{{Hash: chain[0], Priority: 3}}
	if rep := control(t, nc, "a", protocol.ControlRequest{Op: protocol.OpHints, Hints: hints}); !rep.OK {
		t.Fatalf("hints: %+v", rep)
	}

	// Resync replays the engine's blocks after a clear, numbered on.
	before := len(rec.kvEvents("a"))
	rep = control(t, nc, "a", protocol.ControlRequest{Op: protocol.OpResync})
	if !rep.OK || rep.Blocks < 2*len(chain) {
		t.Fatalf("resync: %+v", rep)
	}
	wait.Until(t, 5*time.Second, "resync events", func() bool { return len(rec.kvEvents("a")) >= before+1+rep.Blocks })
	ev := rec.kvEvents("a")
	if ev[before].Kind != kv.AllCleared || ev[before].Seq != uint64(before+1) {
		t.Fatalf("resync does not start with AllBlocksCleared at seq %d: %+v", before+1, ev[before])
	}

	// A second engine fetches the prompt's blocks from the first into its host tier.
	b := startEngine(t, "--profile", "tiny", "--speedup", "20", "--id", "b", "--nats", ns.ClientURL())
	rep = control(t, nc, "b", protocol.ControlRequest{Op: protocol.OpFetch, Peer: a.url, Blocks: chain})
	if !rep.OK || rep.Blocks != len(chain) {
		t.Fatalf("fetch: %+v", rep)
	}
	wait.Until(t, 5*time.Second, "fetched blocks land in b's host tier", func() bool {
		n := 0
		for _, e := range rec.kvEvents("b") {
			if e.Kind == kv.BlockStored && e.Tier == kv.TierHost {
				n++
			}
		}
		return n == len(chain)
	})
	status, _, body = post(t, b.url+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 1})
	if ev := obj(body["evolve"]); status != 200 || int(num(ev["host_hit_tokens"])) != len(chain)*16 {
		t.Fatalf("request after fetch: %d %v", status, body)
	}

	// Announce asks every engine to register again; a stopping engine deregisters.
	nc.Publish(protocol.SubjectAnnounce, nil)
	wait.Until(t, 5*time.Second, "b registers again", func() bool {
		n := 0
		rec.mu.Lock()
		for _, m := range rec.msgs {
			if m.Subject == protocol.SubjectRegister && strings.Contains(string(m.Data), `"id":"b"`) {
				n++
			}
		}
		rec.mu.Unlock()
		return n >= 2
	})
	b.stop(t)
	wait.Until(t, 5*time.Second, "b deregisters", func() bool {
		return rec.find(protocol.SubjectDeregister, func(d []byte) bool { return strings.Contains(string(d), `"b"`) })
	})
}
