package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/evolvellm/evolve/engine/stepmodel"
	"github.com/evolvellm/evolve/workload"
)

// A watched run reports the cluster every tick and gives the same figures,
// byte for byte, as an unwatched one.
func TestWatchingChangesNothing(t *testing.T) {
	sc := smallScenario(t, "coding")
	sc.Duration += 1234567 * time.Microsecond // not a whole number of watch ticks or minutes
	pol, _ := ParsePolicy("static:1:2", 3)
	plain, err := Run(sc, pol)
	if err != nil {
		t.Fatal(err)
	}
	var states []*State
	withBlocks := 0
	watched, err := RunWatched(sc, pol, func(s *State) {
		states = append(states, s)
		for _, b := range s.Branches() {
			for _, r := range b.Residency {
				if r.GPU > 0 {
					withBlocks++
				}
			}
		}
	}, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ja, _ := json.Marshal(plain)
	jb, _ := json.Marshal(watched)
	var ta, tb bytes.Buffer
	WriteTimeline(&ta, []Result{plain})
	WriteTimeline(&tb, []Result{watched})
	if string(ja) != string(jb) || ta.String() != tb.String() {
		t.Fatalf("watching changed the run:\n%s\n%s", ja, jb)
	}
	if want := int((sc.Warmup+sc.Duration)/(10*time.Second)) + 1; len(states) < want-1 || len(states) > want {
		t.Fatalf("%d states over %v at 10 s, want %d", len(states), sc.Warmup+sc.Duration, want)
	}
	last := states[len(states)-1]
	if !last.Final || states[len(states)-2].Final {
		t.Fatal("only the last state is marked final")
	}
	if last.Elapsed <= states[0].Elapsed || last.Requests == 0 || last.PromptTokens == 0 || last.LastMinute.Requests == 0 {
		t.Fatalf("last state: %+v", last)
	}
	roles := map[string]int{}
	busy := 0.0
	for _, n := range last.Nodes {
		roles[n.Role]++
		busy = max(busy, n.TokensPerSec)
		if n.State != "serving" || n.GPUCapacity == 0 || n.Passes == 0 {
			t.Fatalf("node %+v", n)
		}
	}
	if busy <= 0 {
		t.Fatalf("no node processed a token in the last tick: %+v", last.Nodes)
	}
	if roles["prefill"] != 1 || roles["decode"] != 2 {
		t.Fatalf("roles %v, want 1 prefill and 2 decode", roles)
	}
	if withBlocks == 0 || last.LiveBranches == 0 {
		t.Fatalf("no branch ever had blocks on a GPU (%d live branches at the end)", last.LiveBranches)
	}
}

// Dynamo's planner removing workers shows in the watched nodes: their
// state and their history.
func TestWatchShowsRoleChanges(t *testing.T) {
	p, err := stepmodel.BuiltinProfile("gb300-kimi-k2")
	if err != nil {
		t.Fatal(err)
	}
	sc := Scenario{Profile: p, Engines: 6, Workload: "computer-use", Agents: 4, Warmup: time.Minute, Duration: 10 * time.Minute, Seed: 3}
	var last *State
	states := map[string]bool{}
	res, err := Compare(sc, []string{"dynamo"}, &Hooks{Watch: func(s *State) {
		last = s
		for _, n := range s.Nodes {
			states[n.State] = true
		}
	}, WatchEvery: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if res[0].RoleSwitches < 2 || !states["draining"] || !states["down"] {
		t.Fatalf("%d switches; states seen %v", res[0].RoleSwitches, states)
	}
	changes := 0
	for _, n := range last.Nodes {
		for _, h := range n.History {
			if h.To == "down" && h.Reason != "" && !h.Time.IsZero() {
				changes++
			}
		}
	}
	if changes == 0 {
		t.Fatalf("no node's history records its removal: %+v", last.Nodes)
	}
}

// A run that goes idle before its end: the watcher's ticks go on to the
// end, and must not stretch the modelled time the run reports.
func TestWatchingAnIdleRunKeepsItsTime(t *testing.T) {
	sc := smallScenario(t, "coding")
	sc.Agents, sc.Warmup, sc.Duration = 0, 0, 2*time.Minute+1234567*time.Microsecond
	sc.Trace = []workload.TraceRecord{{Timestamp: 0, InputLength: 300, OutputLength: 5, HashIDs: []int64{1}}}
	pol, _ := ParsePolicy("static:1:2", 3)
	plain, err := Run(sc, pol)
	if err != nil {
		t.Fatal(err)
	}
	watched, err := RunWatched(sc, pol, func(*State) {}, 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if plain.Requests != 1 || watched.VirtualSec != plain.VirtualSec {
		t.Fatalf("modelled %.3f s watched, %.3f s unwatched (%d requests)", watched.VirtualSec, plain.VirtualSec, plain.Requests)
	}
}

// Progress reports come every modelled minute, name their simulation, and
// change nothing the run computes; nor does hearing every call.
func TestProgressChangesNothing(t *testing.T) {
	sc := smallScenario(t, "coding")
	pol, _ := ParsePolicy("static:1:2", 3)
	plain, err := Run(sc, pol)
	if err != nil {
		t.Fatal(err)
	}
	var seen []time.Duration
	calls, last := 0, time.Duration(0)
	hooks := &Hooks{Progress: func(policy string, elapsed, total time.Duration) {
		if policy != "static:1:2" || total != sc.Warmup+sc.Duration {
			t.Errorf("progress of %q: total %v, want %v", policy, total, sc.Warmup+sc.Duration)
		}
		seen = append(seen, elapsed)
	}, Call: func(policy string, at time.Duration, call workload.Call) {
		// Calls, heard as they arrive, in time order (evolve sim --record).
		if policy != "static:1:2" || at < last || len(call.Tokens) == 0 || call.Session == "" {
			t.Errorf("call of %q at %v after %v: %d tokens, session %q", policy, at, last, len(call.Tokens), call.Session)
		}
		calls, last = calls+1, at
	}}
	res, err := Compare(sc, []string{"static:1:2"}, hooks)
	if err != nil {
		t.Fatal(err)
	}
	ja, _ := json.Marshal(plain)
	jb, _ := json.Marshal(res[0])
	if string(ja) != string(jb) {
		t.Fatalf("reporting progress and calls changed the run:\n%s\n%s", ja, jb)
	}
	if calls < plain.Requests {
		t.Fatalf("heard %d calls, and %d requests completed", calls, plain.Requests)
	}
	if want := int((sc.Warmup + sc.Duration) / time.Minute); len(seen) != want {
		t.Fatalf("%d progress reports over %v, want one a minute (%d): %v", len(seen), sc.Warmup+sc.Duration, want, seen)
	}
	for i, e := range seen {
		if e != time.Duration(i+1)*time.Minute {
			t.Fatalf("report %d at %v of modelled time, want %v", i, e, time.Duration(i+1)*time.Minute)
		}
	}
}

// Cancelled stops a comparison: what ended keeps its result (the same as
// an uncancelled run's), a sweep missing a member has none, and the error
// says how far each unfinished simulation got.
func TestCancelledComparisonKeepsWhatEnded(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1)) // one simulation at a time: a known order
	sc := smallScenario(t, "coding")
	pol, _ := ParsePolicy("dynamo", 3)
	plain, err := Run(sc, pol)
	if err != nil {
		t.Fatal(err)
	}
	// Longest first: dynamo (a planner) ends; static:1:2 (Dynamo's recipe
	// ratio) is stopped 2 minutes in; static:2:1 never begins.
	var cut bool
	var started []string
	hooks := &Hooks{
		Start: func(p string) { started = append(started, p) },
		Progress: func(p string, elapsed, _ time.Duration) {
			if p == "static:1:2" && elapsed >= 2*time.Minute {
				cut = true
			}
		},
		Cancelled: func() bool { return cut },
	}
	res, err := Compare(sc, []string{"static:1:2", "static:best", "dynamo"}, hooks)
	var ie *InterruptedError
	if !errors.Is(err, ErrInterrupted) || !errors.As(err, &ie) {
		t.Fatalf("want an interruption, got %v", err)
	}
	if len(res) != 1 || res[0].Policy != "dynamo" {
		t.Fatalf("results %+v", res)
	}
	ja, _ := json.Marshal(plain)
	jb, _ := json.Marshal(res[0])
	if string(ja) != string(jb) {
		t.Fatalf("the finished run differs from a plain one:\n%s\n%s", ja, jb)
	}
	if !slices.Equal(ie.Names, []string{"static:1:2", "static:best"}) || len(ie.Unfinished) != 2 ||
		ie.Unfinished[0] != (Unfinished{"static:1:2", 2 * time.Minute, sc.Warmup + sc.Duration}) ||
		ie.Unfinished[1] != (Unfinished{"static:2:1", 0, sc.Warmup + sc.Duration}) {
		t.Fatalf("interruption %+v", ie)
	}
	if !slices.Equal(started, []string{"dynamo", "static:1:2"}) {
		t.Fatalf("started %v: a simulation began after the cancel", started)
	}
	if msg := err.Error(); msg != "interrupted: no result for static:1:2, static:best (static:1:2 at 50%, static:2:1 at 0%)" {
		t.Fatalf("message %q", msg)
	}
}
