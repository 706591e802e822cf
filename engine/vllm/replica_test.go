package vllm_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/evolvellm/evolve/engine/vllm"
	"github.com/evolvellm/evolve/engine/vllm/vllmtest"
	"github.com/evolvellm/evolve/internal/wait"
	"github.com/evolvellm/evolve/kv"
	"github.com/evolvellm/evolve/protocol"
)

// sink collects what a replica publishes.
type sink struct {
	mu     sync.Mutex
	events []kv.Event
	passes []protocol.PassRecord
}

func (s *sink) KVEvents(evs []kv.Event) {
	s.mu.Lock()
	s.events = append(s.events, evs...)
	s.mu.Unlock()
}

func (s *sink) Pass(rec protocol.PassRecord) {
	s.mu.Lock()
	s.passes = append(s.passes, rec)
	s.mu.Unlock()
}

func (s *sink) passRecords() []protocol.PassRecord {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]protocol.PassRecord(nil), s.passes...)
}

func (s *sink) snapshot() []kv.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]kv.Event(nil), s.events...)
}

// resident replays events into a set of GPU blocks, checking sequence.
func resident(t *testing.T, evs []kv.Event) map[kv.BlockHash]bool {
	t.Helper()
	set := map[kv.BlockHash]bool{}
	for i, e := range evs {
		if e.Seq != uint64(i+1) {
			t.Fatalf("event %d has seq %d", i, e.Seq)
		}
		switch e.Kind {
		case kv.BlockStored:
			set[e.Hash] = true
		case kv.BlockRemoved:
			delete(set, e.Hash)
		case kv.AllCleared:
			clear(set)
		}
	}
	return set
}

func post(t *testing.T, url string, body any, out any) {
	t.Helper()
	b, _ := json.Marshal(body)
	resp, err := http.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("POST %s: %s", url, resp.Status)
	}
	if out != nil {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			t.Fatal(err)
		}
	}
}

// chainOf is the evolve chain of a prompt as the server tokenizes it.
func chainOf(t *testing.T, srv *vllmtest.Server, prompt string) []kv.BlockHash {
	var tok struct {
		Tokens []uint32 `json:"tokens"`
	}
	post(t, srv.URL+"/tokenize", map[string]any{"prompt": prompt}, &tok)
	return kv.ChainHashes(tok.Tokens, vllmtest.BlockSize)
}

func startReplica(t *testing.T, opts vllmtest.Options, replay bool) (*vllmtest.Server, *vllm.Replica, *sink) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	srv, err := vllmtest.Start(ctx, opts, "", "", "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	cfg := vllm.Config{ID: "gpu-0", URL: srv.URL, Events: srv.Events, Topic: opts.Topic, GPUs: 2, PassMetrics: srv.PassMetrics}
	if replay {
		cfg.Replay = srv.Replay
	}
	r, err := vllm.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	pctx, pcancel := context.WithTimeout(ctx, 10*time.Second)
	defer pcancel()
	if err := r.Probe(pctx, nil); err != nil {
		t.Fatal(err)
	}
	sk := &sink{}
	r.SetSink(sk)
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	// A ZMQ subscriber joins a little after it dials: publish until it hears.
	warm := " warm-up " + strings.Repeat("word ", 40)
	deadline := time.Now().Add(10 * time.Second)
	for len(sk.snapshot()) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no KV event reached the replica")
		}
		post(t, srv.URL+"/v1/completions", map[string]any{"prompt": fmt.Sprint(time.Now().UnixNano()) + warm, "max_tokens": 1}, nil)
		time.Sleep(50 * time.Millisecond)
	}
	return srv, r, sk
}

