package sim

// The scenario grid (evolve sim --grid): evolve against its baselines on
// every workload, cluster size, profile, load level and seed a grid file
// names, a row per scenario, and a summary of how often evolve is where
// the targets say it should be.

import (
	"bytes"
	"embed"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/evolvellm/evolve/engine/stepmodel"
	"github.com/evolvellm/evolve/planner"
	"github.com/evolvellm/evolve/workload"
	"gopkg.in/yaml.v3"
)

//go:embed grids/*.yaml
var builtinGrids embed.FS

// BuiltinGrid returns the grid file of that name shipped with evolve
// (sim/grids/NAME.yaml), and whether there is one.
func BuiltinGrid(name string) ([]byte, bool) {
	b, err := builtinGrids.ReadFile("grids/" + name + ".yaml")
	return b, err == nil
}

// BuiltinGridNames lists the grids shipped with evolve.
func BuiltinGridNames() []string {
	ents, _ := builtinGrids.ReadDir("grids")
	var out []string
	for _, e := range ents {
		out = append(out, strings.TrimSuffix(e.Name(), ".yaml"))
	}
	return out
}

// GridSpec is a grid file: the axes, and how each scenario runs.
type GridSpec struct {
	Workloads []string `yaml:"workloads" json:"workloads"`
	Profiles  []string `yaml:"profiles" json:"profiles"`
	// GPUs are the cluster sizes in GPUs, or Engines in engines (each of
	// its profile's GPUs): one of the two.
	GPUs    []int `yaml:"gpus" json:"gpus,omitempty"`
	Engines []int `yaml:"engines" json:"engines,omitempty"`
	// Sizes is how the sizes combine with the other axes: "product" (every
	// size with every workload and profile) or "cycle" (each workload and
	// profile at one size, turning through the sizes, so that every size
	// meets every workload and every profile at a third of the cost).
	Sizes string `yaml:"sizes" json:"sizes"`
	// Loads are shares of what the cluster can serve (see Capacity).
	Loads []float64 `yaml:"loads" json:"loads"`
	Seeds []uint64  `yaml:"seeds" json:"seeds"`
	// Warmup, Duration and OracleSegment as durations (5m, 20m).
	Warmup        string   `yaml:"warmup" json:"warmup"`
	Duration      string   `yaml:"duration" json:"duration"`
	OracleSegment string   `yaml:"oracle_segment" json:"oracle_segment"`
	KVBlockTokens int      `yaml:"kv_block_tokens" json:"kv_block_tokens"`
	Policies      []string `yaml:"policies" json:"policies"`
	// ProbeAgents per engine measure an agent's unloaded request rate
	// [1].
	ProbeAgents int `yaml:"probe_agents_per_engine" json:"probe_agents_per_engine"`
	// Planner tunes evolve's planner in every scenario, as evolve sim's
	// --planner-* flags (zero: the defaults): for trying a setting over
	// the whole grid.
	Planner GridPlanner `yaml:"planner" json:"planner"`

	warmup, duration, segment time.Duration
}

// GridPlanner is a grid file's planner settings.
type GridPlanner struct {
	TTFTWeight     float64 `yaml:"ttft_weight" json:"ttft_weight,omitempty"`
	MinImprovement float64 `yaml:"min_improvement" json:"min_improvement,omitempty"`
	TTFTSLO        float64 `yaml:"ttft_slo_s" json:"ttft_slo_s,omitempty"`
	Uncalibrated   bool    `yaml:"uncalibrated" json:"uncalibrated,omitempty"`
}

// DefaultGridPolicies are the policies a grid runs unless its file names
// others: a row needs static:best and evolve, and uses the rest.
var DefaultGridPolicies = []string{"dynamo", "dynamo:best", "static:best", "oracle", "evolve"}

