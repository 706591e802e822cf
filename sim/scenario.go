package sim

// What a run is given (Scenario, Policy) and what it reports (Result, and
// a Window per modelled minute).

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/evolvellm/evolve/engine/stepmodel"
	"github.com/evolvellm/evolve/planner"
	"github.com/evolvellm/evolve/roles"
	"github.com/evolvellm/evolve/workload"
)

// Scenario is what is simulated: a cluster, a fleet of agents, a time span.
type Scenario struct {
	Profile  *stepmodel.Profile
	Engines  int
	Workload string
	Agents   int
	Warmup   time.Duration
	Duration time.Duration // scored, after Warmup
	Seed     uint64
	// Trace, when set, replaces the agents: its requests arrive at their
	// timestamps (scaled by TimeScale, default 1), open loop.
	Trace     []workload.TraceRecord
	TimeScale float64
	// Eviction for evolve's policies: "ref" (default: by live branch
	// references) or "lru" (plain LRU, to measure what references give).
	// Dynamo's policies always use KVBM's LRU.
	Eviction string
	// DrainSwitches makes a decode node that evolve's planner moves to
	// prefill finish its decodes before it switches, as a live node
	// running vLLM does (it cannot hand a decode over). By default the
	// simulator hands them over to peer decode nodes (handOver), as the
	// live orchestrator does with evolve's engines.
	DrainSwitches bool
	// OracleSegment is how often the oracle's search may change the split
	// (see oracle.go); 0: DefaultOracleSegment.
	OracleSegment time.Duration
	// Planner tunes evolve's planner as the orchestrator's --planner-*
	// flags do: Interval, Persistence, TTFTWeight, MinImprovement,
	// TTFTSLO and Uncalibrated are taken, zero fields keep their defaults. The engines' limits come
	// from the profile.
	Planner planner.Config
}

// Policy is how a simulated cluster is run.
type Policy struct {
	Name    string // as given: evolve, static:P:D, dynamo-static:P:D, ...
	Router  string // routing policy: evolve or dynamo
	Prefill int    // engines in the prefill role (fixed split)
	// WriteThrough: KVBM-style host offload of every block (Dynamo).
	WriteThrough bool
	// DynamoPlanner runs Dynamo's 2026 default load-based planner (see
	// dynamo.go), starting from the fixed split.
	DynamoPlanner bool
	// SLAPlanner runs Dynamo's older SLA planner (dynamosla.go).
	SLAPlanner bool
	// Planner runs evolve's online planner, starting from the fixed split.
	Planner bool
	// Learn runs evolve's planner to learn pass costs and price the
	// router with them, as evolve's does, but never to move a node: the
	// static splits and the oracle's schedules route as evolve does.
	Learn bool
	// ProfiledSplit replaces Prefill, before the run, with the split
	// Dynamo's throughput formulas give for the scenario (dynamo-static;
	// see dynamoStaticSplit).
	ProfiledSplit bool
	ColdStart     time.Duration // how long an added worker loads before it serves
	// Schedule changes the split at set times, by evolve's switching
	// protocol (the oracle's search; see oracle.go).
	Schedule []SplitChange
	// Replay starts these engines' switches at these times, as a run
	// recorded them (Result.Moves): the oracle replays evolve's planner
	// this way, with no planner.
	Replay []Move
}

// Move is one engine's switch: at At into the run, engine Engine (by
// index) begins to move to role To.
type Move struct {
	At     time.Duration
	Engine int
	To     roles.Role
}

// SplitChange is one step of a Policy's schedule: from At into the run,
// Prefill engines prefill and the rest decode.
type SplitChange struct {
	At      time.Duration
	Prefill int
}

// engineConfig is how the policy's engines are configured: the simulator
// reads no per-token records, only how many tokens each pass sampled.
func (p Policy) engineConfig() stepmodel.Config {
	return stepmodel.Config{WriteThrough: p.WriteThrough, NoTokenStream: true}
}

