package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/evolvellm/evolve/engine/stepmodel"
	"github.com/evolvellm/evolve/planner"
	"github.com/evolvellm/evolve/sim"
	"github.com/evolvellm/evolve/sim/live"
	simplot "github.com/evolvellm/evolve/sim/plot"
	"github.com/evolvellm/evolve/workload"
	"github.com/spf13/cobra"
)

// simRun is one evolve sim: its flags read and checked (parseSim), its
// simulations run (run), its results written and printed.
type simRun struct {
	cmd          *cobra.Command
	k            func(string) string // the flag's config key
	gpus         int
	profile      string // as named
	prof         *stepmodel.Profile
	profileBlock int // the profile's own KV block size (before --kv-block-tokens)
	tr           *simTrace
	model        workload.Model
	sc           sim.Scenario
	names        []string
	plotFormat   string
}

func runSim(cmd *cobra.Command, _ []string) error {
	if path := config.GetString(cfgKey(cmd) + ".grid"); path != "" {
		g, err := parseGrid(cmd, path)
		if err != nil {
			return usageError{cmd: cmd.CommandPath(), err: err}
		}
		return g.run()
	}
	if cmd.Flags().Changed("grid-results") {
		return usageError{cmd: cmd.CommandPath(), err: fmt.Errorf("--grid-results keeps the rows of a --grid run: give --grid too")}
	}
	r, err := parseSim(cmd)
	if err != nil {
		return usageError{cmd: cmd.CommandPath(), err: err}
	}
	return r.run()
}

// parseSim reads evolve sim's flags, its preset and its trace, and checks
// everything a run needs before the first simulation starts: an hour of
// simulation must not end in a bad flag or a file it cannot write.
func parseSim(cmd *cobra.Command) (*simRun, error) {
	r := &simRun{cmd: cmd, k: func(s string) string { return cfgKey(cmd) + "." + s }}
	k := r.k
	r.gpus, r.profile = config.GetInt(k("gpus")), config.GetString(k("profile"))
	wl, agents := config.GetString(k("workload")), config.GetInt(k("agents"))
	dur, warm := config.GetDuration(k("duration")), config.GetDuration(k("warmup"))
	if name := config.GetString(k("preset")); name != "" {
		p, ok := presets[name]
		if !ok {
			return nil, fmt.Errorf("unknown preset %q (have %s)", name, strings.Join(presetNames(), ", "))
		}
		p.apply(cmd.Flags().Changed, &r.gpus, &r.profile, &wl, &agents, &dur, &warm)
	}
	var err error
	if r.tr, err = readSimTrace(cmd, config.GetString(k("trace")), config.GetFloat64(k("playback"))); err != nil {
		return nil, err
	}
	if r.tr != nil {
		// The trace replaces the agents. Its first part warms every
		// policy up (traceWarmup) and is not scored, so that a planner
		// that starts from the recipe split is not judged on the minutes
		// a fixed split did not need; it is scored until its last
		// request has had time to finish.
		if !cmd.Flags().Changed("warmup") {
			warm = traceWarmup(r.tr.span)
		}
		if !cmd.Flags().Changed("duration") {
			dur = max(r.tr.span-warm, 0).Truncate(time.Minute) + time.Minute + traceDrain
		}
	}
	if r.prof, err = loadProfile(r.profile); err != nil {
		return nil, err
	}
	r.profileBlock = r.prof.BlockSize
	if bt := config.GetInt(k("kv-block-tokens")); bt != 0 {
		if r.prof, err = r.prof.WithBlockSize(bt); err != nil {
			return nil, fmt.Errorf("--kv-block-tokens: %w", err)
		}
	}
	if r.gpus < 2*r.prof.GPUs || r.gpus%r.prof.GPUs != 0 {
		return nil, fmt.Errorf("--gpus %d: want a multiple of %d (GPUs per engine), at least two engines", r.gpus, r.prof.GPUs)
	}
	if seg := config.GetDuration(k("oracle-segment")); seg <= 0 {
		return nil, fmt.Errorf("--oracle-segment %v: want a positive duration such as 10m", seg)
	}
	if err := checkMinImprovement(config.GetFloat64(k("planner-min-improvement"))); err != nil {
		return nil, err
	}
	r.sc = sim.Scenario{Profile: r.prof, Engines: r.gpus / r.prof.GPUs, Workload: wl, Agents: agents, Warmup: warm, Duration: dur,
		Seed: uint64(config.GetInt64(k("seed"))), Eviction: config.GetString(k("eviction")), DrainSwitches: !config.GetBool(k("handover")),
		OracleSegment: config.GetDuration(k("oracle-segment")),
		Planner: planner.Config{Interval: config.GetDuration(k("planner-interval")), Persistence: config.GetDuration(k("planner-persistence")),
			TTFTWeight: config.GetFloat64(k("planner-ttft-weight")), MinImprovement: config.GetFloat64(k("planner-min-improvement")),
			TTFTSLO: config.GetDuration(k("planner-ttft-slo")).Seconds()}}
	if r.tr != nil {
		r.sc.Trace, r.sc.TimeScale = r.tr.recs, 1/r.tr.playback
	} else if r.model, err = workload.New(wl, agents); err != nil {
		return nil, fmt.Errorf("--workload: %w", err)
	}
	if pc := r.sc.Planner; pc.Interval < 0 || pc.Persistence < 0 || pc.TTFTWeight < 0 || pc.TTFTSLO < 0 {
		return nil, fmt.Errorf("--planner-interval, --planner-persistence, --planner-ttft-weight and --planner-ttft-slo must not be negative (0: the default)")
	}
	if e := r.sc.Eviction; e != "ref" && e != "lru" {
		return nil, fmt.Errorf("--eviction %q: want ref or lru", e)
	}
	if err := r.sc.Validate(); err != nil {
		return nil, err
	}
	r.names = strings.Split(config.GetString(k("policies")), ",")
	if err := checkSimPolicies(r.names, r.sc.Engines); err != nil {
		return nil, err
	}
	if path := config.GetString(k("plot")); path != "" {
		if r.plotFormat, err = simplot.FormatOf(path); err != nil {
			return nil, fmt.Errorf("--plot %w", err)
		}
	}
	for _, flag := range []string{"timeline", "plot", "memprofile"} {
		if path := config.GetString(k(flag)); path != "" {
			if err := checkWritable(path); err != nil {
				return nil, fmt.Errorf("--%s: %w", flag, err)
			}
		}
	}
	if config.GetString(k("record")) != "" && (len(r.names) != 1 || isSweep(r.names[0])) {
		return nil, fmt.Errorf("--record writes the calls of one simulation, and --policies %s runs several: name one policy (--policies evolve)",
			strings.Join(r.names, ","))
	}
	if config.GetString(k("live")) != "" {
		for _, n := range r.names {
			if isSweep(n) {
				return nil, fmt.Errorf("--live watches named policies, and %s runs a sweep of simulations: name its split (static:3:6)", n)
			}
		}
		if pace := config.GetFloat64(k("pace")); pace < 0 {
			return nil, fmt.Errorf("--pace %g: want modelled seconds per wall second, 0 for as fast as possible", pace)
		}
	}
	return r, nil
}