// ParseGrid reads a grid file (YAML), fills in its defaults and checks it.
func ParseGrid(data []byte) (GridSpec, error) {
	var g GridSpec
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&g); err != nil {
		return GridSpec{}, fmt.Errorf("grid file: %w", err)
	}
	if len(g.Policies) == 0 {
		g.Policies = DefaultGridPolicies
	}
	if g.Sizes == "" {
		g.Sizes = "product"
	}
	if g.ProbeAgents <= 0 {
		g.ProbeAgents = 1
	}
	if len(g.Seeds) == 0 {
		g.Seeds = []uint64{1}
	}
	for _, d := range []struct {
		name, v string
		def     time.Duration
		to      *time.Duration
	}{{"warmup", g.Warmup, 5 * time.Minute, &g.warmup}, {"duration", g.Duration, 20 * time.Minute, &g.duration},
		{"oracle_segment", g.OracleSegment, DefaultOracleSegment, &g.segment}} {
		*d.to = d.def
		if d.v == "" {
			continue
		}
		v, err := time.ParseDuration(d.v)
		if err != nil || v < 0 || (v == 0 && d.name != "warmup") {
			return GridSpec{}, fmt.Errorf("grid file: %s %q: want a duration such as 20m", d.name, d.v)
		}
		*d.to = v
	}
	switch {
	case len(g.Workloads) == 0 || len(g.Profiles) == 0 || len(g.GPUs)+len(g.Engines) == 0 || len(g.Loads) == 0:
		return GridSpec{}, fmt.Errorf("grid file: workloads, profiles, gpus (or engines) and loads each need at least one entry")
	case len(g.GPUs) > 0 && len(g.Engines) > 0:
		return GridSpec{}, fmt.Errorf("grid file: give the sizes as gpus or as engines, not both")
	case g.Sizes != "product" && g.Sizes != "cycle":
		return GridSpec{}, fmt.Errorf("grid file: sizes %q: want product or cycle", g.Sizes)
	case !slices.Contains(g.Policies, "static:best") || !slices.Contains(g.Policies, "evolve"):
		return GridSpec{}, fmt.Errorf("grid file: policies %v: a row compares evolve with static:best, name both", g.Policies)
	}
	for _, l := range g.Loads {
		if l <= 0 || l > 2 || math.IsNaN(l) {
			return GridSpec{}, fmt.Errorf("grid file: load %g: want a share of the cluster's capacity in (0, 2] (0.6 is 60%%)", l)
		}
	}
	for _, w := range g.Workloads {
		if _, err := workload.New(w, 1); err != nil {
			return GridSpec{}, fmt.Errorf("grid file: %w", err)
		}
	}
	if err := (planner.Config{TTFTWeight: g.Planner.TTFTWeight, MinImprovement: g.Planner.MinImprovement}).Validate(); err != nil {
		return GridSpec{}, fmt.Errorf("grid file: planner: %w", err)
	}
	if g.Planner.TTFTSLO < 0 {
		return GridSpec{}, fmt.Errorf("grid file: planner: ttft_slo_s %g: must not be negative (0: none)", g.Planner.TTFTSLO)
	}
	return g, nil
}

// WarmupTime is each scenario's warm-up.
func (g GridSpec) WarmupTime() time.Duration { return g.warmup }

// DurationTime is each scenario's scored time.
func (g GridSpec) DurationTime() time.Duration { return g.duration }

// SegmentTime is the oracle's segment.
func (g GridSpec) SegmentTime() time.Duration { return g.segment }

// GridScenario is one scenario of a grid.
type GridScenario struct {
	Workload string  `json:"workload"`
	Profile  string  `json:"profile"`
	GPUs     int     `json:"gpus"`
	Load     float64 `json:"load"`
	Seed     uint64  `json:"seed"`
}

func (s GridScenario) String() string {
	return fmt.Sprintf("%s on %d GPUs of %s at %.0f%%, seed %d", s.Workload, s.GPUs, s.Profile, 100*s.Load, s.Seed)
}

// Scenarios lists the grid's scenarios in order: by workload, profile,
// size, load, then seed; perEngine gives each profile's GPUs per engine
// (for sizes given in engines).
func (g GridSpec) Scenarios(perEngine func(profile string) int) []GridScenario {
	var out []GridScenario
	for i, w := range g.Workloads {
		for j, p := range g.Profiles {
			sizes := g.GPUs
			if len(g.Engines) > 0 {
				sizes = nil
				for _, e := range g.Engines {
					sizes = append(sizes, e*perEngine(p))
				}
			}
			if g.Sizes == "cycle" {
				sizes = []int{sizes[(i+j)%len(sizes)]}
			}
			for _, n := range sizes {
				for _, l := range g.Loads {
					for _, s := range g.Seeds {
						out = append(out, GridScenario{Workload: w, Profile: p, GPUs: n, Load: l, Seed: s})
					}
				}
			}
		}
	}
	return out
}

