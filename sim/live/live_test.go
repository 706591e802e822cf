package live

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/evolvellm/evolve/controlapi"
	"github.com/evolvellm/evolve/engine/stepmodel"
	"github.com/evolvellm/evolve/sim"
)

func scenario(t *testing.T) sim.Scenario {
	t.Helper()
	p, err := stepmodel.BuiltinProfile("gb300-kimi-k2")
	if err != nil {
		t.Fatal(err)
	}
	return sim.Scenario{Profile: p, Engines: 3, Workload: "coding", Agents: 6, Warmup: 0, Duration: 3 * time.Minute, Seed: 7}
}

func getJSON(t *testing.T, url string, out any) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if out != nil {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			t.Fatalf("%s: %v", url, err)
		}
	}
	return resp.StatusCode
}

// The server follows two simulations as they run: the watch stream starts
// with a snapshot and carries every node change with a new generation,
// the summaries move, branches come once asked for, switching is refused.
func TestServesSimulationsAsTheyRun(t *testing.T) {
	srv := New([]string{"static:1:2", "evolve"}, "test-model", 0)
	var slept time.Duration
	srv.Sleep = func(d time.Duration) { slept += d }
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()
	sc := scenario(t)

	// Run the first minute of each (the stream needs a first state), then
	// watch while the rest runs.
	var index struct {
		Simulations []struct{ Policy, Path string }
	}
	if getJSON(t, hs.URL+"/", &index) != 200 || len(index.Simulations) != 2 || index.Simulations[1].Path != "/evolve" {
		t.Fatalf("index %+v", index)
	}
	first := sc
	first.Duration = time.Minute
	if _, err := sim.Compare(first, []string{"static:1:2"}, &sim.Hooks{Watch: srv.Watch}); err != nil {
		t.Fatal(err)
	}
	// Branches are computed only once asked for.
	var br []map[string]any
	if getJSON(t, hs.URL+"/evolve/api/v1/branches", &br); len(br) != 0 {
		t.Fatalf("branches before any evolve state: %v", br)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	events := make(chan controlapi.WatchEvent, 10000)
	go (&controlapi.Client{Base: hs.URL}).Watch(ctx, "/static:1:2/api/v1/watch", events)
	snap := <-events
	if snap.Type != "snapshot" || len(snap.Nodes) != 3 {
		t.Fatalf("first event %+v", snap)
	}
	res, err := sim.Compare(sc, []string{"static:1:2", "evolve"}, &sim.Hooks{Watch: srv.Watch, Done: func(p string, _ sim.Result) { srv.Done(p) }})
	if err != nil || len(res) != 2 {
		t.Fatal(err)
	}
	gen := snap.Generation
	nodeEvents := 0
	for nodeEvents < 20 {
		ev := <-events
		if ev.Type != "node" || ev.Generation <= gen {
			t.Fatalf("event after generation %v: %+v", gen, ev)
		}
		gen = ev.Generation
		nodeEvents++
	}

	var c struct {
		Policy     string
		Simulation struct {
			ElapsedSec float64 `json:"elapsed_s"`
			Done       bool
			Requests   int `json:"requests_completed"`
		}
	}
	getJSON(t, hs.URL+"/evolve/api/v1/cluster", &c)
	if c.Policy != "evolve" || !c.Simulation.Done || c.Simulation.ElapsedSec < 170 || c.Simulation.Requests == 0 {
		t.Fatalf("cluster %+v", c)
	}
	if code := getJSON(t, hs.URL+"/evolve/api/v1/planner", nil); code != 200 {
		t.Fatalf("evolve's planner: %d", code)
	}
	if code := getJSON(t, hs.URL+"/static:1:2/api/v1/planner", nil); code != 404 {
		t.Fatalf("a static split's planner: %d, want 404", code)
	}
	if getJSON(t, hs.URL+"/evolve/api/v1/branches", &br); len(br) == 0 {
		t.Fatal("no branches after they were asked for")
	}
	var kv struct {
		PromptTokens int64   `json:"prompt_tokens"`
		GPUHitRate   float64 `json:"gpu_hit_rate"`
		Nodes        []struct {
			ID    string
			Share float64 `json:"referenced_share"`
		}
	}
	if getJSON(t, hs.URL+"/evolve/api/v1/kv", &kv); kv.PromptTokens == 0 || kv.GPUHitRate <= 0 || len(kv.Nodes) != 3 {
		t.Fatalf("kv %+v", kv)
	}
	shared := 0.0
	for _, n := range kv.Nodes {
		shared = max(shared, n.Share)
	}
	if shared <= 0 || shared > 1 {
		t.Fatalf("referenced shares %+v: want some in (0, 1]", kv.Nodes)
	}
	r, _ := http.Post(hs.URL+"/evolve/api/v1/nodes/e0/role", "application/json", strings.NewReader(`{"role":"decode","pin":true}`))
	if r.StatusCode != 403 {
		t.Fatalf("switching a simulated node: %d, want 403", r.StatusCode)
	}
	r.Body.Close()
	if code := getJSON(t, hs.URL+"/nope/api/v1/nodes", nil); code != 404 {
		t.Fatalf("unknown policy: %d", code)
	}
	if slept != 0 {
		t.Fatalf("pace 0 slept %v", slept)
	}
}

// At a pace, the watcher holds the run back to modelled time / pace.
func TestPaceHoldsTheRunBack(t *testing.T) {
	srv := New([]string{"static:1:2"}, "m", 60)
	wall := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	srv.Now = func() time.Time { return wall }
	srv.Sleep = func(d time.Duration) { wall = wall.Add(d) }
	sc := scenario(t)
	sc.Duration = 2 * time.Minute
	if _, err := sim.Compare(sc, []string{"static:1:2"}, &sim.Hooks{Watch: srv.Watch}); err != nil {
		t.Fatal(err)
	}
	// 120 modelled seconds at 60x: 2 s of wall time (the last state is
	// taken at 120 s).
	if got := wall.Sub(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)); got < 1900*time.Millisecond || got > 2100*time.Millisecond {
		t.Fatalf("2 modelled minutes at 60x took %v of wall time, want 2 s", got)
	}
}
