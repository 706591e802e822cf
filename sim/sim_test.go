package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/evolvellm/evolve/engine/stepmodel"
)

func smallScenario(t *testing.T, workload string) Scenario {
	t.Helper()
	p, err := stepmodel.BuiltinProfile("gb300-kimi-k2")
	if err != nil {
		t.Fatal(err)
	}
	return Scenario{Profile: p, Engines: 3, Workload: workload, Agents: 6, Warmup: time.Minute, Duration: 3 * time.Minute, Seed: 7}
}

func TestRunServesAgents(t *testing.T) {
	for _, wl := range []string{"coding", "math", "computer-use"} {
		t.Run(wl, func(t *testing.T) {
			sc := smallScenario(t, wl)
			for _, name := range []string{"static:1:2", "dynamo-static:1:2"} {
				pol, err := ParsePolicy(name, 3)
				if err != nil {
					t.Fatal(err)
				}
				res, err := Run(sc, pol)
				if err != nil {
					t.Fatal(err)
				}
				if res.Requests == 0 || res.MeanE2E <= 0 || res.P50TTFT <= 0 || res.Throughput <= 0 || res.P99E2E < res.P50E2E {
					t.Fatalf("%s: %+v", name, res)
				}
				if res.PromptTokens <= 0 || res.GPUHitTokens+res.HostHitTokens+res.ComputedTokens < res.PromptTokens/2 {
					t.Fatalf("%s: prompt KV sources do not add up: %+v", name, res)
				}
				if res.VirtualSec < sc.Warmup.Seconds()+sc.Duration.Seconds()-60 {
					t.Fatalf("%s: simulated only %.0f s", name, res.VirtualSec)
				}
			}
		})
	}
}