func TestReplicaRegistersAndTranslatesEvents(t *testing.T) {
	for _, mapEvents := range []bool{false, true} {
		t.Run(fmt.Sprintf("map=%v", mapEvents), func(t *testing.T) {
			srv, r, sk := startReplica(t, vllmtest.Options{MapEvents: mapEvents, Topic: "kv@fake"}, true)
			reg := r.Registration("test")
			if reg.Backend != "vllm" || reg.Model != "fake/model" || reg.BlockSize != vllmtest.BlockSize || reg.GPUBlocks != 4096 ||
				reg.MaxModelLen != 32768 || reg.Tokenizer != "engine" || !reg.SelfManagedKV || reg.URL != srv.URL || reg.GPUs != 2 {
				t.Fatalf("registration %+v", reg)
			}
			prompt := "The repository's README explains " + strings.Repeat("the build and the tests, ", 20)
			post(t, srv.URL+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 4}, nil)
			chain := chainOf(t, srv, prompt)
			if len(chain) < 5 {
				t.Fatalf("chain of %d blocks", len(chain))
			}
			wait.Until(t, 10*time.Second, "the prompt's blocks", func() bool {
				set := resident(t, sk.snapshot())
				for _, h := range chain {
					if !set[h] {
						return false
					}
				}
				return true
			})
			// The chain is over the server's own ids (from /tokenize), which
			// are not evolve's tokenizer's.
			if hb := r.Heartbeat(); hb.LastKVSeq != uint64(len(sk.snapshot())) || hb.Role != "both" {
				t.Fatalf("heartbeat %+v", hb)
			}
		})
	}
}

func TestReplicaReplaysLostBatches(t *testing.T) {
	srv, _, sk := startReplica(t, vllmtest.Options{}, true)
	a, b := "first prompt "+strings.Repeat("alpha ", 40), "second prompt "+strings.Repeat("beta ", 40)
	srv.SkipNext(1) // the subscriber never sees a's batch on the live stream
	post(t, srv.URL+"/v1/completions", map[string]any{"prompt": a, "max_tokens": 1}, nil)
	post(t, srv.URL+"/v1/completions", map[string]any{"prompt": b, "max_tokens": 1}, nil)
	want := append(chainOf(t, srv, a), chainOf(t, srv, b)...)
	wait.Until(t, 10*time.Second, "both prompts' blocks, one of them replayed", func() bool {
		set := resident(t, sk.snapshot())
		for _, h := range want {
			if !set[h] {
				return false
			}
		}
		return true
	})
	for _, e := range sk.snapshot() {
		if e.Kind == kv.AllCleared {
			t.Fatal("a replayable gap must not clear the engine's blocks")
		}
	}
}

func TestReplicaStartsOverWithoutReplay(t *testing.T) {
	srv, _, sk := startReplica(t, vllmtest.Options{}, false)
	a, b := "lost prompt "+strings.Repeat("gamma ", 40), "next prompt "+strings.Repeat("delta ", 40)
	srv.SkipNext(1)
	post(t, srv.URL+"/v1/completions", map[string]any{"prompt": a, "max_tokens": 1}, nil)
	post(t, srv.URL+"/v1/completions", map[string]any{"prompt": b, "max_tokens": 1}, nil)
	wantB := chainOf(t, srv, b)
	wait.Until(t, 10*time.Second, "the next prompt's blocks after a clear", func() bool {
		evs := sk.snapshot()
		cleared := false
		for _, e := range evs {
			cleared = cleared || e.Kind == kv.AllCleared
		}
		set := resident(t, evs)
		return cleared && set[wantB[0]] && set[wantB[len(wantB)-1]]
	})
}

