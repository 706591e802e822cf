package loadgen

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/evolvellm/evolve/workload"
)

// flakyRouter is a router on a fixed loopback port that can go away
// (connections refused) and come back on the same port.
type flakyRouter struct {
	t       *testing.T
	addr    string
	srv     *http.Server
	handler http.Handler
	served  atomic.Int64 // completions answered
}

func newFlakyRouter(t *testing.T) *flakyRouter {
	f := &flakyRouter{t: t}
	f.handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == "GET" && r.URL.Path == "/v1/models":
			fmt.Fprint(w, `{"object": "list", "data": [{"id": "m", "max_model_len": 1000000}]}`)
		case r.Method == "POST" && r.URL.Path == "/v1/completions":
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: {\"choices\": [{\"text\": \"ok\"}]}\n\n")
			fmt.Fprint(w, "data: {\"choices\": [], \"usage\": {\"prompt_tokens\": 10, \"completion_tokens\": 1}}\n\ndata: [DONE]\n\n")
			f.served.Add(1)
		default:
			http.NotFound(w, r)
		}
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.addr = ln.Addr().String()
	f.serve(ln)
	t.Cleanup(f.stop)
	return f
}

func (f *flakyRouter) serve(ln net.Listener) {
	f.srv = &http.Server{Handler: f.handler}
	go f.srv.Serve(ln)
}

// stop closes the listener and every connection: calls are refused.
func (f *flakyRouter) stop() { f.srv.Close() }