// Scenario is the simulator's scenario for gs on profile prof (at the
// grid's block size) with agents agents.
func (g GridSpec) Scenario(gs GridScenario, prof *stepmodel.Profile, agents int) Scenario {
	return Scenario{Profile: prof, Engines: gs.GPUs / prof.GPUs, Workload: gs.Workload, Agents: agents,
		Warmup: g.warmup, Duration: g.duration, Seed: gs.Seed, OracleSegment: g.segment,
		Planner: planner.Config{TTFTWeight: g.Planner.TTFTWeight, MinImprovement: g.Planner.MinImprovement,
			TTFTSLO: g.Planner.TTFTSLO, Uncalibrated: g.Planner.Uncalibrated}}
}

// GridCapacity estimates what gs's cluster can serve of its workload: a
// shift's is the lesser of its two workloads' (the cluster must serve
// both), anything else's its own (a mix's over the mix). The probe runs
// with seed 1, so that every seed and load of a cell shares it.
func (g GridSpec) GridCapacity(gs GridScenario, prof *stepmodel.Profile, cancelled func() bool) (Capacity, error) {
	engines := gs.GPUs / prof.GPUs
	probe := func(wl string) (Capacity, error) {
		sc := g.Scenario(GridScenario{Workload: wl, Profile: gs.Profile, GPUs: gs.GPUs, Seed: 1}, prof, 1)
		return EstimateCapacity(sc, g.ProbeAgents*engines, cancelled)
	}
	m, err := workload.New(gs.Workload, 1)
	if err != nil {
		return Capacity{}, err
	}
	sh, ok := m.(*workload.Shift)
	if !ok {
		return probe(gs.Workload)
	}
	a, err := probe(sh.From.Name())
	if err != nil {
		return Capacity{}, err
	}
	b, err := probe(sh.To.Name())
	if err != nil || b.CapacityAgents >= a.CapacityAgents {
		return a, err
	}
	return b, nil
}

// GridRow is one scenario's outcome. Ratios are evolve's mean E2E over
// the baseline's (below 1: evolve is faster); 0 where the grid did not
// run that baseline.
type GridRow struct {
	GridScenario
	Engines  int      `json:"engines"`
	Agents   int      `json:"agents"`
	Capacity Capacity `json:"capacity"`
	Results  []Result `json:"results"`
	// EvolveVs* are evolve's mean E2E over each baseline's.
	EvolveVsStatic     float64 `json:"evolve_vs_static_best"`
	EvolveVsOracle     float64 `json:"evolve_vs_oracle,omitempty"`
	EvolveVsDynamo     float64 `json:"evolve_vs_dynamo,omitempty"`
	EvolveVsDynamoBest float64 `json:"evolve_vs_dynamo_best,omitempty"`
	// Headroom is what the oracle found below static:best, a share of
	// static:best's mean E2E: above 0.03 a planner has something to win.
	Headroom float64 `json:"oracle_headroom,omitempty"`
	// Noise is the standard error of evolve's mean E2E less static:best's,
	// a share of static:best's (from each run's batch means): two runs of
	// one split that differ only in their past drift apart by about this.
	Noise   float64 `json:"noise"`
	WallSec float64 `json:"wall_s"`
}

// Result is the row's result of the named policy, and whether it ran.
func (r GridRow) Result(policy string) (Result, bool) {
	for _, res := range r.Results {
		if res.Policy == policy {
			return res, true
		}
	}
	return Result{}, false
}

// NewGridRow computes a row's ratios from its results.
func NewGridRow(gs GridScenario, engines int, c Capacity, agents int, results []Result) GridRow {
	row := GridRow{GridScenario: gs, Engines: engines, Agents: agents, Capacity: c, Results: results}
	ev, _ := row.Result("evolve")
	ratio := func(policy string) float64 {
		b, ok := row.Result(policy)
		if !ok || b.MeanE2E <= 0 {
			return 0
		}
		return ev.MeanE2E / b.MeanE2E
	}
	row.EvolveVsStatic, row.EvolveVsOracle = ratio("static:best"), ratio("oracle")
	row.EvolveVsDynamo, row.EvolveVsDynamoBest = ratio("dynamo"), ratio("dynamo:best")
	st, _ := row.Result("static:best")
	if o, ok := row.Result("oracle"); ok && st.MeanE2E > 0 {
		row.Headroom = 1 - o.MeanE2E/st.MeanE2E
	}
	if st.MeanE2E > 0 {
		row.Noise = math.Hypot(ev.MeanE2EStdErr, st.MeanE2EStdErr) / st.MeanE2E
	}
	return row
}