func TestReplicaControl(t *testing.T) {
	srv, r, sk := startReplica(t, vllmtest.Options{}, true)
	ctx := context.Background()
	if rep := r.Control(ctx, protocol.ControlRequest{Op: protocol.OpSetRole, Role: "prefill"}); !rep.OK || rep.Role != "prefill" {
		t.Fatalf("%+v", rep)
	}
	if rep := r.Control(ctx, protocol.ControlRequest{Op: protocol.OpSetRole, Role: "sideways"}); rep.OK {
		t.Fatalf("%+v", rep)
	}
	if rep := r.Control(ctx, protocol.ControlRequest{Op: protocol.OpDrain}); !rep.OK || !rep.Draining || !r.Heartbeat().Draining {
		t.Fatalf("%+v", rep)
	}
	if rep := r.Control(ctx, protocol.ControlRequest{Op: protocol.OpOffload}); !rep.OK {
		t.Fatalf("%+v", rep)
	}
	for _, op := range []string{protocol.OpFetch, protocol.OpHints, "explode"} {
		if rep := r.Control(ctx, protocol.ControlRequest{Op: op}); rep.OK || rep.Error == "" {
			t.Fatalf("%s: %+v", op, rep)
		}
	}
	prompt := "resync me " + strings.Repeat("epsilon ", 40)
	post(t, srv.URL+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 1}, nil)
	chain := chainOf(t, srv, prompt)
	wait.Until(t, 10*time.Second, "blocks", func() bool { return resident(t, sk.snapshot())[chain[len(chain)-1]] })
	before := resident(t, sk.snapshot())
	rep := r.Control(ctx, protocol.ControlRequest{Op: protocol.OpResync})
	if !rep.OK {
		t.Fatalf("%+v", rep)
	}
	all := sk.snapshot()
	// The reply names the resync's last event, which the orchestrator
	// waits for before it asks the next engine.
	if last := all[len(all)-1]; rep.Seq != last.Seq || rep.Blocks != len(before) {
		t.Fatalf("resync reply %+v; its last event %+v, %d blocks", rep, last, len(before))
	}
	after := resident(t, all)
	if len(after) != len(before) || len(after) != srv.Resident() {
		t.Fatalf("resync: %d blocks before, %d after, server holds %d", len(before), len(after), srv.Resident())
	}
}

