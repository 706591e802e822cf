package main

import (
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/evolvellm/evolve/planner"
	"github.com/evolvellm/evolve/sim"
	"github.com/evolvellm/evolve/workload"
	"github.com/spf13/cobra"
)

// preset is a named scenario after the research system's experiments
// (docs/measurements.md, "The research system's tables").
type preset struct {
	workload string
	agents   int
	gpus     int
	profile  string
	warmup   time.Duration
	scored   time.Duration
}

var presets = map[string]preset{}

func init() {
	add := func(name string, p preset) { presets[name] = p }
	// The claude-code presets run the workload shaped by the research
	// system's Claude Code figures (117 calls a session, ~20 s of tool time
	// a call); coding-126x36 the same fleet on the public-trace coding model.
	add("claude-code-126x36", preset{"claude-code", 126, 36, "gb300-glm5", 30 * time.Minute, time.Hour})
	add("coding-126x36", preset{"coding", 126, 36, "gb300-glm5", 30 * time.Minute, time.Hour})
	add("shift-math-cu-3h", preset{"shift:math>computer-use:1h:1h:1h", 160, 36, "gb300-kimi-k2", 10 * time.Minute, 3 * time.Hour})
	// The same Claude Code fleet on the servers most self-hosted clusters
	// have: 12 8-GPU H100 or H200 servers with GLM-4.6, where KV binds (a
	// server's GPUs hold a few agents' contexts; the host pool the rest).
	add("claude-code-126x96-h100", preset{"claude-code", 126, 96, "h100-glm46", 30 * time.Minute, time.Hour})
	add("claude-code-126x96-h200", preset{"claude-code", 126, 96, "h200-glm46", 30 * time.Minute, time.Hour})
	for _, lvl := range []struct {
		name          string
		math, cc, osw int
	}{{"low", 96, 96, 96}, {"mid", 160, 126, 160}, {"high", 224, 160, 224}} {
		add("putnam-"+lvl.name, preset{"math", lvl.math, 36, "gb300-glm5", 10 * time.Minute, time.Hour})
		add("claude-code-"+lvl.name, preset{"claude-code", lvl.cc, 36, "gb300-glm5", 30 * time.Minute, time.Hour})
		add("osworld-"+lvl.name, preset{"computer-use", lvl.osw, 36, "gb300-kimi-k2", 10 * time.Minute, time.Hour})
	}
	// The experiments' own names run their middle level.
	add("putnam", presets["putnam-mid"])
	add("osworld", presets["osworld-mid"])
}