// The grid's targets: evolve no more than 1% behind static:best, within
// 3% of the oracle, never behind dynamo.
const (
	GridStaticSlack = 0.01
	GridOracleSlack = 0.03
)

// GridSummary is how often evolve meets each target over a grid's rows.
type GridSummary struct {
	Rows int `json:"rows"`
	// AtStatic: rows where evolve's mean E2E is within 1% of static:best's
	// or better; NearOracle: within 3% of the oracle's (of OracleRows
	// that ran one); BelowDynamo: rows where evolve is slower than dynamo.
	AtStatic int `json:"evolve_within_1pct_of_static_best"`
	// WithinNoise: rows where evolve is within 1% of static:best or
	// behind it by no more than twice the row's noise.
	WithinNoise int `json:"evolve_within_1pct_or_noise_of_static_best"`
	OracleRows  int `json:"rows_with_oracle"`
	NearOracle  int `json:"evolve_within_3pct_of_oracle"`
	DynamoRows  int `json:"rows_with_dynamo"`
	BelowDynamo int `json:"evolve_slower_than_dynamo"`
	// Headroom: rows where the oracle is more than 3% below static:best.
	Headroom int `json:"oracle_more_than_3pct_below_static_best"`
	// MeanVs* are geometric means of the ratios.
	MeanVsStatic float64 `json:"geomean_evolve_vs_static_best"`
	MeanVsOracle float64 `json:"geomean_evolve_vs_oracle,omitempty"`
	MeanVsDynamo float64 `json:"geomean_evolve_vs_dynamo,omitempty"`
	Switches     int     `json:"evolve_switches"`
	Reversals    int     `json:"evolve_reversals"`
	// Worst are the rows (indexes) furthest behind their best baseline
	// (the oracle's, or static:best's), worst first.
	Worst []int `json:"worst_rows"`
}

// SummarizeGrid counts the targets over rows and names the worst n.
func SummarizeGrid(rows []GridRow, n int) GridSummary {
	s := GridSummary{Rows: len(rows)}
	var ls, lo, ld float64
	for _, r := range rows {
		if r.EvolveVsStatic <= 1+GridStaticSlack {
			s.AtStatic++
		}
		if r.EvolveVsStatic <= 1+max(GridStaticSlack, 2*r.Noise) {
			s.WithinNoise++
		}
		ls += math.Log(max(r.EvolveVsStatic, 1e-9))
		if r.EvolveVsOracle > 0 {
			s.OracleRows++
			lo += math.Log(r.EvolveVsOracle)
			if r.EvolveVsOracle <= 1+GridOracleSlack {
				s.NearOracle++
			}
		}
		if r.Headroom > GridOracleSlack {
			s.Headroom++
		}
		if r.EvolveVsDynamo > 0 {
			s.DynamoRows++
			ld += math.Log(r.EvolveVsDynamo)
			if r.EvolveVsDynamo > 1 {
				s.BelowDynamo++
			}
		}
		if ev, ok := r.Result("evolve"); ok {
			s.Switches += ev.RoleSwitches
			s.Reversals += ev.Reversals
		}
	}
	if s.Rows > 0 {
		s.MeanVsStatic = math.Exp(ls / float64(s.Rows))
	}
	if s.OracleRows > 0 {
		s.MeanVsOracle = math.Exp(lo / float64(s.OracleRows))
	}
	if s.DynamoRows > 0 {
		s.MeanVsDynamo = math.Exp(ld / float64(s.DynamoRows))
	}
	behind := func(r GridRow) float64 {
		if r.EvolveVsOracle > 0 {
			return r.EvolveVsOracle
		}
		return r.EvolveVsStatic
	}
	idx := make([]int, len(rows))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return behind(rows[idx[a]]) > behind(rows[idx[b]]) })
	s.Worst = idx[:min(n, len(idx))]
	return s
}