func TestProbeNamesWhatIsMissing(t *testing.T) {
	r, err := vllm.New(vllm.Config{ID: "x", URL: "http://127.0.0.1:1", Events: "tcp://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	tries := 0
	err = r.Probe(ctx, func(error) { tries++ })
	if err == nil || !strings.Contains(err.Error(), "not ready") || tries == 0 {
		t.Fatalf("err %v after %d tries", err, tries)
	}
	if _, err := vllm.New(vllm.Config{ID: "bad id!", URL: "x", Events: "y"}); err == nil {
		t.Fatal("bad id accepted")
	}
	if _, err := vllm.New(vllm.Config{ID: "x", URL: "http://h"}); err == nil {
		t.Fatal("missing event endpoint accepted")
	}
	if err := r.Run(context.Background()); err == nil {
		t.Fatal("Run before Probe")
	}
}

// syncBuffer is a log destination safe for the agent's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// runLogged runs a replica, configured by cfg, of a stand-in vLLM, and
// returns the server and the replica's log.
func runLogged(t *testing.T, cfg func(*vllmtest.Server) vllm.Config) (*vllmtest.Server, *syncBuffer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	srv, err := vllmtest.Start(ctx, vllmtest.Options{}, "", "", "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	logs := &syncBuffer{}
	c := cfg(srv)
	c.Logger = slog.New(slog.NewTextHandler(logs, nil))
	r, err := vllm.New(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Probe(ctx, nil); err != nil {
		t.Fatal(err)
	}
	go r.Run(ctx)
	return srv, logs
}

// A vLLM that serves but whose KV events never arrive (not enabled, or
// the wrong endpoint) gets a warning that says how to fix it, once its
// prompts filled blocks: a prompt shorter than a block stores none, and
// was warned about before.
func TestReplicaWarnsWhenNoKVEventsArrive(t *testing.T) {
	srv, logs := runLogged(t, func(srv *vllmtest.Server) vllm.Config {
		return vllm.Config{ID: "quiet", URL: srv.URL, Events: "tcp://127.0.0.1:1", SilentAfter: time.Second, PassMetrics: "tcp://127.0.0.1:1"}
	})
	post(t, srv.URL+"/v1/completions", map[string]any{"prompt": "short", "max_tokens": 1}, nil)
	time.Sleep(2500 * time.Millisecond) // past SilentAfter, two scrapes
	if strings.Contains(logs.String(), "no KV event has reached the agent") {
		t.Fatalf("a warning for a prompt shorter than a block:\n%s", logs.String())
	}
	post(t, srv.URL+"/v1/completions", map[string]any{"prompt": strings.Repeat("served without events ", 10), "max_tokens": 1}, nil)
	wait.Until(t, 10*time.Second, "the warning", func() bool { return strings.Contains(logs.String(), "no KV event has reached the agent") })
	if !strings.Contains(logs.String(), "--kv-events-config") || !strings.Contains(logs.String(), "a publisher must bind its endpoint") {
		t.Fatalf("the warning does not say how to fix it:\n%s", logs.String())
	}
	// Nor has a forward pass come, though vLLM serves: that is said too.
	wait.Until(t, 10*time.Second, "the passes' warning", func() bool {
		return strings.Contains(logs.String(), "none of its forward passes has reached the agent")
	})
}

// An agent told of no forward-pass metrics says at start what the planner
// then cannot do, and how to give it them.
func TestReplicaWithoutPassMetricsSaysSo(t *testing.T) {
	_, logs := runLogged(t, func(srv *vllmtest.Server) vllm.Config {
		return vllm.Config{ID: "blind", URL: srv.URL, Events: srv.Events}
	})
	wait.Until(t, 10*time.Second, "the note", func() bool {
		return strings.Contains(logs.String(), "the planner cannot learn this engine's pass costs")
	})
	if !strings.Contains(logs.String(), "--forward-pass-metrics-port") {
		t.Fatalf("the note does not say how to give the planner passes:\n%s", logs.String())
	}
}

// vLLM restarting (same endpoints, an empty cache, its sequence from 0)
// breaks the event stream: the agent connects again, starts the engine's
// blocks over, and replays what the new server published before it
// joined.
func TestReplicaFollowsARestartedVLLM(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	free := func() string {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		return l.Addr().String()
	}
	addr, events, replay := free(), "tcp://"+free(), "tcp://"+free()
	first, err := vllmtest.Start(ctx, vllmtest.Options{}, addr, events, replay)
	if err != nil {
		t.Fatal(err)
	}
	r, err := vllm.New(vllm.Config{ID: "phoenix", URL: first.URL, Events: events, Replay: replay})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Probe(ctx, nil); err != nil {
		t.Fatal(err)
	}
	sk := &sink{}
	r.SetSink(sk)
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	// A subscriber joins a little after it dials: publish until it hears.
	n := 0
	wait.Until(t, 10*time.Second, "the first server's blocks", func() bool {
		n++
		before := fmt.Sprint(n, " before the restart ", strings.Repeat("alpha ", 40))
		post(t, first.URL+"/v1/completions", map[string]any{"prompt": before, "max_tokens": 1}, nil)
		return resident(t, sk.snapshot())[chainOf(t, first, before)[0]]
	})
	first.Close()
	http.DefaultClient.CloseIdleConnections() // its connections died with it
	second, err := vllmtest.Start(ctx, vllmtest.Options{}, addr, events, replay)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	// Published before the agent is back: replayed when the next batch
	// shows the gap, not lost.
	after := "after the restart " + strings.Repeat("omega ", 40)
	post(t, second.URL+"/v1/completions", map[string]any{"prompt": after, "max_tokens": 1}, nil)
	chain := chainOf(t, second, after)
	wait.Until(t, 10*time.Second, "the restarted server's blocks, and only those", func() bool {
		n++ // traffic goes on while the agent connects again
		post(t, second.URL+"/v1/completions", map[string]any{"prompt": fmt.Sprint(n, " next ", strings.Repeat("psi ", 40)), "max_tokens": 1}, nil)
		time.Sleep(50 * time.Millisecond)
		set := resident(t, sk.snapshot())
		return set[chain[0]] && set[chain[len(chain)-1]] && len(set) == second.Resident()
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// A vLLM too old to name the tokens it streams is joined, with a warning
// that its answers cannot go on elsewhere should it die mid-stream; a
// recent one gets none.
func TestReplicaWarnsOfAVLLMTooOldToContinueFrom(t *testing.T) {
	for _, c := range []struct {
		version string
		warns   bool
	}{{"0.9.2", true}, {"0.10.2", false}} {
		t.Run(c.version, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			srv, err := vllmtest.Start(ctx, vllmtest.Options{Version: c.version}, "", "", "")
			if err != nil {
				t.Fatal(err)
			}
			var logs syncBuffer
			r, err := vllm.New(vllm.Config{ID: "v", URL: srv.URL, Events: srv.Events, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			if err != nil {
				t.Fatal(err)
			}
			if err := r.Probe(ctx, nil); err != nil {
				t.Fatal(err)
			}
			if warned := strings.Contains(logs.String(), "return_token_ids needs 0.10.2 or later"); warned != c.warns {
				t.Errorf("vLLM %s: warned %v, want %v:\n%s", c.version, warned, c.warns, logs.String())
			}
			srv.Close()
			cancel()
		})
	}
}

// A replica follows the forward-pass metrics of its vLLM: each pass
// reaches the sink as a pass record, timed as vLLM timed it, and
// heartbeats do not.
func TestReplicaPublishesVLLMsForwardPasses(t *testing.T) {
	srv, _, sk := startReplica(t, vllmtest.Options{PassMetrics: "tcp://127.0.0.1:0"}, true)
	// The subscriber joins a little after it dials, and the warm-up's
	// passes may have come before: count from a request it surely hears.
	wait.Until(t, 10*time.Second, "a pass record", func() bool {
		post(t, srv.URL+"/v1/completions", map[string]any{"prompt": fmt.Sprint(time.Now().UnixNano()), "max_tokens": 1}, nil)
		time.Sleep(20 * time.Millisecond)
		return len(sk.passRecords()) > 0
	})
	before := len(sk.passRecords())
	prompt := strings.Repeat("the scheduler runs tasks by deadline ", 60)
	var out struct {
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
	}
	post(t, srv.URL+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 5}, &out)
	wait.Until(t, 10*time.Second, "the request's five passes", func() bool { return len(sk.passRecords()) >= before+5 })
	time.Sleep(100 * time.Millisecond) // a heartbeat, were it counted, would come now
	recs := sk.passRecords()[before:]
	if len(recs) != 5 {
		t.Fatalf("%d pass records for a prefill and four decode passes: %+v", len(recs), recs)
	}
	p := out.Usage.PromptTokens
	if pre := recs[0]; pre.PrefillTokens != p || pre.DecodeSeqs != 0 ||
		math.Abs(pre.DurationSec-(vllmtest.PrefillBaseSec+vllmtest.PrefillPerTokenSec*float64(p)+vllmtest.PrefillPerPairSec*pre.PrefillAttended)) > 1e-9 {
		t.Fatalf("prefill pass of a %d-token prompt: %+v", p, pre)
	}
	for i, d := range recs[1:] {
		ctx := p + i + 1
		if d.DecodeSeqs != 1 || d.DecodeContext != ctx || d.PrefillTokens != 0 ||
			math.Abs(d.DurationSec-(vllmtest.DecodeBaseSec+vllmtest.DecodePerSeqSec+vllmtest.DecodePerContextSec*float64(ctx))) > 1e-9 {
			t.Fatalf("decode pass %d: %+v", i, d)
		}
	}
}