func presetNames() []string {
	var out []string
	for k := range presets {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// presetTable lists the presets with what each runs, a line each; a name
// that only stands for another (putnam for putnam-mid) says so.
func presetTable() string {
	var b strings.Builder
	row := "  %-24s %6s %4s  %-13s  %-16s %s\n"
	fmt.Fprintf(&b, row, "preset", "agents", "GPUs", "profile", "warm-up + scored", "workload")
	for _, name := range presetNames() {
		p := presets[name]
		if alias := strings.TrimSuffix(name, "-mid"); alias != name && presets[alias] == p {
			name += ", " + alias
		} else if presets[name+"-mid"] == p {
			continue // listed with the level it stands for
		}
		fmt.Fprintf(&b, row, name, fmt.Sprint(p.agents), fmt.Sprint(p.gpus), p.profile,
			shortDuration(p.warmup)+" + "+shortDuration(p.scored), p.workload)
	}
	return b.String()
}

// shortDuration is minutes without a zero minutes part after the hours
// (30m, 1h, 1h30m).
func shortDuration(d time.Duration) string {
	s := minutes(d)
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

func newSimCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "sim",
		Short: "Simulate a cluster under agent traffic and compare policies side by side",
		Long: `Replay agent traffic at paper scale in virtual time and compare policies on
the same agents, seed for seed. The simulator runs the live system's code:
the engines' step model, the routing policies, the KV directory and the
workload models, driven by a virtual clock.

Policies (comma-separated):
  evolve              evolve's router and online planner: starts at Dynamo's recipe
                      ratio (1 prefill : 2 decode), learns pass costs from the
                      engines' passes and moves nodes between roles, handing
                      decodes over to peers instead of waiting for them, as
                      the live orchestrator does with evolve's engines
                      (--handover=false: they finish first, as vLLM's do)
  static:P:D          evolve's router and KV management with a fixed split
  static:best         every static split, the best by mean end-to-end latency
  static:best-throughput
                      the same runs, the best by output tokens per second: the
                      baseline where throughput is the claim (it may be
                      another split; every :best has its -throughput)
  dynamo              Dynamo as shipped: its KV router cost, fixed-role workers,
                      KVBM write-through host offload per worker (no cross-worker
                      fetch), and its 2026 default load planner (5 s steps, 60 s
                      cold starts, removals that abort and retry), from 1:2
  dynamo-sla          Dynamo with its older SLA planner: every 180 s, pools sized
                      from the last interval's rate, ISL and OSL and the
                      per-engine throughput under TTFT 0.5 s / ITL 50 ms targets
                      (taken from the engine cost model), cold starts, removals
  dynamo-static       Dynamo without a planner, at the split the SLA planner's
                      formulas give for the demand seen in the warm-up's second
                      half (a run at 1:2 measures it), scaled to every engine
  dynamo-static:P:D   the same with a fixed split and no planner
  dynamo-static:best  every fixed Dynamo split, the best
  dynamo:best         the best of dynamo, dynamo-sla and every fixed Dynamo split
  oracle              the best schedule of splits a search finds knowing the
                      future: from static:best, at every --oracle-segment it
                      tries moving up to 2 engines (evolve's router, KV and
                      switching protocol, no planner), runs each to the end
                      and keeps the best by mean latency; slow (replays)
  oracle-throughput   the same search, by output tokens a second

One engine is as many GPUs as its profile serves a replica on: a 4-GPU
GB300 tray (gb300-*: --gpus 36 is 9 engines) or an 8-GPU server (h100-*,
h200-*: --gpus 96 is 12). Presets, after the research system's
experiments, and the same fleet on H100 and H200 servers, where KV binds:
` + presetTable(),
		Example: `  evolve sim --preset claude-code-126x36 --policies dynamo,static:best,evolve
  evolve sim --preset claude-code-126x36 --policies dynamo,static:best,evolve --kv-block-tokens 128
    (KV in 128-token blocks: about 1.9x faster, mean latency within 1%; 256: 2.6x, within 3%)
  evolve sim --preset claude-code-126x36 --policies dynamo,evolve --live 127.0.0.1:7070
    (then: evolve top --readonly --server http://127.0.0.1:7070/evolve --beside http://127.0.0.1:7070/dynamo)
  evolve sim --gpus 16 --workload math --agents 40 --duration 20m --warmup 5m -o json
  evolve sim --trace conversation_trace.jsonl --gpus 16 --policies dynamo,static:best,evolve --plot run.png`,
		Args: noArgs,
		RunE: runSim,
	}
	f := cmd.Flags()
	f.String("preset", "", "scenario preset, named after the research system's experiments: claude-code-126x36, coding-126x36, shift-math-cu-3h, claude-code-126x96-h100, claude-code-126x96-h200, and putnam, osworld, claude-code at -low, -mid or -high concurrency (putnam and osworld alone: -mid); flags given alongside override it")
	f.Int("gpus", 36, "GPUs in the cluster, a multiple of the profile's GPUs per engine (4 for gb300-*, 8 for h100-* and h200-*)")
	f.String("profile", "gb300-glm5", "engine profile (the presets name theirs: workloads.md)")
	f.String("workload", "coding", "agent workload: coding, claude-code, math, computer-use, mix:A=w,B=w or shift:A>B:T1:T2:T3")
	f.Int("kv-block-tokens", 0, "model KV in blocks of this many tokens, a power-of-two multiple of the profile's block size, for every policy alike: "+
		"coarser blocks run faster and round prefix hits and transfers down to whole blocks (on claude-code-126x36, 128: 1.9x faster, mean E2E within 1%; 256: 2.6x faster, within 3%; TTFT tails can move more: docs/measurements.md, and docs/simulator.md for the flags around a run); 0: the profile's")
	f.Duration("oracle-segment", sim.DefaultOracleSegment, "how often the oracle's search may change the split (modelled time): shorter finds more and runs longer, each boundary costs up to 4 runs to the end")
	f.Bool("handover", true, "evolve's planner hands a switching decode node's decodes over to peer decode nodes, as the live orchestrator does with evolve's engines; false: the node finishes them first, as a live node running vLLM does (vLLM cannot hand a decode over)")
	f.String("eviction", "ref", "KV eviction of evolve's policies: ref (copies no live agent branch references go first) or lru (plain LRU, for comparison); dynamo policies always use KVBM's LRU")
	f.Duration("planner-interval", 0, "evolve's planner: time between its steps, as the orchestrator's flag (default 5s)")
	f.Duration("planner-persistence", 0, "evolve's planner: how long a better split must hold before it acts, as the orchestrator's flag (default 1m)")
	f.Float64("planner-ttft-weight", 0, fmt.Sprintf("evolve's planner: weight of TTFT against decode time in its objective, as the orchestrator's flag (default %g)", float64(planner.DefaultTTFTWeight)))
	f.Float64("planner-min-improvement", 0, fmt.Sprintf("evolve's planner: share by which a better split must lower its objective, as the orchestrator's flag (default %g)", planner.DefaultMinImprovement))
	f.Duration("planner-ttft-slo", 0, "evolve's planner: a bound on the mean TTFT it predicts, as a constraint (splits predicted past it rank after every split that meets it); 0: none")
	f.Int("agents", 126, "concurrent agents")
	f.Duration("duration", time.Hour, "scored time, after the warm-up")
	f.Duration("warmup", 30*time.Minute, "warm-up time, not scored")
	f.String("policies", "dynamo,dynamo-static,dynamo-sla,dynamo:best,static:best,static:best-throughput,evolve", "policies to compare (by default Dynamo as shipped, at its profiled split, with its SLA planner and at its best, against evolve and the best static split by latency and by throughput)")
	f.Int64("seed", 1, "random seed")
	f.String("trace", "", "replay this JSONL trace (Mooncake's format, or one recorded by evolve bench or sim --record; .gz read as gzip) instead of agents: its requests arrive at their timestamps, open loop; by default its first sixth (at most 10m) warms every policy up unscored, and the rest is scored to its end plus "+traceDrain.String()+" for the last requests to finish")
	f.Float64("playback", 1, "with --trace: replay this many times faster than recorded")
	f.String("record", "", "write the calls the agents send in the one simulation named by --policies to this JSONL trace (gzipped if it ends in .gz), for evolve bench --trace or sim --trace; "+
		"a closed loop's timing follows the cluster it ran against")
	f.String("timeline", "", "write a CSV per policy and minute (split, queue, latency, throughput) to this file")
	f.String("plot", "", "draw the timelines (prefill engines, queued requests and mean latency per minute, a line per policy) to this file: .svg, .png or .pdf")
	f.Duration("progress-every", 10*time.Second, "at most this often, each simulation says on stderr how far it is (at every tenth of its modelled time, with an estimate of the time left); 0: at every tenth")
	f.Bool("profile-self", false, "report how fast each simulation ran (wall time, modelled time, passes per second) on stderr, and in -o json under profile_self")
	f.String("live", "", "serve the simulations through the control API at this address (host:port) while they run, so that evolve top --server http://ADDR/POLICY watches them; named policies only (no :best, no oracle)")
	f.Float64("pace", 10, "with --live: modelled seconds per wall second (0: as fast as they run)")
	f.String("cpuprofile", "", "write a Go CPU profile of the simulation to FILE, for go tool pprof")
	f.String("memprofile", "", "write a Go heap profile to FILE when the simulations end, for go tool pprof (-sample_index=alloc_space: where their memory went)")
	f.String("grid", "", "run a scenario grid instead of one scenario: a grid file (YAML: workloads, profiles, gpus, loads, seeds, times, policies; see sim/grids/) or the name of one shipped with evolve ("+
		strings.Join(sim.BuiltinGridNames(), ", ")+"); prints a row per scenario with evolve's ratio to each baseline, and a summary")
	f.String("grid-results", "", "with --grid: append each finished scenario's row to this JSON-lines file, and skip the scenarios it already holds (a stopped grid goes on where it was)")
	addOutputFlag(cmd, "table or json")
	return cmd
}

// limitMemory keeps the simulations' heap under 3/4 of the machine's memory
// unless GOMEMLIMIT says otherwise: a paper-scale run holds every block
// copy of its engines, and the garbage collector's default slack (twice
// the live heap) would take a 256-GPU run past what a workstation has.
func limitMemory() {
	if os.Getenv("GOMEMLIMIT") != "" {
		return
	}
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
			if kb, err := strconv.ParseInt(f[1], 10, 64); err == nil && kb > 0 {
				debug.SetMemoryLimit(kb * 1024 / 4 * 3)
			}
			return
		}
	}
}

