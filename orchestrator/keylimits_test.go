package orchestrator

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/evolvellm/evolve/orchestrator/apikeys"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// held is an agents' API that keeps every answer open until let go.
type held struct {
	mu      sync.Mutex
	served  int
	release chan struct{}
	started chan struct{}
}

func (h *held) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.mu.Lock()
	h.served++
	h.mu.Unlock()
	if apikeys.LimitedPath(r) {
		h.started <- struct{}{}
		<-h.release
	}
	w.WriteHeader(200)
}

func limitedOrchestrator(t *testing.T, keys ...string) (*Orchestrator, http.Handler, *held) {
	t.Helper()
	o, err := New(Config{NATSURL: "nats://127.0.0.1:1", ControlAddr: "127.0.0.1:0", APIKeys: keys, PlannerMode: PlannerOff})
	if err != nil {
		t.Fatal(err)
	}
	h := &held{release: make(chan struct{}), started: make(chan struct{}, 16)}
	return o, o.requireKey(h), h
}

// ask runs one request in the background; its recorder is ready once done
// is closed.
func ask(h http.Handler, ctx context.Context, method, path, key string) (*httptest.ResponseRecorder, chan struct{}) {
	r := httptest.NewRequest(method, path, strings.NewReader(`{}`)).WithContext(ctx)
	r.Header.Set("Authorization", "Bearer "+key)
	w := httptest.NewRecorder()
	done := make(chan struct{})
	go func() { h.ServeHTTP(w, r); close(done) }()
	return w, done
}

// A name's requests over its max-concurrency are refused with a 429 in
// the shape of the API asked once max-wait passes (here at once), while
// other names, and what is not an answer, go on.
func TestKeyLimitRefusesRequestsOverItsConcurrency(t *testing.T) {
	o, h, hd := limitedOrchestrator(t, "team-a sk-a1 max-concurrency=2 max-wait=0s", "team-a sk-a2", "team-b sk-b")
	ctx := context.Background()
	var dones []chan struct{}
	for _, key := range []string{"sk-a1", "sk-a2"} { // keys of one name share its limit
		_, d := ask(h, ctx, "POST", "/v1/chat/completions", key)
		<-hd.started
		dones = append(dones, d)
	}
	for _, c := range []struct{ path, errType, code string }{
		{"/v1/completions", "requests", "rate_limit_exceeded"},
		{"/v1/messages", "rate_limit_error", ""},
	} {
		t.Run(c.path, func(t *testing.T) {
			w, d := ask(h, ctx, "POST", c.path, "sk-a1")
			<-d
			var e struct {
				Error struct{ Type, Code, Message string } `json:"error"`
			}
			json.Unmarshal(w.Body.Bytes(), &e)
			if w.Code != 429 || w.Header().Get("Retry-After") == "" || e.Error.Type != c.errType || e.Error.Code != c.code ||
				!strings.Contains(e.Error.Message, "team-a has 2 requests in flight") {
				t.Fatalf("%s over the limit: %d %v %s", c.path, w.Code, w.Header(), w.Body)
			}
		})
	}
	if w, d := ask(h, ctx, "GET", "/v1/models", "sk-a1"); func() bool { <-d; return w.Code != 200 }() {
		t.Fatalf("a model list while the name is at its limit: %d", w.Code)
	}
	_, d := ask(h, ctx, "POST", "/v1/completions", "sk-b")
	<-hd.started // another name is not held back
	dones = append(dones, d)
	if n := testutil.ToFloat64(o.met.keyRequests.WithLabelValues("team-a", "rate_limited")); n != 2 {
		t.Fatalf("%v requests of team-a counted rate_limited, want 2", n)
	}
	if n := gauge(t, o, "evolve_router_key_in_flight", "team-a"); n != 2 {
		t.Fatalf("team-a in flight: %v, want 2", n)
	}
	if n := gauge(t, o, "evolve_router_key_max_concurrency", "team-a"); n != 2 {
		t.Fatalf("team-a's max concurrency: %v, want 2", n)
	}

	// Answers ending free their slots.
	close(hd.release)
	for _, d := range dones {
		<-d
	}
	w, d := ask(h, ctx, "POST", "/v1/completions", "sk-a1")
	<-d
	if w.Code != 200 {
		t.Fatalf("a request after the name's answers ended: %d %s", w.Code, w.Body)
	}
}

// Over its limit, a request waits for a slot, first come first served, up
// to max-wait; one whose client goes away while it waits is not served.
func TestKeyLimitQueuesRequestsUpToMaxWait(t *testing.T) {
	o, h, hd := limitedOrchestrator(t, "team-a sk-a max-concurrency=1 max-wait=1m")
	ctx := context.Background()
	_, first := ask(h, ctx, "POST", "/v1/completions", "sk-a")
	<-hd.started
	_, second := ask(h, ctx, "POST", "/v1/completions", "sk-a")
	gone, cancel := context.WithCancel(ctx)
	_, third := ask(h, gone, "POST", "/v1/completions", "sk-a")
	for gauge(t, o, "evolve_router_key_waiting", "team-a") != 2 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	<-third
	if n := testutil.ToFloat64(o.met.keyRequests.WithLabelValues("team-a", "client_gone")); n != 1 {
		t.Fatalf("%v requests counted client_gone, want the one cancelled while waiting", n)
	}
	hd.release <- struct{}{} // the first ends: the second takes its slot
	<-first
	select {
	case <-hd.started:
	case <-time.After(10 * time.Second):
		t.Fatal("the waiting request was not admitted when the first ended")
	}
	hd.release <- struct{}{}
	<-second
	if hd.served != 2 || gauge(t, o, "evolve_router_key_waiting", "team-a") != 0 || gauge(t, o, "evolve_router_key_in_flight", "team-a") != 0 {
		t.Fatalf("served %d, then %v waiting and %v in flight", hd.served, gauge(t, o, "evolve_router_key_waiting", "team-a"),
			gauge(t, o, "evolve_router_key_in_flight", "team-a"))
	}
}

// gauge is the value of a per-key gauge in the orchestrator's metrics.
func gauge(t *testing.T, o *Orchestrator, name, key string) float64 {
	t.Helper()
	mfs, err := o.met.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "key" && l.GetValue() == key {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	t.Fatalf("no %s{key=%q}", name, key)
	return 0
}
