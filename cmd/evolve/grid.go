package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/evolvellm/evolve/engine/stepmodel"
	"github.com/evolvellm/evolve/sim"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// gridRun is one evolve sim --grid: the grid file read and checked, its
// scenarios run one after another (each on every core), a row printed
// for each as it ends, and the table and summary at the end.
type gridRun struct {
	cmd     *cobra.Command
	spec    sim.GridSpec
	path    string
	profs   map[string]*stepmodel.Profile
	results string // --grid-results: rows as JSON lines, kept and reused
	done    map[string]sim.GridRow
}

// gridFlags are evolve sim's flags that a grid takes; the grid file sets
// everything else, so any other given beside --grid is refused.
var gridFlags = map[string]bool{"grid": true, "grid-results": true, "output": true, "progress-every": true, "cpuprofile": true}

// parseGrid reads --grid (a file, or the name of a grid shipped with
// evolve) and checks every scenario before the first runs.
func parseGrid(cmd *cobra.Command, path string) (*gridRun, error) {
	var bad []string
	cmd.Flags().Visit(func(f *pflag.Flag) {
		if !gridFlags[f.Name] {
			bad = append(bad, "--"+f.Name)
		}
	})
	if len(bad) > 0 {
		return nil, fmt.Errorf("--grid: the grid file sets the scenarios and policies; %s cannot be given beside it", strings.Join(bad, ", "))
	}
	data, builtin := sim.BuiltinGrid(path)
	if !builtin {
		var err error
		if data, err = os.ReadFile(path); err != nil {
			return nil, fmt.Errorf("--grid: %w (or name a grid shipped with evolve: %s)", err, strings.Join(sim.BuiltinGridNames(), ", "))
		}
	}
	spec, err := sim.ParseGrid(data)
	if err != nil {
		return nil, fmt.Errorf("--grid %s: %w", path, err)
	}
	g := &gridRun{cmd: cmd, spec: spec, path: path, profs: map[string]*stepmodel.Profile{}, done: map[string]sim.GridRow{}}
	for _, name := range spec.Profiles {
		prof, err := loadProfile(name)
		if err != nil {
			return nil, fmt.Errorf("--grid %s: %w", path, err)
		}
		if spec.KVBlockTokens != 0 {
			if prof, err = prof.WithBlockSize(spec.KVBlockTokens); err != nil {
				return nil, fmt.Errorf("--grid %s: kv_block_tokens on %s: %w", path, name, err)
			}
		}
		g.profs[name] = prof
	}
	for _, gs := range g.scenarios() {
		prof := g.profs[gs.Profile]
		if gs.GPUs < 2*prof.GPUs || gs.GPUs%prof.GPUs != 0 {
			return nil, fmt.Errorf("--grid %s: %d GPUs of %s: want a multiple of %d (GPUs per engine), at least two engines", path, gs.GPUs, gs.Profile, prof.GPUs)
		}
	}
	if err := checkSimPolicies(gridNamed(spec.Policies), 3); err != nil {
		return nil, fmt.Errorf("--grid %s: %w", path, err)
	}
	if g.results = config.GetString(cfgKey(cmd) + ".grid-results"); g.results != "" {
		if err := g.readResults(); err != nil {
			return nil, fmt.Errorf("--grid-results: %w", err)
		}
	}
	return g, nil
}

// scenarios lists the grid's scenarios.
func (g *gridRun) scenarios() []sim.GridScenario {
	return g.spec.Scenarios(func(p string) int { return g.profs[p].GPUs })
}

// gridNamed is the grid's policies less the splits, which depend on the
// cluster (checked per scenario).
func gridNamed(ps []string) []string {
	var out []string
	for _, p := range ps {
		if !strings.HasPrefix(p, "static:") || isSweep(p) {
			out = append(out, p)
		}
	}
	return out
}

// gridKey names a scenario in --grid-results.
func gridKey(gs sim.GridScenario) string {
	return fmt.Sprintf("%s|%s|%d|%g|%d", gs.Workload, gs.Profile, gs.GPUs, gs.Load, gs.Seed)
}

// readResults loads the rows an earlier run of the same grid kept, so
// that a grid stopped part way goes on where it was.
func (g *gridRun) readResults() error {
	f, err := os.Open(g.results)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for line := 1; sc.Scan(); line++ {
		var row sim.GridRow
		if err := json.Unmarshal(sc.Bytes(), &row); err != nil {
			return fmt.Errorf("%s:%d: %w", g.results, line, err)
		}
		g.done[gridKey(row.GridScenario)] = row
	}
	return sc.Err()
}