// writeFile creates path and writes it with write, reporting a failure to
// write or to close.
func writeFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	werr := write(f)
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	return werr
}

// checkWritable reports whether a file can be created at path, without
// leaving one there (nor truncating one that exists).
func checkWritable(path string) error {
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		return fmt.Errorf("%s is a directory", path)
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".evolve-check-*")
	if err != nil {
		return fmt.Errorf("cannot write in %s: %w", filepath.Dir(path), errors.Unwrap(err))
	}
	f.Close()
	return os.Remove(f.Name())
}

// selfProfile is how fast one simulation ran (evolve sim --profile-self).
type selfProfile struct {
	Policy       string  `json:"policy"`
	WallSec      float64 `json:"wall_s"`
	ModelledSec  float64 `json:"modelled_s"`
	XRealtime    float64 `json:"x_realtime"`
	EnginePasses uint64  `json:"engine_passes"`
	PassesPerSec float64 `json:"passes_per_s"`
}

func printSelfProfile(w io.Writer, prof []selfProfile, total time.Duration) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "\nsimulation\twall (s)\tmodelled (s)\tx real time\tengine passes\tpasses/s\n")
	for _, p := range prof {
		fmt.Fprintf(tw, "%s\t%.1f\t%.0f\t%.0f\t%d\t%.0f\n", p.Policy, p.WallSec, p.ModelledSec, p.XRealtime, p.EnginePasses, p.PassesPerSec)
	}
	fmt.Fprintf(tw, "all, on %d cores\t%.1f\t\t\t\t\n", runtime.GOMAXPROCS(0), total.Seconds())
	tw.Flush()
}

