package engine

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/evolvellm/evolve/kv"
	"github.com/evolvellm/evolve/protocol"
	"github.com/evolvellm/evolve/roles"
)

// sink records what the engine publishes.
type sink struct {
	mu     sync.Mutex
	events []kv.Event
	passes int
}

func (s *sink) KVEvents(ev []kv.Event) {
	s.mu.Lock()
	s.events = append(s.events, ev...)
	s.mu.Unlock()
}
func (s *sink) Pass(protocol.PassRecord) { s.mu.Lock(); s.passes++; s.mu.Unlock() }

func startInProcess(t *testing.T, speedup float64) (*Simulated, *httptest.Server, *sink) {
	t.Helper()
	sk := &sink{}
	e, srv := startEngine(t, "t1", roles.Both, speedup, sk)
	return e, srv, sk
}

// Many concurrent clients, streamed and not, with control operations in
// between: every request gets all its tokens, in order, and the KV event
// stream stays gapless.
func TestConcurrentRequestsAndControl(t *testing.T) {
	e, srv, sk := startInProcess(t, 50)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := 0; i < 24; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			stream := i%2 == 0
			body := fmt.Sprintf(`{"prompt": "%s request %d", "max_tokens": %d, "stream": %v}`, strings.Repeat("shared context ", 40), i, 5+i, stream)
			resp, err := http.Post(srv.URL+"/v1/completions", "application/json", strings.NewReader(body))
			if err != nil {
				errs <- err
				return
			}
			defer resp.Body.Close()
			if !stream {
				var out struct {
					Usage struct {
						CompletionTokens int `json:"completion_tokens"`
					} `json:"usage"`
				}
				if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || out.Usage.CompletionTokens != 5+i {
					errs <- fmt.Errorf("request %d: %v %+v", i, err, out)
				}
				return
			}
			sc := bufio.NewScanner(resp.Body)
			chunks, done := 0, false
			for sc.Scan() {
				line := sc.Text()
				if line == "data: [DONE]" {
					done = true
				} else if strings.HasPrefix(line, "data: ") {
					chunks++
				}
			}
			if !done || chunks != 5+i+1 { // one chunk per token, then the finish chunk
				errs <- fmt.Errorf("stream %d: %d chunks, done %v", i, chunks, done)
			}
		}(i)
	}
	for _, op := range []string{protocol.OpStatus, protocol.OpOffload, protocol.OpResync, protocol.OpStatus} {
		if rep := e.Control(context.Background(), protocol.ControlRequest{Op: op}); !rep.OK {
			t.Errorf("%s: %+v", op, rep)
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	sk.mu.Lock()
	defer sk.mu.Unlock()
	for i, ev := range sk.events {
		if ev.Seq != uint64(i+1) {
			t.Fatalf("event %d has seq %d", i, ev.Seq)
		}
	}
	if sk.passes == 0 {
		t.Fatal("no pass records")
	}
}

func TestHealthAndModels(t *testing.T) {
	_, srv, _ := startInProcess(t, 10)
	for _, path := range []string{"/health", "/v1/models"} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(b), "evolve-tiny") {
			t.Fatalf("%s: %d %s", path, resp.StatusCode, b)
		}
	}
	resp, err := http.Get(srv.URL + "/nope")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 404 {
		t.Fatalf("unknown path: %d", resp.StatusCode)
	}
}

func TestSpeedupScalesWallTime(t *testing.T) {
	// 200 decode passes of ~2 ms modelled each: ~0.4 s modelled. At 100x
	// that is a few ms of wall time; the modelled time reported stays ~0.4 s.
	_, srv, _ := startInProcess(t, 100)
	start := time.Now()
	resp, err := http.Post(srv.URL+"/v1/completions", "application/json", strings.NewReader(`{"prompt": "count", "max_tokens": 200}`))
	if err != nil {
		t.Fatal(err)
	}
	var out struct {
		Evolve protocol.ResponseKV `json:"evolve"`
	}
	json.NewDecoder(resp.Body).Decode(&out)
	resp.Body.Close()
	wall := time.Since(start)
	if out.Evolve.E2ESec < 0.39 {
		t.Fatalf("modelled latency %.3f s, want about 0.4 s", out.Evolve.E2ESec)
	}
	if wall.Seconds() >= out.Evolve.E2ESec {
		t.Fatalf("wall time %v not shorter than modelled %.3f s at 100x", wall, out.Evolve.E2ESec)
	}
}

// Requests that arrive while passes run back to back are dated on the
// model's timeline: each one's queue time, TTFT and end-to-end latency
// are in order and none is negative, even when the loop wakes late (as it
// does at a high speedup, where timer slack is large against a pass).
func TestLatenciesOfRequestsArrivingMidPass(t *testing.T) {
	_, srv, _ := startInProcess(t, 200)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var bad []string
	for i := 0; i < 48; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			time.Sleep(time.Duration(i%12) * time.Millisecond) // arrive during passes
			body := fmt.Sprintf(`{"prompt": "%s %d", "max_tokens": 30}`, strings.Repeat("context ", 200), i)
			resp, err := http.Post(srv.URL+"/v1/completions", "application/json", strings.NewReader(body))
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			var out struct {
				Evolve protocol.ResponseKV `json:"evolve"`
			}
			if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
				t.Error(err)
				return
			}
			if ev := out.Evolve; ev.QueueSec < 0 || ev.TTFTSec < ev.QueueSec || ev.E2ESec < ev.TTFTSec {
				mu.Lock()
				bad = append(bad, fmt.Sprintf("request %d: queue %.4fs, TTFT %.4fs, E2E %.4fs", i, ev.QueueSec, ev.TTFTSec, ev.E2ESec))
				mu.Unlock()
			}
		}(i)
	}
	wg.Wait()
	if len(bad) > 0 {
		t.Fatalf("%d of 48 requests with latencies out of order:\n%s", len(bad), strings.Join(bad, "\n"))
	}
}