// PolicyNames are the policies Compare runs, splits written P:D.
var PolicyNames = []string{"evolve", "dynamo", "dynamo-static", "dynamo-sla", "dynamo:best", "dynamo:best-throughput", "static:P:D", "static:best",
	"static:best-throughput", "dynamo-static:P:D", "dynamo-static:best", "dynamo-static:best-throughput", "oracle", "oracle-throughput"}

// ParsePolicy reads a policy for a cluster of n engines: static:P:D
// (evolve's router and KV management), dynamo-static:P:D (Dynamo's router
// and KVBM), dynamo-static (the same at the split Dynamo's formulas give,
// resolved when it runs), dynamo and dynamo-sla (with Dynamo's planners),
// or evolve (evolve's router at Dynamo's recipe ratio of one prefill
// engine for two decode, until the planner moves nodes). Sweeps
// (static:best, dynamo-static:best, dynamo:best) are resolved by Compare.
func ParsePolicy(name string, n int) (Policy, error) {
	split := func(spec string) (int, error) {
		p, d, ok := strings.Cut(spec, ":")
		pi, err1 := strconv.Atoi(p)
		di, err2 := strconv.Atoi(d)
		if !ok || err1 != nil || err2 != nil || pi < 1 || di < 1 || pi+di != n {
			return 0, fmt.Errorf("policy %q: want P:D with P, D >= 1 and P+D = %d engines", name, n)
		}
		return pi, nil
	}
	switch {
	case name == "evolve":
		return Policy{Name: name, Router: "evolve", Prefill: max(1, n/3), Planner: true}, nil
	case name == "dynamo-sla":
		return Policy{Name: name, Router: "dynamo", Prefill: max(1, n/3), WriteThrough: true, SLAPlanner: true, ColdStart: 60 * time.Second}, nil
	case name == "dynamo":
		return Policy{Name: name, Router: "dynamo", Prefill: max(1, n/3), WriteThrough: true, DynamoPlanner: true, ColdStart: 60 * time.Second}, nil
	case name == "dynamo-static":
		return Policy{Name: name, Router: "dynamo", Prefill: max(1, n/3), WriteThrough: true, ProfiledSplit: true}, nil
	case strings.HasPrefix(name, "static:"):
		p, err := split(strings.TrimPrefix(name, "static:"))
		return Policy{Name: name, Router: "evolve", Prefill: p, Learn: true}, err
	case strings.HasPrefix(name, "dynamo-static:"):
		p, err := split(strings.TrimPrefix(name, "dynamo-static:"))
		return Policy{Name: name, Router: "dynamo", Prefill: p, WriteThrough: true}, err
	}
	last := len(PolicyNames) - 1
	return Policy{}, fmt.Errorf("unknown policy %q (want %s or %s)", name, strings.Join(PolicyNames[:last], ", "), PolicyNames[last])
}