// start listens on the same port again.
func (f *flakyRouter) start() {
	var ln net.Listener
	var err error
	for range 50 { // the port may linger a moment
		if ln, err = net.Listen("tcp", f.addr); err == nil {
			f.serve(ln)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	f.t.Fatalf("listening on %s again: %v", f.addr, err)
}

// waitServed waits until the router has answered n completions.
func (f *flakyRouter) waitServed(n int64) {
	waitCount(f.t, "the router answered", "completions", n, f.served.Load)
}

// waitCount waits up to 20 s until count reaches n.
func waitCount(t *testing.T, who, what string, n int64, count func() int64) {
	deadline := time.Now().Add(20 * time.Second)
	for count() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%s %d %s in 20 s, want %d", who, count(), what, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A router that goes away mid-run ends the run once calls have been refused
// for the Unreachable time, rather than counting errors until its end: the
// result keeps what was measured and says when the router went.
func TestBenchStopsWhenTheRouterIsGone(t *testing.T) {
	for _, replay := range []bool{false, true} {
		t.Run(map[bool]string{false: "agents", true: "replay"}[replay], func(t *testing.T) {
			f := newFlakyRouter(t)
			type out struct {
				res Result
				err error
			}
			done := make(chan out, 1)
			// The router goes once the bench itself has counted three
			// requests: the router's own count runs ahead of the client's
			// (an answer written is not yet an answer read).
			var counted atomic.Int64
			cfg := BenchConfig{URL: "http://" + f.addr, Duration: 2 * time.Minute, Speedup: 1000, Seed: 1, Unreachable: time.Second,
				Progress: func(s Snapshot) { counted.Store(int64(s.Requests)) }, ProgressEvery: 5 * time.Millisecond}
			go func() {
				var o out
				if replay {
					recs := make([]workload.TraceRecord, 3000) // one every 40 ms for 2 minutes
					for i := range recs {
						recs[i] = workload.TraceRecord{Timestamp: float64(40 * i), InputLength: 64, OutputLength: 1, HashIDs: []int64{int64(i)}}
					}
					o.res, _, o.err = Replay(context.Background(), ReplayConfig{BenchConfig: cfg, Records: recs, Playback: 1})
				} else {
					model, err := workload.New("math", 2)
					if err != nil {
						o.err = err
					} else {
						cfg.Model, cfg.Agents = model, 2
						o.res, o.err = Bench(context.Background(), cfg)
					}
				}
				done <- o
			}()
			waitCount(t, "the bench counted", "requests", 3, counted.Load)
			f.stop()
			gone := time.Now()
			var o out
			select {
			case o = <-done:
			case <-time.After(time.Minute):
				t.Fatal("the run went on for a minute against a router that is gone")
			}
			if o.err != nil {
				t.Fatal(o.err)
			}
			res := o.res
			if !res.RouterGone || res.Requests < 3 || res.Retried < 2 {
				t.Fatalf("router gone %v, %d requests, %d retried: want it noticed after the requests served, the calls refused sent again meanwhile", res.RouterGone, res.Requests, res.Retried)
			}
			if since := gone.Sub(time.Now().Add(-time.Duration(res.DurationSec * float64(time.Second)))).Seconds(); res.RouterGoneAtS < since-0.5 || res.RouterGoneAtS > res.DurationSec-0.9 {
				t.Fatalf("router unreachable since %.2fs of a %.2fs run; it went at about %.2fs and the run waited 1 s more", res.RouterGoneAtS, res.DurationSec, since)
			}
			// Throughput is over the time the router served, not the
			// wait for it after.
			if want := float64(res.OutputTokens) / res.RouterGoneAtS; res.OutputTokens == 0 || res.TokensPerSec != want {
				t.Fatalf("%d output tokens, %.1f tokens/s: want %.1f, over the %.2fs served", res.OutputTokens, res.TokensPerSec, want, res.RouterGoneAtS)
			}
		})
	}
}

// A router that is back within the Unreachable time (a restart) keeps the
// run going, and so does one that is gone when Unreachable is negative.
func TestBenchRidesOutARouterRestart(t *testing.T) {
	model, err := workload.New("math", 2)
	if err != nil {
		t.Fatal(err)
	}
	f := newFlakyRouter(t)
	done := make(chan Result, 1)
	go func() {
		res, err := Bench(context.Background(), BenchConfig{URL: "http://" + f.addr, Model: model, Agents: 2, Duration: 6 * time.Second,
			Speedup: 1000, Seed: 1, Unreachable: 4 * time.Second})
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	f.waitServed(3)
	f.stop()
	time.Sleep(1500 * time.Millisecond) // agents fail to connect meanwhile
	before := f.served.Load()
	f.start()
	f.waitServed(before + 3)
	res := <-done
	// The calls refused while it restarted are sent again, as the SDKs
	// do, and lost none.
	if res.RouterGone || res.Errors != 0 || res.Retried < 1 || res.DurationSec < 5.5 {
		t.Fatalf("router gone %v, %d errors, %d retried, %.1fs: want the run to go on after the restart to its end, no call lost", res.RouterGone, res.Errors, res.Retried, res.DurationSec)
	}

	// Never give up: the run lasts its time against a router that is gone.
	g := newFlakyRouter(t)
	never := make(chan Result, 1)
	go func() {
		res, err := Bench(context.Background(), BenchConfig{URL: "http://" + g.addr, Model: model, Agents: 2, Duration: 3 * time.Second,
			Speedup: 1000, Seed: 1, Unreachable: -1})
		if err != nil {
			t.Error(err)
		}
		never <- res
	}()
	g.waitServed(1)
	g.stop()
	res = <-never
	if res.RouterGone || res.DurationSec < 2.5 || res.Retried < 2 {
		t.Fatalf("router gone %v after %.1fs with %d calls retried: want no early stop, the calls sent again and again", res.RouterGone, res.DurationSec, res.Retried)
	}
}

// Only a call that cannot connect counts towards giving up; an answer of
// any status, or a connection lost mid-answer, does not.
func TestCannotConnect(t *testing.T) {
	_, err := http.Get("http://127.0.0.1:1/")
	if err == nil || !cannotConnect(err) {
		t.Fatalf("%v: want a failure to connect", err)
	}
	for _, e := range []error{errors.New("503 Service Unavailable"), &net.OpError{Op: "read", Err: errors.New("connection reset by peer")}} {
		if cannotConnect(e) {
			t.Fatalf("%v counted as a failure to connect", e)
		}
	}
}