// apply sets what the preset gives and the command line did not.
func (p preset) apply(changed func(string) bool, gpus *int, profile, wl *string, agents *int, dur, warm *time.Duration) {
	if !changed("gpus") {
		*gpus = p.gpus
	}
	if !changed("profile") {
		*profile = p.profile
	}
	if !changed("workload") {
		*wl = p.workload
	}
	if !changed("agents") {
		*agents = p.agents
	}
	if !changed("duration") {
		*dur = p.scored
	}
	if !changed("warmup") {
		*warm = p.warmup
	}
}

// checkSimPolicies checks --policies: each named once, each known.
func checkSimPolicies(names []string, engines int) error {
	seen := map[string]bool{}
	for _, n := range names {
		if seen[n] {
			return fmt.Errorf("--policies names %q twice (a column per policy: name each once)", n)
		}
		seen[n] = true
		if isSweep(n) {
			continue
		}
		if _, err := sim.ParsePolicy(n, engines); err != nil {
			return err
		}
	}
	return nil
}

// simOutcome is what the simulations gave: the results of those that
// ended, what an interrupt cut short, and how fast each ran.
type simOutcome struct {
	results []sim.Result
	cut     *sim.InterruptedError
	speeds  []selfProfile
	start   time.Time
}

// run runs the simulations, writes the files asked for and prints the
// table. Ctrl-C stops the simulations at their next modelled minute; those
// that ended still print their results.
func (r *simRun) run() error {
	k, errw := r.k, r.cmd.ErrOrStderr()
	var rec *recording
	if path := config.GetString(k("record")); path != "" {
		var err error
		if rec, err = startRecording(path); err != nil {
			return usageError{cmd: r.cmd.CommandPath(), err: fmt.Errorf("--record: %w", err)}
		}
		defer rec.discard() // nothing left once kept
	}
	limitMemory()
	var srv *live.Server
	if addr := config.GetString(k("live")); addr != "" {
		var stop func()
		var err error
		if srv, stop, err = serveLive(errw, addr, r.names, r.prof.Model, config.GetFloat64(k("pace"))); err != nil {
			return err
		}
		defer stop()
	}
	if path := config.GetString(k("cpuprofile")); path != "" {
		pf, err := os.Create(path)
		if err != nil {
			return fmt.Errorf("--cpuprofile: %w", err)
		}
		defer pf.Close()
		if err := pprof.StartCPUProfile(pf); err != nil {
			return fmt.Errorf("--cpuprofile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	ctx, stop := notifyInterrupt(r.cmd.Context())
	defer stop()
	o := &simOutcome{start: time.Now()}
	hooks := r.hooks(o, srv, rec)
	hooks.Cancelled = func() bool { return ctx.Err() != nil }
	scoredTrace := r.noteTrace()
	var err error
	o.results, err = sim.Compare(r.sc, r.names, hooks)
	for _, res := range o.results {
		if r.tr != nil && res.Requests < scoredTrace {
			fmt.Fprintf(errw, "%s: %d of the %d scored requests finished in the scored time; the rest were still in flight (a longer --duration lets them finish)\n",
				res.Policy, res.Requests, scoredTrace)
		}
	}
	if errors.As(err, &o.cut) {
		o.results = append([]sim.Result{}, o.results...) // [] in JSON, not null
		fmt.Fprintf(errw, "\ninterrupted: printing the %d of %d policies whose simulations ended\n", len(o.results), len(r.names))
	} else if err != nil {
		return usageError{cmd: r.cmd.CommandPath(), err: err}
	}
	if srv != nil {
		defer holdLive(ctx, errw)
	}
	// A file that cannot be written still leaves the results printed.
	fileErrs := r.writeFiles(o.results, rec)
	out := r.summary(o)
	if config.GetBool(k("profile-self")) {
		total := time.Since(o.start)
		defer printSelfProfile(errw, o.speeds, total)
	}
	if err := output(r.cmd, out, func(w *tabwriter.Writer, _ bool) { r.printTable(w, o.results) }); err != nil {
		return err
	}
	if o.cut != nil {
		fileErrs = append(fileErrs, o.cut)
	}
	return errors.Join(fileErrs...)
}

// hooks reports the simulations' progress on stderr, serves them live to
// srv and records their calls to rec (each when not nil), and notes how
// fast each ran in o.
func (r *simRun) hooks(o *simOutcome, srv *live.Server, rec *recording) *sim.Hooks {
	errw := r.cmd.ErrOrStderr()
	var mu sync.Mutex // simulations report progress from their goroutines
	began := map[string]time.Time{}
	prog := newSimProgress(errw, config.GetDuration(r.k("progress-every")))
	if sh, ok := r.model.(*workload.Shift); ok {
		prog.shift = sh
	}
	hooks := &sim.Hooks{
		Start: func(p string) {
			mu.Lock()
			defer mu.Unlock()
			began[p] = time.Now()
			fmt.Fprintf(errw, "simulating %s (%s elapsed)\n", p, time.Since(o.start).Round(time.Second))
		},
		Progress: func(p string, elapsed, total time.Duration) {
			mu.Lock()
			defer mu.Unlock()
			prog.report(p, began[p], elapsed, total)
		},
		Done: func(p string, res sim.Result) {
			mu.Lock()
			defer mu.Unlock()
			if srv != nil {
				srv.Done(p)
			}
			wall := time.Since(began[p]).Seconds()
			o.speeds = append(o.speeds, selfProfile{Policy: p, WallSec: wall, ModelledSec: res.VirtualSec,
				XRealtime: res.VirtualSec / wall, EnginePasses: res.EnginePasses, PassesPerSec: float64(res.EnginePasses) / wall})
		},
	}
	if srv != nil {
		hooks.Watch = srv.Watch
	}
	if rec != nil {
		hooks.Call = func(_ string, at time.Duration, call workload.Call) {
			rec.write(float64(at)/float64(time.Millisecond), call)
		}
	}
	return hooks
}

// noteTrace says what a trace replay will score, and returns how many of
// its requests arrive in the scored time and fit the model (0 without a
// trace).
func (r *simRun) noteTrace() int {
	if r.tr == nil {
		return 0
	}
	scored, tooLong := 0, 0
	for _, rec := range r.tr.recs {
		if rec.InputLength >= r.prof.MaxModelLen {
			tooLong++
			continue
		}
		if at := rec.At(r.tr.playback); at >= r.sc.Warmup && at <= r.sc.Warmup+r.sc.Duration {
			scored++
		}
	}
	errw := r.cmd.ErrOrStderr()
	fmt.Fprintf(errw, "replaying %d requests from %s at %gx: they arrive over %v; %d of them arrive in the scored %v after %v\n",
		len(r.tr.recs), r.tr.path, r.tr.playback, r.tr.span.Round(time.Second), scored, r.sc.Duration, r.sc.Warmup)
	if tooLong > 0 {
		fmt.Fprintf(errw, "%d requests left out: their prompts exceed the model's context (%d tokens in %s), as evolve bench skips them\n",
			tooLong, r.prof.MaxModelLen, r.prof.Name)
	}
	return scored
}

// writeFiles writes the heap profile, the recording (kept when
// interrupted too: what was recorded is a trace), the timeline and the
// plot asked for, and returns what could not be written.
func (r *simRun) writeFiles(results []sim.Result, rec *recording) []error {
	k, errw := r.k, r.cmd.ErrOrStderr()
	var fileErrs []error
	if path := config.GetString(k("memprofile")); path != "" {
		// Its alloc_space samples say where the simulations' memory went.
		if err := writeFile(path, func(w io.Writer) error { return pprof.Lookup("heap").WriteTo(w, 0) }); err != nil {
			fileErrs = append(fileErrs, fmt.Errorf("--memprofile: %w", err))
		}
	}
	if rec != nil {
		if err := rec.keep(); err != nil {
			fileErrs = append(fileErrs, err)
		} else {
			fmt.Fprintf(errw, "record: %d calls of %s written to %s\n", rec.calls, r.names[0], rec.path)
		}
	}
	for _, file := range []struct {
		flag  string
		write func(io.Writer, []sim.Result) error
	}{{"timeline", sim.WriteTimeline}, {"plot", func(w io.Writer, rs []sim.Result) error {
		return simplot.WriteScenario(w, r.plotFormat, rs, r.sc)
	}}} {
		if path := config.GetString(k(file.flag)); path != "" {
			if err := writeFile(path, func(w io.Writer) error { return file.write(w, results) }); err != nil {
				fileErrs = append(fileErrs, fmt.Errorf("--%s: %w", file.flag, err))
				continue
			}
			fmt.Fprintf(errw, "%s written to %s\n", file.flag, path)
		}
	}
	return fileErrs
}

// summary is evolve sim's -o json: the scenario, the results, and what an
// interrupt left unfinished.
func (r *simRun) summary(o *simOutcome) map[string]any {
	sc := r.sc
	scenario := map[string]any{"gpus": r.gpus, "engines": sc.Engines, "profile": r.profile, "workload": sc.Workload,
		"agents": sc.Agents, "warmup_s": sc.Warmup.Seconds(), "duration_s": sc.Duration.Seconds(), "seed": sc.Seed, "kv_block_tokens": r.prof.BlockSize}
	for key, v := range map[string]float64{"planner_interval_s": sc.Planner.Interval.Seconds(), "planner_persistence_s": sc.Planner.Persistence.Seconds(),
		"planner_ttft_weight": sc.Planner.TTFTWeight, "planner_min_improvement": sc.Planner.MinImprovement, "planner_ttft_slo_s": sc.Planner.TTFTSLO} {
		if v > 0 {
			scenario[key] = v
		}
	}
	if sc.DrainSwitches {
		scenario["handover"] = false
	}
	if sc.Eviction == "lru" {
		scenario["eviction"] = "lru"
	}
	if r.tr != nil {
		delete(scenario, "workload")
		delete(scenario, "agents")
		scenario["trace"], scenario["playback"], scenario["trace_requests"] = r.tr.path, r.tr.playback, len(r.tr.recs)
	}
	out := map[string]any{"scenario": scenario, "results": o.results, "wall_s": time.Since(o.start).Seconds()}
	if o.cut != nil {
		type unfinished struct {
			Policy    string  `json:"policy"`
			ModelledS float64 `json:"modelled_s"`
			TotalS    float64 `json:"total_s"`
		}
		var us []unfinished
		for _, u := range o.cut.Unfinished {
			us = append(us, unfinished{u.Policy, u.Elapsed.Seconds(), u.Total.Seconds()})
		}
		out["interrupted"] = map[string]any{"no_result": o.cut.Names, "unfinished": us}
	}
	if config.GetBool(r.k("profile-self")) {
		out["profile_self"] = o.speeds
	}
	return out
}

// printTable prints the results side by side, a column per policy.
func (r *simRun) printTable(w *tabwriter.Writer, results []sim.Result) {
	if len(results) == 0 {
		return // interrupted before any ended
	}
	sc, tr := r.sc, r.tr
	who := counted(sc.Agents, sc.Workload+" agent")
	if tr != nil {
		who = fmt.Sprintf("%d requests of %s at %gx", len(tr.recs), filepath.Base(tr.path), tr.playback)
	}
	var how string
	if sc.DrainSwitches {
		how += "; evolve's switching nodes finish their decodes (--handover=false)"
	}
	if sc.Eviction == "lru" {
		how += "; evolve evicts by plain LRU (--eviction lru)"
	}
	if r.prof.BlockSize != r.profileBlock {
		how += fmt.Sprintf("; KV modelled in %d-token blocks (--kv-block-tokens)", r.prof.BlockSize)
	}
	warm := fmt.Sprintf("after %v", sc.Warmup)
	if tr != nil {
		warm = traceWarmupNote(sc.Warmup, r.cmd.Flags().Changed("warmup"))
	}
	fmt.Fprintf(w, "%d GPUs (%d engines, %s), %s, %v scored %s, seed %d%s\n\n", r.gpus, sc.Engines, r.profile, who, sc.Duration, warm, sc.Seed, how)
	fmt.Fprint(w, "metric")
	for _, res := range results {
		fmt.Fprintf(w, "\t%s", res.Policy)
	}
	fmt.Fprintln(w)
	row := func(name string, f func(r sim.Result) string) {
		fmt.Fprint(w, name)
		for _, res := range results {
			fmt.Fprintf(w, "\t%s", f(res))
		}
		fmt.Fprintln(w)
	}
	sec := func(v float64) string { return fmt.Sprintf("%.2f", v) }
	row("split P:D", func(r sim.Result) string { return r.Split })
	// Unfinished requests count their age at the scored window's end in
	// the E2E rows; the finished alone are beside them.
	row("mean E2E (s)", func(r sim.Result) string { return sec(r.MeanE2E) })
	row("mean E2E, finished (s)", func(r sim.Result) string { return sec(r.MeanE2EFinished) })
	row("P50 E2E (s)", func(r sim.Result) string { return sec(r.P50E2E) })
	row("P99 E2E (s)", func(r sim.Result) string { return sec(r.P99E2E) })
	row("P50 TTFT (s)", func(r sim.Result) string { return sec(r.P50TTFT) })
	row("P95 TTFT (s)", func(r sim.Result) string { return sec(r.P95TTFT) })
	row("P99 TTFT (s)", func(r sim.Result) string { return sec(r.P99TTFT) })
	// A trace without sessions (Mooncake's) has none to count.
	if tr == nil || slices.ContainsFunc(results, func(r sim.Result) bool { return r.Sessions > 0 }) {
		row("sessions completed", func(r sim.Result) string { return fmt.Sprint(r.Sessions) })
		row("sessions / hour", func(r sim.Result) string { return fmt.Sprintf("%.0f", r.SessionsPerHour) })
	}
	row("requests completed", func(r sim.Result) string { return fmt.Sprint(r.Requests) })
	row("requests unfinished", func(r sim.Result) string { return fmt.Sprint(r.RequestsUnfinished) })
	row("throughput (tok/s)", func(r sim.Result) string { return fmt.Sprintf("%.0f", r.Throughput) })
	pct := func(a, b int64) string {
		if b == 0 {
			return "-"
		}
		return fmt.Sprintf("%.1f%%", 100*float64(a)/float64(b))
	}
	row("prompt KV: GPU hit", func(r sim.Result) string { return pct(r.GPUHitTokens, r.PromptTokens) })
	row("prompt KV: host hit", func(r sim.Result) string { return pct(r.HostHitTokens, r.PromptTokens) })
	row("prompt KV: computed", func(r sim.Result) string { return pct(r.ComputedTokens, r.PromptTokens) })
	// Of those, what decode engines pulled from prefill engines (evolve
	// bench's "moved from prefill to decode engines").
	row("prompt KV: moved P->D", func(r sim.Result) string { return pct(r.TransferredTokens, r.PromptTokens) })
	row("lost KV reuse (tokens)", func(r sim.Result) string { return fmt.Sprint(r.LostKVReuse) })
	row("role switches", func(r sim.Result) string { return fmt.Sprint(r.RoleSwitches) })
	row("requests retried", func(r sim.Result) string { return fmt.Sprint(r.Retried) })
	row("decodes handed over", func(r sim.Result) string { return fmt.Sprint(r.HandedOver) })
	row("preemptions", func(r sim.Result) string { return fmt.Sprint(r.Preemptions) })
}