// Result is one policy's outcome on a scenario. JSON names are stable.
type Result struct {
	Policy string `json:"policy"`
	Split  string `json:"split"`
	// MeanE2E, P50E2E and P99E2E are over every request that arrived in
	// the scored window: one still unfinished at its end counts its age
	// then, a lower bound of its latency, so that a run that stalls long
	// requests cannot look faster than one that finishes them (each
	// finished request counts no more than its age at the end).
	// MeanE2EFinished is the mean over the finished ones alone, and
	// RequestsUnfinished how many were not.
	MeanE2E         float64 `json:"mean_e2e_s"`
	MeanE2EFinished float64 `json:"mean_e2e_finished_s"`
	// MeanE2EStdErr is the standard error of the mean E2E by batch means:
	// the spread of the scored minutes' means (each over the requests that
	// arrived in it and finished), over the root of their number. Two runs
	// of one split that differ only in their past drift apart by about
	// this much; 0 with fewer than 4 scored minutes.
	MeanE2EStdErr      float64 `json:"mean_e2e_stderr_s"`
	RequestsUnfinished int     `json:"requests_unfinished"`
	P50E2E             float64 `json:"p50_e2e_s"`
	P99E2E             float64 `json:"p99_e2e_s"`
	MeanTTFT           float64 `json:"mean_ttft_s"`
	P50TTFT            float64 `json:"p50_ttft_s"`
	P95TTFT            float64 `json:"p95_ttft_s"`
	P99TTFT            float64 `json:"p99_ttft_s"`
	Sessions           int     `json:"sessions_completed"`
	SessionsPerHour    float64 `json:"sessions_per_hour"`
	Requests           int     `json:"requests_completed"`
	Throughput         float64 `json:"throughput_tok_s"`
	PromptTokens       int64   `json:"prompt_tokens"`
	GPUHitTokens       int64   `json:"gpu_hit_tokens"`
	HostHitTokens      int64   `json:"host_hit_tokens"`
	TransferredTokens  int64   `json:"transferred_tokens"`
	ComputedTokens     int64   `json:"computed_tokens"`
	LostKVReuse        int64   `json:"lost_kv_reuse_tokens"`
	RoleSwitches       int     `json:"role_switches"`
	// Reversals counts the switches, over the whole run, that go the other
	// way from the one before (a node to prefill after one to decode, or
	// back): a planner that oscillates shows here.
	Reversals    int     `json:"reversals"`
	Retried      int     `json:"requests_retried"`       // aborted by a worker's removal and sent again
	RouterQueued int     `json:"requests_router_queued"` // held in the router's queue (Dynamo's) before routing
	HandedOver   int     `json:"decodes_handed_over"`    // decoding sequences moved to a peer before a switch
	Preemptions  uint64  `json:"preemptions"`
	EnginePasses uint64  `json:"engine_passes"` // forward passes simulated
	VirtualSec   float64 `json:"virtual_s"`

	// Timeline is the run minute by minute (not in the JSON result; see
	// WriteTimeline).
	Timeline []Window `json:"-"`
	// Initial is the run's first split (prefill engines), and Moves every
	// switch it began, whoever asked (not in the JSON result): a
	// Policy.Replay of them, from static Initial, runs the same switches
	// again without their planner.
	Initial int    `json:"-"`
	Moves   []Move `json:"-"`
}

// Window is one minute of a run.
type Window struct {
	Start        time.Duration // since the run's start
	Prefill      int           // serving prefill engines at the window's end
	Decode       int           // serving decode engines
	Waiting      int           // requests queued on engines at the window's end
	Requests     int           // arrived in the window (and finished)
	Sessions     int           // ended in the window
	OutputTokens int64         // of requests finishing in the window
	// Prompt tokens of the window's finished requests by KV source, and
	// lost reuse of the requests that arrived in it.
	PromptTokens, GPUHit, HostHit, Computed, LostReuse int64
	e2e, ttft                                          []float64
	// Evolve's planner at the window's end: the prefill count it
	// recommends (-1: none) and the TTFT it predicts for the split it has.
	Recommended   int
	PredictedTTFT float64
	planned       bool
}

// Validate reports what makes the scenario impossible to run, before any
// run starts (an hour of simulation should not end in a bad setting).
func (sc Scenario) Validate() error {
	switch {
	case sc.Profile == nil:
		return fmt.Errorf("no engine profile")
	case sc.Engines < 2:
		return fmt.Errorf("%d engines: want at least two (a prefill and a decode)", sc.Engines)
	case sc.Trace == nil && sc.Agents < 1:
		return fmt.Errorf("%d agents: want at least one", sc.Agents)
	case sc.Duration <= 0:
		return fmt.Errorf("scored duration %v: want a positive one", sc.Duration)
	case sc.Warmup < 0:
		return fmt.Errorf("warm-up %v: must not be negative", sc.Warmup)
	case sc.TimeScale < 0:
		return fmt.Errorf("time scale %g: must not be negative", sc.TimeScale)
	case sc.OracleSegment < 0:
		return fmt.Errorf("oracle segment %v: want a positive duration such as 10m (0: the default)", sc.OracleSegment)
	}
	if e := sc.Eviction; e != "" && e != "ref" && e != "lru" {
		return fmt.Errorf("eviction %q: want ref or lru", e)
	}
	if sc.Trace == nil {
		if _, err := workload.New(sc.Workload, sc.Agents); err != nil {
			return fmt.Errorf("workload: %w", err)
		}
	}
	return sc.Planner.Validate()
}