// simProgress says how far each simulation is: a line when it passes a
// tenth of its modelled time, at most one per simulation every `every`,
// so that a long run (a 256-GPU shift takes most of an hour) is not
// silent and a short one is not chatty.
type simProgress struct {
	w     io.Writer
	every time.Duration
	now   func() time.Time
	runs  map[string]*progressRun
	// shift, when the agents follow one, tells the estimate which
	// workload each stretch of modelled time runs (see progressRun.left).
	shift *workload.Shift
}

// progressRun is one simulation's progress: the last line shown, and the
// wall time at which each modelled time was reached.
type progressRun struct {
	tenth   int
	shownAt time.Time
	samples []progressSample
}

type progressSample struct {
	modelled time.Duration
	wall     time.Time
}

func newSimProgress(w io.Writer, every time.Duration) *simProgress {
	return &simProgress{w: w, every: every, now: time.Now, runs: map[string]*progressRun{}}
}

// report notes that policy's simulation, begun at began, has done elapsed
// of total modelled time.
func (p *simProgress) report(policy string, began time.Time, elapsed, total time.Duration) {
	if total <= 0 || elapsed >= total {
		return // the end is announced by the results
	}
	r := p.runs[policy]
	if r == nil {
		r = &progressRun{samples: []progressSample{{0, began}}}
		p.runs[policy] = r
	}
	now := p.now()
	r.samples = append(r.samples, progressSample{elapsed, now})
	frac := float64(elapsed) / float64(total)
	tenth := int(frac * 10)
	if tenth <= r.tenth || (!r.shownAt.IsZero() && now.Sub(r.shownAt) < p.every) || (r.shownAt.IsZero() && now.Sub(began) < p.every) {
		return
	}
	r.tenth, r.shownAt = tenth, now
	left, caveat := r.left(total, p.shift)
	fmt.Fprintf(p.w, "  %s: %d%% (%s of %s modelled) after %s, about %s left%s\n", policy, int(frac*100),
		minutes(elapsed), minutes(total), now.Sub(began).Round(time.Second), left.Round(time.Second), caveat)
}

// left estimates the wall time to the end at the pace of the last tenth
// of the modelled time: a run slows as contexts grow and caches fill, so
// the pace since the start promises too little. Under a shift whose mix
// ahead differs from the last tenth's, it says that the estimate holds
// only at the pace so far: the two workloads run at very different paces
// (a 256-GPU run spent 2 minutes on an hour of math and 16 on an hour of
// computer use), and a blend fitted to the mix seen so far still missed
// by half in a real run, as active sessions lag the schedule and the
// second workload slows as its contexts grow.
func (r *progressRun) left(total time.Duration, shift *workload.Shift) (time.Duration, string) {
	recent, from := r.recentLeft(total)
	last := r.samples[len(r.samples)-1]
	if shift == nil || last.modelled >= total || last.modelled <= from {
		return recent, ""
	}
	mixRecent := mixIntegral(shift, from, last.modelled) / (last.modelled - from).Seconds()
	mixAhead := mixIntegral(shift, last.modelled, total) / (total - last.modelled).Seconds()
	if math.Abs(mixAhead-mixRecent) <= 0.05 {
		return recent, ""
	}
	return recent, fmt.Sprintf(" at the pace so far (%.0f%% of new sessions ran %s lately, %.0f%% will ahead: expect it to change)",
		100*mixRecent, shift.To.Name(), 100*mixAhead)
}