// run runs the grid's scenarios and prints its table and summary.
// SIGTERM or Ctrl-C stops it at the running simulations' next modelled
// minute: the rows that ended still print, with the summary over them.
func (g *gridRun) run() error {
	errw := g.cmd.ErrOrStderr()
	limitMemory()
	ctx, stop := notifyInterrupt(g.cmd.Context())
	defer stop()
	cancelled := func() bool { return ctx.Err() != nil }
	var keep io.Writer
	if g.results != "" {
		f, err := os.OpenFile(g.results, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			return fmt.Errorf("--grid-results: %w", err)
		}
		defer f.Close()
		keep = f
	}
	scenarios := g.scenarios()
	fmt.Fprintf(errw, "grid %s: %d scenarios (%v warm-up + %v scored each, policies %s)\n", g.path, len(scenarios),
		g.spec.WarmupTime(), g.spec.DurationTime(), strings.Join(g.spec.Policies, ","))
	start := time.Now()
	caps := map[string]sim.Capacity{}
	var rows []sim.GridRow
	var cut error
	for k, gs := range scenarios {
		if row, ok := g.done[gridKey(gs)]; ok {
			rows = append(rows, row)
			continue
		}
		if cancelled() {
			cut = fmt.Errorf("interrupted: %d of %d scenarios ran", len(rows), len(scenarios))
			break
		}
		began := time.Now()
		row, err := g.scenario(gs, caps, cancelled)
		if errors.Is(err, sim.ErrInterrupted) {
			cut = fmt.Errorf("interrupted in scenario %d (%s): %d of %d scenarios ran", k+1, gs, len(rows), len(scenarios))
			break
		}
		if err != nil {
			return fmt.Errorf("grid scenario %d (%s): %w", k+1, gs, err)
		}
		row.WallSec = time.Since(began).Seconds()
		rows = append(rows, row)
		if keep != nil {
			b, _ := json.Marshal(row)
			fmt.Fprintf(keep, "%s\n", b)
		}
		left := time.Duration(float64(time.Since(start)) / float64(k+1) * float64(len(scenarios)-k-1))
		fmt.Fprintf(errw, "[%d/%d] %s: %d agents, evolve %.2f s, %.3fx static:best%s (%s; about %s left)\n", k+1, len(scenarios), gs, row.Agents,
			evolveE2E(row), row.EvolveVsStatic, oracleNote(row), time.Since(began).Round(time.Second), left.Round(time.Second))
	}
	if cut != nil {
		fmt.Fprintf(errw, "\n%v: printing those\n", cut)
	}
	sum := sim.SummarizeGrid(rows, 5)
	out := map[string]any{"grid": g.spec, "rows": rows, "summary": sum, "wall_s": time.Since(start).Seconds()}
	if err := output(g.cmd, out, func(w *tabwriter.Writer, _ bool) { printGrid(w, g.spec, rows, sum) }); err != nil {
		return err
	}
	return cut
}

// scenario runs one scenario of the grid: its capacity (probed once per
// workload, profile and size), then every policy.
func (g *gridRun) scenario(gs sim.GridScenario, caps map[string]sim.Capacity, cancelled func() bool) (sim.GridRow, error) {
	prof := g.profs[gs.Profile]
	key := fmt.Sprintf("%s|%s|%d", gs.Workload, gs.Profile, gs.GPUs)
	c, ok := caps[key]
	if !ok {
		var err error
		if c, err = g.spec.GridCapacity(gs, prof, cancelled); err != nil {
			return sim.GridRow{}, fmt.Errorf("capacity: %w", err)
		}
		caps[key] = c
	}
	agents := c.Agents(gs.Load)
	sc := g.spec.Scenario(gs, prof, agents)
	res, err := sim.Compare(sc, g.spec.Policies, &sim.Hooks{Cancelled: cancelled})
	if err != nil {
		return sim.GridRow{}, err
	}
	return sim.NewGridRow(gs, sc.Engines, c, agents, res), nil
}

func evolveE2E(r sim.GridRow) float64 {
	ev, _ := r.Result("evolve")
	return ev.MeanE2E
}

func oracleNote(r sim.GridRow) string {
	if r.EvolveVsOracle == 0 {
		return ""
	}
	return fmt.Sprintf(", %.3fx oracle", r.EvolveVsOracle)
}

