package orchestrator

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/evolvellm/evolve/engine/stepmodel"
	"github.com/evolvellm/evolve/internal/wait"
	"github.com/evolvellm/evolve/roles"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// freezable is an engine's HTTP handler whose answers can be frozen: its
// writes block while frozen, as an engine whose backend is stuck while
// its agent still heartbeats.
type freezable struct {
	h      http.Handler
	frozen atomic.Bool
	mu     sync.Mutex
	thawed chan struct{}
}

func (f *freezable) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.h.ServeHTTP(&freezingWriter{ResponseWriter: w, f: f}, r)
}

func (f *freezable) freeze() {
	f.mu.Lock()
	f.thawed = make(chan struct{})
	f.mu.Unlock()
	f.frozen.Store(true)
}

func (f *freezable) thaw() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.frozen.Swap(false) {
		close(f.thawed)
	}
}

type freezingWriter struct {
	http.ResponseWriter
	f *freezable
}

func (w *freezingWriter) Write(b []byte) (int, error) {
	if w.f.frozen.Load() {
		w.f.mu.Lock()
		c := w.f.thawed
		w.f.mu.Unlock()
		<-c
	}
	return w.ResponseWriter.Write(b)
}

func (w *freezingWriter) Flush() { w.ResponseWriter.(http.Flusher).Flush() }

// A stream whose engine stops sending while it still heartbeats (its
// backend stuck) goes on on a peer once it has sent nothing for the
// stream idle time, with the same tokens; the node is not marked down
// (it is alive), and the leg is counted as hung.
func TestStalledStreamGoesOnAfterTheIdleTime(t *testing.T) {
	tc := startTestClusterWith(t, Config{StreamIdle: time.Second}, nil)
	gates := map[string]*freezable{}
	tc.wrap = func(id string, h http.Handler) http.Handler {
		g := &freezable{h: h}
		gates[id] = g
		return g
	}
	for _, id := range []string{"e0", "e1"} {
		p, _ := stepmodel.BuiltinProfile("tiny")
		tc.addEngine(t, id, p, roles.Decode)
	}
	t.Cleanup(func() {
		for _, g := range gates {
			g.thaw()
		}
	})
	wait.Until(t, 10*time.Second, "two engines serving", func() bool { return tc.o.servingNodes() == 2 })
	body := `{"messages": [{"role": "user", "content": "write at length"}], "max_tokens": 800, "ignore_eos": true, "seed": 3, "stream": true}`
	read := func(freezeAt int) (string, time.Duration, string) {
		resp, err := http.Post(tc.o.RouterURL()+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		node := resp.Header.Get(HeaderDecodeNode)
		var text strings.Builder
		var longest time.Duration
		last, n := time.Now(), 0
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			d, ok := strings.CutPrefix(sc.Text(), "data: ")
			if !ok || d == "[DONE]" {
				continue
			}
			var c struct {
				Choices []struct {
					Delta struct{ Content string } `json:"delta"`
				} `json:"choices"`
			}
			if json.Unmarshal([]byte(d), &c) != nil || len(c.Choices) == 0 {
				continue
			}
			if n > 0 {
				longest = max(longest, time.Since(last))
			}
			last = time.Now()
			text.WriteString(c.Choices[0].Delta.Content)
			if n++; n == freezeAt {
				gates[node].freeze()
			}
		}
		return text.String(), longest, node
	}
	ref, _, _ := read(0)
	got, longest, node := read(100)
	if got != ref {
		t.Fatalf("the answer changed when its engine stalled")
	}
	if longest < time.Second || longest > 5*time.Second {
		t.Fatalf("the longest wait between tokens was %v: want about the idle time, 1 s", longest)
	}
	if v := testutil.ToFloat64(tc.o.met.legsEnded); v != 1 {
		t.Fatalf("hung legs counted: %v", v)
	}
	tc.o.c.mu.Lock()
	state := tc.o.c.nodes[node].state
	tc.o.c.mu.Unlock()
	if state != StateServing {
		t.Fatalf("%s, alive but stalled, is %s", node, state)
	}
	// Thawed, the engine finds the leg's connection closed and drops the
	// answer: nothing is left running on it.
	gates[node].thaw()
	wait.Until(t, 10*time.Second, node+" running nothing once thawed", func() bool {
		tc.o.c.mu.Lock()
		defer tc.o.c.mu.Unlock()
		return tc.o.c.nodes[node].hb.Running == 0
	})
}

// The watch's rules, at given times: a leg is ended when its node is down
// and it has been idle a second, or when it has sent a byte and then
// nothing for the idle time; a leg that has not begun its answer waits
// for it, however long.
func TestLegWatchRules(t *testing.T) {
	w := newLegWatch(30 * time.Second)
	t0 := time.Now()
	fresh := func() (*watchedLeg, context.Context) {
		ctx, l := w.begin(context.Background(), "http://e")
		l.start = t0
		return l, ctx
	}
	waiting, wctx := fresh()
	talking, tctx := fresh()
	talking.last.Store(t0.UnixNano())
	if n := w.sweep(t0.Add(10*time.Minute), nil); n != 1 || wctx.Err() != nil || !legHung(context.Cause(tctx)) {
		t.Fatalf("ten minutes on: %d ended; the waiting leg %v, the talking one %v", n, wctx.Err(), context.Cause(tctx))
	}
	if n := w.sweep(t0.Add(500*time.Millisecond), map[string]bool{"http://e": true}); n != 0 {
		t.Fatalf("a node down half a second into a leg's wait ended %d", n)
	}
	if n := w.sweep(t0.Add(2*time.Second), map[string]bool{"http://e": true}); n != 1 || !legHung(context.Cause(wctx)) {
		t.Fatalf("the node down: %d ended, %v", n, context.Cause(wctx))
	}
	w.end(waiting)
	if len(w.legs) != 0 {
		t.Fatalf("%d legs left watched", len(w.legs))
	}
}