func TestSameSeedSameResult(t *testing.T) {
	sc := smallScenario(t, "coding")
	a, err := Compare(sc, []string{"static:1:2", "dynamo-static:1:2"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Compare(sc, []string{"static:1:2", "dynamo-static:1:2"}, nil)
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	if string(ja) != string(jb) {
		t.Fatalf("two runs with seed %d differ:\n%s\n%s", sc.Seed, ja, jb)
	}
	sc.Seed++
	c, _ := Compare(sc, []string{"static:1:2"}, nil)
	if c[0].MeanE2E == a[0].MeanE2E && c[0].Requests == a[0].Requests {
		t.Fatal("another seed gave the very same result")
	}
}

// static:best is the split of lowest mean end-to-end latency, and
// static:best-throughput the split of most output tokens a second, from
// the same runs: where throughput is the claim, a baseline selected by
// latency would be weaker than it can be.
func TestBestSweepsSplits(t *testing.T) {
	sc := smallScenario(t, "coding")
	res, err := Compare(sc, []string{"static:best", "static:best-throughput", "static:1:2", "static:2:1"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	best, fastest := res[0], res[1]
	if best.Policy != "static:best" || (best.Split != "1:2" && best.Split != "2:1") {
		t.Fatalf("best: %+v", best)
	}
	if fastest.Policy != "static:best-throughput" || (fastest.Split != "1:2" && fastest.Split != "2:1") {
		t.Fatalf("best for throughput: %+v", fastest)
	}
	for _, r := range res[2:] {
		if better(r, best) {
			t.Fatalf("%s (%v) beats static:best (%v)", r.Policy, r.MeanE2E, best.MeanE2E)
		}
		if r.Throughput > fastest.Throughput {
			t.Fatalf("%s (%.0f tok/s) beats static:best-throughput (%.0f tok/s)", r.Policy, r.Throughput, fastest.Throughput)
		}
	}
	if _, err := Compare(sc, []string{"evolve:best-throughput"}, nil); err == nil {
		t.Fatal("a sweep of a policy that does not sweep")
	}
}

func TestPolicyNames(t *testing.T) {
	for _, bad := range []string{"static:3:1", "static:0:3", "oracle", "static:x:y"} {
		if _, err := ParsePolicy(bad, 3); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if p, err := ParsePolicy("evolve", 9); err != nil || p.Prefill != 3 || p.Router != "evolve" {
		t.Fatalf("evolve: %+v %v", p, err)
	}
	if p, _ := ParsePolicy("dynamo-static:2:7", 9); !p.WriteThrough || p.Router != "dynamo" {
		t.Fatalf("dynamo-static: %+v", p)
	}
}

// Dynamo's load planner removes workers from a lightly loaded cluster (as
// its thresholds say it must), cold-starts any it adds, and every request
// a removal aborts is sent again and served.
func TestDynamoPlannerShrinksLightCluster(t *testing.T) {
	p, err := stepmodel.BuiltinProfile("gb300-kimi-k2")
	if err != nil {
		t.Fatal(err)
	}
	sc := Scenario{Profile: p, Engines: 6, Workload: "computer-use", Agents: 4, Warmup: time.Minute, Duration: 10 * time.Minute, Seed: 3}
	dyn, _ := ParsePolicy("dynamo", 6)
	res, err := Run(sc, dyn)
	if err != nil {
		t.Fatal(err)
	}
	if res.RoleSwitches < 2 {
		t.Fatalf("the planner never shrank a 2P/4D cluster serving 4 agents: %+v", res)
	}
	if res.Requests == 0 || res.MeanE2E <= 0 {
		t.Fatalf("no service: %+v", res)
	}
	static, _ := ParsePolicy("dynamo-static:2:4", 6)
	fixed, _ := Run(sc, static)
	if fixed.RoleSwitches != 0 || fixed.Retried != 0 {
		t.Fatalf("a fixed split moved: %+v", fixed)
	}
}

// Under a load past its pools' capacity on a full budget the planner
// cannot add workers; with free slots it adds them after the cold start.
func TestDynamoPlannerGrowsAfterColdStart(t *testing.T) {
	p, err := stepmodel.BuiltinProfile("gb300-kimi-k2")
	if err != nil {
		t.Fatal(err)
	}
	sc := Scenario{Profile: p, Engines: 3, Workload: "coding", Agents: 20, Warmup: 0, Duration: 5 * time.Minute, Seed: 5}
	dyn, _ := ParsePolicy("dynamo", 3)
	a, err := Run(sc, dyn)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Run(sc, dyn)
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	if string(ja) != string(jb) || len(a.Timeline) != len(b.Timeline) {
		t.Fatal("the planner is not deterministic")
	}
	if a.Requests == 0 {
		t.Fatalf("%+v", a)
	}
}

func TestDynamoBestIsTheBestDynamo(t *testing.T) {
	sc := smallScenario(t, "coding")
	res, err := Compare(sc, []string{"dynamo:best", "dynamo", "dynamo-static:1:2", "dynamo-static:2:1"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res[1:] {
		if better(r, res[0]) {
			t.Fatalf("%s (%.3f s) beats dynamo:best (%.3f s)", r.Policy, r.MeanE2E, res[0].MeanE2E)
		}
	}
}

// The oracle searches schedules of splits from the best static one: by
// construction never below static:best on its own metric, it follows the
// schedule it reports (its switches are made), and on a workload that
// shifts from output-heavy to prompt-heavy evolve's planner stays at or
// below it.
func TestOracleSearchesSchedules(t *testing.T) {
	p, err := stepmodel.BuiltinProfile("gb300-kimi-k2")
	if err != nil {
		t.Fatal(err)
	}
	// Coarse KV blocks, as evolve sim --kv-block-tokens, for a test that
	// runs in a minute under -race on a 2-core machine: the logic tested
	// is the same at any block size.
	if p, err = p.WithBlockSize(512); err != nil {
		t.Fatal(err)
	}
	sc := Scenario{Profile: p, Engines: 4, Workload: "shift:math>computer-use:6m:2m:6m", Agents: 30,
		Warmup: time.Minute, Duration: 13 * time.Minute, Seed: 3, OracleSegment: 2 * time.Minute}
	var progress []time.Duration
	res, err := Compare(sc, []string{"oracle", "oracle-throughput", "static:best", "static:best-throughput", "evolve"},
		&Hooks{Progress: func(name string, done, total time.Duration) {
			if name == "oracle" {
				progress = append(progress, done)
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	o, ot, best, bestT, ev := res[0], res[1], res[2], res[3], res[4]
	for _, r := range res {
		t.Logf("%-22s split %-28s mean E2E %.2f s, %.0f tok/s, %d switches", r.Policy, r.Split, r.MeanE2E, r.Throughput, r.RoleSwitches)
	}
	if o.Policy != "oracle" || o.Requests == 0 || !strings.Contains(o.Split, ":") {
		t.Fatalf("oracle: %+v", o)
	}
	if o.MeanE2E > best.MeanE2E || ot.Throughput < bestT.Throughput {
		t.Errorf("oracle below static:best: %.3f s against %.3f s, %.0f tok/s against %.0f", o.MeanE2E, best.MeanE2E, ot.Throughput, bestT.Throughput)
	}
	if ev.MeanE2E < o.MeanE2E || ev.Throughput > ot.Throughput {
		t.Errorf("evolve beat the oracle: %.3f s against %.3f s, %.0f tok/s against %.0f", ev.MeanE2E, o.MeanE2E, ev.Throughput, ot.Throughput)
	}
	if moves := strings.Contains(o.Split, " at ") || strings.Contains(o.Split, "'s "); moves != (o.RoleSwitches > 0) {
		t.Errorf("oracle schedule %q with %d switches", o.Split, o.RoleSwitches)
	}
	if len(progress) < 2 || progress[len(progress)-1] != sc.Warmup+sc.Duration {
		t.Errorf("oracle progress %v", progress)
	}
	// Stopped once the runs it starts from are done (three static splits,
	// evolve and dynamo), the search stops within its runs and names the
	// oracle as cut short.
	var done atomic.Int32 // hooks are called from the runs' goroutines
	_, err = Compare(sc, []string{"oracle"}, &Hooks{Done: func(string, Result) { done.Add(1) }, Cancelled: func() bool { return done.Load() >= 5 }})
	var ie *InterruptedError
	if !errors.As(err, &ie) || !slices.Equal(ie.Names, []string{"oracle"}) || len(ie.Unfinished) != 1 || ie.Unfinished[0].Policy != "oracle" {
		t.Errorf("oracle stopped after the static runs: %v", err)
	}
	// A schedule is followed: switches happen at its times, by the
	// planner's protocol, and a schedule back to the start split ends there.
	pol, _ := ParsePolicy("static:1:3", 4)
	pol.Schedule = []SplitChange{{At: 4 * time.Minute, Prefill: 3}, {At: 12 * time.Minute, Prefill: 1}}
	r, err := Run(sc, pol)
	if err != nil {
		t.Fatal(err)
	}
	if r.RoleSwitches != 4 || !strings.HasPrefix(r.Split, "1:3") {
		t.Errorf("scheduled 1:3 -> 3:1 -> 1:3: %d switches, split %q", r.RoleSwitches, r.Split)
	}
}

// Dynamo's SLA planner sizes both pools every 180 s from the demand and
// the per-engine throughput under its targets, within the budget, by
// adding cold workers and removing others; the run is deterministic.
func TestDynamoSLAPlannerSizesPools(t *testing.T) {
	p, err := stepmodel.BuiltinProfile("gb300-kimi-k2")
	if err != nil {
		t.Fatal(err)
	}
	sc := Scenario{Profile: p, Engines: 6, Workload: "computer-use", Agents: 30, Warmup: 0, Duration: 12 * time.Minute, Seed: 5}
	pol, err := ParsePolicy("dynamo-sla", 6)
	if err != nil || !pol.SLAPlanner || pol.Router != "dynamo" {
		t.Fatalf("policy %+v, %v", pol, err)
	}
	a, err := Run(sc, pol)
	if err != nil {
		t.Fatal(err)
	}
	if a.RoleSwitches == 0 || a.Requests == 0 {
		t.Fatalf("the SLA planner never resized: %+v", a)
	}
	b, _ := Run(sc, pol)
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	if string(ja) != string(jb) {
		t.Fatal("two runs with the same seed differ")
	}
	// Its sizing: a prompt-heavy demand gets more prefill than decode
	// engines at the same rate than an output-heavy one.
	r := &run{sc: sc, engines: []*engine{{model: stepmodel.NewModel(p, stepmodel.Config{})}, {}, {}, {}, {}, {}}}
	pp, pd := r.slaReplicas(20, 30000, 200)
	mp, md := r.slaReplicas(20, 1000, 8000)
	if pp+pd > 6 || mp+md > 6 || pp <= mp || md <= pd || pp < 1 || md < 1 {
		t.Fatalf("prompt-heavy %d:%d, output-heavy %d:%d", pp, pd, mp, md)
	}
}

// dynamo-static runs Dynamo at the split its throughput formulas give for
// the demand observed in the warm-up, using every engine: a prompt-heavy
// fleet gets more prefill engines than an output-heavy one, the run keeps
// that split, and the same seed gives the same split.
func TestDynamoStaticUsesProfiledSplit(t *testing.T) {
	p, err := stepmodel.BuiltinProfile("gb300-kimi-k2")
	if err != nil {
		t.Fatal(err)
	}
	pol, err := ParsePolicy("dynamo-static", 4)
	if err != nil || !pol.ProfiledSplit || pol.Router != "dynamo" || !pol.WriteThrough || pol.Planner || pol.DynamoPlanner || pol.SLAPlanner {
		t.Fatalf("policy %+v, %v", pol, err)
	}
	split := map[string]int{}
	for _, wl := range []string{"computer-use", "math"} {
		sc := Scenario{Profile: p, Engines: 4, Workload: wl, Agents: 30, Warmup: 6 * time.Minute, Duration: time.Minute, Seed: 3}
		want, _, err := dynamoStaticSplit(sc, pol.Name, runHooks{})
		if err != nil {
			t.Fatal(err)
		}
		split[wl] = want
		if wl != "computer-use" {
			continue // one run shows the split applied
		}
		res, err := Run(sc, pol)
		if err != nil {
			t.Fatal(err)
		}
		if res.Split != fmt.Sprintf("%d:%d", want, 4-want) || res.RoleSwitches != 0 || res.Requests == 0 {
			t.Fatalf("%s: split %q, %d switches, %d requests; the formulas gave %d prefill engines", wl, res.Split, res.RoleSwitches, res.Requests, want)
		}
	}
	if split["computer-use"] <= split["math"] {
		t.Fatalf("prefill engines: computer-use %d, math %d; want more for the prompt-heavy fleet", split["computer-use"], split["math"])
	}
	// Stopped while it measures the demand: no result, named as asked,
	// stopped early in a span that counts the measurement and the run.
	sc := Scenario{Profile: p, Engines: 4, Workload: "math", Agents: 30, Warmup: 6 * time.Minute, Duration: time.Minute, Seed: 3}
	asked := 0
	_, err = Compare(sc, []string{"dynamo-static"}, &Hooks{Cancelled: func() bool { asked++; return asked > 3 }})
	var ie *InterruptedError
	if !errors.As(err, &ie) || len(ie.Unfinished) != 1 || ie.Unfinished[0].Policy != "dynamo-static" ||
		ie.Unfinished[0].Elapsed <= 0 || ie.Unfinished[0].Elapsed >= 6*time.Minute || ie.Unfinished[0].Total != 13*time.Minute ||
		!slices.Equal(ie.Names, []string{"dynamo-static"}) {
		t.Fatalf("interrupted while measuring: %v", err)
	}
	for _, tc := range [][4]int{{1, 2, 9, 3}, {1, 1, 9, 5}, {5, 1, 6, 5}, {1, 30, 9, 1}, {30, 1, 9, 8}} {
		if got := scaleSplit(tc[0], tc[1], tc[2]); got != tc[3] {
			t.Errorf("scaleSplit(%d, %d, %d) = %d, want %d", tc[0], tc[1], tc[2], got, tc[3])
		}
	}
}

// Dynamo's router queues requests while every prefill worker is past its
// queue threshold (16 token budgets of active prefill): an opening burst of
// long prompts on one prefill engine waits at the router, then every one
// is served; evolve's router never queues there.
func TestDynamoRouterQueuesPastItsThreshold(t *testing.T) {
	p, err := stepmodel.BuiltinProfile("gb300-glm5")
	if err != nil {
		t.Fatal(err)
	}
	sc := Scenario{Profile: p, Engines: 2, Workload: "coding", Agents: 40, Warmup: 0, Duration: 4 * time.Minute, Seed: 2}
	served := map[string]int{}
	for _, name := range []string{"dynamo-static:1:1", "static:1:1"} {
		pol, err := ParsePolicy(name, 2)
		if err != nil {
			t.Fatal(err)
		}
		res, err := Run(sc, pol)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %d held at the router, %d served", name, res.RouterQueued, res.Requests)
		queued := res.RouterQueued > 0
		if queued != (name == "dynamo-static:1:1") || res.Requests < 40 {
			t.Errorf("%s: %d requests held at the router, %d served", name, res.RouterQueued, res.Requests)
		}
		served[name] = res.Requests
	}
	// The held requests leave the queue: Dynamo's agents are not stuck
	// behind it (a queue never drained would stop most of the fleet).
	if served["dynamo-static:1:1"] < served["static:1:1"]*9/10 {
		t.Errorf("served: dynamo %d, static %d", served["dynamo-static:1:1"], served["static:1:1"])
	}
}

// A scenario that cannot run is refused before any run starts, with what
// is wrong; the presets' shapes pass.
func TestScenarioValidateNamesWhatIsWrong(t *testing.T) {
	p, err := stepmodel.BuiltinProfile("tiny")
	if err != nil {
		t.Fatal(err)
	}
	good := Scenario{Profile: p, Engines: 2, Workload: "coding", Agents: 1, Duration: time.Minute}
	if err := good.Validate(); err != nil {
		t.Fatalf("a runnable scenario refused: %v", err)
	}
	for want, change := range map[string]func(*Scenario){
		"profile":     func(s *Scenario) { s.Profile = nil },
		"engines":     func(s *Scenario) { s.Engines = 1 },
		"agents":      func(s *Scenario) { s.Agents = 0 },
		"duration":    func(s *Scenario) { s.Duration = 0 },
		"warm-up":     func(s *Scenario) { s.Warmup = -time.Second },
		"eviction":    func(s *Scenario) { s.Eviction = "mru" },
		"oracle":      func(s *Scenario) { s.OracleSegment = -time.Minute },
		"workload":    func(s *Scenario) { s.Workload = "poetry" },
		"interval":    func(s *Scenario) { s.Planner.Interval = -time.Second },
		"improvement": func(s *Scenario) { s.Planner.MinImprovement = 1 },
		"TTFT weight": func(s *Scenario) { s.Planner.TTFTWeight = -1 },
		"persistence": func(s *Scenario) { s.Planner.Persistence = -time.Second },
		"time scale":  func(s *Scenario) { s.TimeScale = -1 },
	} {
		t.Run(want, func(t *testing.T) {
			sc := good
			change(&sc)
			if err := sc.Validate(); err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("%s: %v", want, err)
			}
			if _, err := Compare(sc, []string{"evolve"}, nil); err == nil {
				t.Errorf("%s: Compare ran it", want)
			}
		})
	}
}