// mixIntegral is the modelled seconds between from and to that a shift
// gives to its second workload (its share is linear in between the
// holds, so a fine trapezoid sum is exact enough for an estimate).
func mixIntegral(shift *workload.Shift, from, to time.Duration) float64 {
	const steps = 32
	if to <= from {
		return 0
	}
	h := (to - from) / steps
	sum := (shift.Fraction(from) + shift.Fraction(to)) / 2
	for i := 1; i < steps; i++ {
		sum += shift.Fraction(from + time.Duration(i)*h)
	}
	return sum * h.Seconds()
}

// recentLeft is the wall time to the end at the pace of the last tenth,
// and the modelled time that tenth began.
func (r *progressRun) recentLeft(total time.Duration) (time.Duration, time.Duration) {
	last := r.samples[len(r.samples)-1]
	from := r.samples[0]
	for i := len(r.samples) - 2; i >= 0; i-- {
		from = r.samples[i]
		if last.modelled-from.modelled >= total/10 {
			break
		}
	}
	if last.modelled <= from.modelled {
		return 0, from.modelled
	}
	pace := float64(last.wall.Sub(from.wall)) / float64(last.modelled-from.modelled)
	return time.Duration(pace * float64(total-last.modelled)), from.modelled
}

// minutes writes d to the minute: 1h10m, 5m.
func minutes(d time.Duration) string {
	return strings.TrimSuffix(d.Round(time.Minute).String(), "0s")
}

// traceDrain is how long a trace's replay is scored after its last request
// arrives, by default, so that the requests still in flight finish.
const traceDrain = 10 * time.Minute

// traceWarmup is a trace replay's default warm-up: its first sixth, to
// the minute and at most 10 minutes (the presets warm up 10 of 60), so
// that every policy has served the same requests before scoring starts
// and a planner has had time to fit the split; none for a trace shorter
// than 6 minutes, too short for any planner to act on.
func traceWarmup(span time.Duration) time.Duration {
	return min(span/6, 10*time.Minute).Truncate(time.Minute)
}

// traceWarmupNote says in the table's heading how a trace replay was
// scored: after which warm-up, and why.
func traceWarmupNote(warm time.Duration, asked bool) string {
	switch {
	case asked:
		return fmt.Sprintf("after %v (--warmup)", warm)
	case warm == 0:
		return "from its start (no warm-up: the trace is too short for one)"
	}
	return fmt.Sprintf("after its first %v, served by every policy as a warm-up", warm)
}

// simTrace is a trace that evolve sim replays instead of agents.
type simTrace struct {
	path     string
	recs     []workload.TraceRecord
	playback float64
	span     time.Duration // modelled: the last request's arrival, at playback
}

// readSimTrace reads --trace (nil without one), refusing flags that only
// agents take.
func readSimTrace(cmd *cobra.Command, path string, playback float64) (*simTrace, error) {
	if path == "" {
		if cmd.Flags().Changed("playback") {
			return nil, fmt.Errorf("--playback applies to a --trace replay")
		}
		return nil, nil
	}
	for _, f := range []string{"workload", "agents", "preset"} {
		if cmd.Flags().Changed(f) {
			return nil, fmt.Errorf("--trace replays recorded requests: it takes no --%s (set --gpus and --profile for the cluster)", f)
		}
	}
	if playback <= 0 || math.IsInf(playback, 0) || math.IsNaN(playback) {
		return nil, fmt.Errorf("--playback %g: want a positive factor (2 replays twice as fast as recorded)", playback)
	}
	recs, err := readTraceFile(path)
	if err != nil {
		return nil, fmt.Errorf("--trace: %w", err)
	}
	if len(recs) == 0 {
		return nil, fmt.Errorf("--trace %s: no requests in it", path)
	}
	return &simTrace{path: path, recs: recs, playback: playback, span: workload.TraceSpan(recs, playback)}, nil
}

// isSweep reports whether a policy name runs several simulations (a :best
// or :best-throughput sweep, or the oracle over every split) rather than
// one.
func isSweep(name string) bool {
	return strings.HasSuffix(name, ":best") || strings.HasSuffix(name, ":best-throughput") || name == "oracle" || name == "oracle-throughput"
}