// printGrid prints a row per scenario, then the summary.
func printGrid(w *tabwriter.Writer, spec sim.GridSpec, rows []sim.GridRow, sum sim.GridSummary) {
	fmt.Fprintf(w, "mean E2E per scenario (s; unfinished requests count their age at the end), %v scored after %v; evolve's ratio to each baseline (below 1: faster);\n"+
		"sw/rev: evolve's scored switches and its reversals over the run; noise: the standard error of evolve less static:best, from their minutes' means;\n"+
		"headroom: how far the oracle is below static:best; done: requests completed\n\n",
		spec.DurationTime(), spec.WarmupTime())
	fmt.Fprint(w, "#\tworkload\tprofile\tGPUs\tload\tseed\tagents")
	cols := []string{}
	for _, p := range spec.Policies {
		if p != "evolve" {
			cols = append(cols, p)
			fmt.Fprintf(w, "\t%s", p)
		}
	}
	fmt.Fprint(w, "\tevolve\tevolve split\tsw/rev\tvs static:best\tnoise")
	has := func(p string) bool {
		for _, c := range cols {
			if c == p {
				return true
			}
		}
		return false
	}
	if has("oracle") {
		fmt.Fprint(w, "\tvs oracle\theadroom")
	}
	if has("dynamo") {
		fmt.Fprint(w, "\tvs dynamo")
	}
	fmt.Fprint(w, "\tdone evolve/static\n")
	for i, r := range rows {
		fmt.Fprintf(w, "%d\t%s\t%s\t%d\t%.0f%%\t%d\t%d", i+1, r.Workload, r.Profile, r.GPUs, 100*r.Load, r.Seed, r.Agents)
		for _, p := range cols {
			res, ok := r.Result(p)
			switch {
			case !ok:
				fmt.Fprint(w, "\t-")
			case p == "static:best":
				fmt.Fprintf(w, "\t%.2f (%s)", res.MeanE2E, res.Split)
			default:
				fmt.Fprintf(w, "\t%.2f", res.MeanE2E)
			}
		}
		ev, _ := r.Result("evolve")
		st, _ := r.Result("static:best")
		fmt.Fprintf(w, "\t%.2f\t%s\t%d/%d\t%.3f\t%s", ev.MeanE2E, ev.Split, ev.RoleSwitches, ev.Reversals, r.EvolveVsStatic, pctText(r.Noise))
		if has("oracle") {
			fmt.Fprintf(w, "\t%s\t%s", ratioText(r.EvolveVsOracle), pctText(r.Headroom))
		}
		if has("dynamo") {
			fmt.Fprintf(w, "\t%s", ratioText(r.EvolveVsDynamo))
		}
		fmt.Fprintf(w, "\t%d/%d\n", ev.Requests, st.Requests)
	}
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(w, "\nsummary over %d scenarios:\n", sum.Rows)
	fmt.Fprintf(w, "  evolve within 1%% of static:best or better\t%d of %d (%.0f%%), geometric mean %.3fx\n", sum.AtStatic, sum.Rows, pct(sum.AtStatic, sum.Rows), sum.MeanVsStatic)
	fmt.Fprintf(w, "  the same, or behind by at most twice the noise\t%d of %d (%.0f%%)\n", sum.WithinNoise, sum.Rows, pct(sum.WithinNoise, sum.Rows))
	if sum.OracleRows > 0 {
		fmt.Fprintf(w, "  evolve within 3%% of the oracle\t%d of %d (%.0f%%), geometric mean %.3fx\n", sum.NearOracle, sum.OracleRows, pct(sum.NearOracle, sum.OracleRows), sum.MeanVsOracle)
		fmt.Fprintf(w, "  oracle more than 3%% below static:best\t%d of %d\n", sum.Headroom, sum.OracleRows)
	}
	if sum.DynamoRows > 0 {
		fmt.Fprintf(w, "  evolve slower than dynamo\t%d of %d, geometric mean %.3fx\n", sum.BelowDynamo, sum.DynamoRows, sum.MeanVsDynamo)
	}
	fmt.Fprintf(w, "  evolve's switches, reversals\t%d, %d\n", sum.Switches, sum.Reversals)
	var worst []string
	for _, i := range sum.Worst {
		r := rows[i]
		ratio, of := r.EvolveVsOracle, "oracle"
		if ratio == 0 {
			ratio, of = r.EvolveVsStatic, "static:best"
		}
		worst = append(worst, fmt.Sprintf("#%d %.3fx %s", i+1, ratio, of))
	}
	fmt.Fprintf(w, "  worst rows\t%s\n", strings.Join(worst, ", "))
}

func ratioText(v float64) string {
	if v == 0 {
		return "-"
	}
	return fmt.Sprintf("%.3f", v)
}

func pctText(v float64) string { return fmt.Sprintf("%.1f%%", 100*v) }

func pct(a, b int) float64 { return 100 * float64(a) / float64(max(b, 1)) }
