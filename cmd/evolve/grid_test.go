package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/evolvellm/evolve/internal/wait"
)

// gridOutput is evolve sim --grid -o json, as far as the tests read it.
type gridOutput struct {
	Rows []struct {
		Workload       string  `json:"workload"`
		Agents         int     `json:"agents"`
		EvolveVsStatic float64 `json:"evolve_vs_static_best"`
		Results        []struct {
			Policy   string  `json:"policy"`
			MeanE2E  float64 `json:"mean_e2e_s"`
			Requests int     `json:"requests_completed"`
		} `json:"results"`
	} `json:"rows"`
	Summary struct {
		Rows     int `json:"rows"`
		AtStatic int `json:"evolve_within_1pct_of_static_best"`
	} `json:"summary"`
}

// The small grid shipped with evolve (a prompt-heavy fleet, an
// output-heavy one and a shift between them, each near what its cluster
// can serve) runs end to end, and on every row evolve is no more than 1%
// behind the best fixed split: where a fixed split is best, it finds it
// (from its 1:2 start, computer use wants 2:1) and stays.
func TestSmallGridKeepsEvolveAtStaticBest(t *testing.T) {
	out, code := runBinOut(t, nil, "sim", "--grid", "small", "-o", "json")
	var g gridOutput
	if code != 0 || json.Unmarshal([]byte(out), &g) != nil {
		t.Fatalf("sim --grid small: exit %d\n%s", code, out)
	}
	if len(g.Rows) != 3 || g.Summary.Rows != 3 {
		t.Fatalf("%d rows, summary over %d: want 3\n%s", len(g.Rows), g.Summary.Rows, out)
	}
	for _, r := range g.Rows {
		var static, evolve float64
		for _, res := range r.Results {
			switch res.Policy {
			case "static:best":
				static = res.MeanE2E
			case "evolve":
				evolve = res.MeanE2E
			}
		}
		if r.Agents < 10 || static <= 0 || evolve <= 0 {
			t.Fatalf("%s: %d agents, static:best %.2f s, evolve %.2f s", r.Workload, r.Agents, static, evolve)
		}
		if evolve > 1.01*static || r.EvolveVsStatic != evolve/static {
			t.Errorf("%s: evolve %.2f s against static:best %.2f s (ratio %.3f): more than 1%% behind", r.Workload, evolve, static, r.EvolveVsStatic)
		}
	}
	if g.Summary.AtStatic != 3 {
		t.Errorf("summary: evolve within 1%% of static:best on %d of 3", g.Summary.AtStatic)
	}
}

// A grid takes its scenarios from its file: flags that set one scenario
// are refused beside it, as is a file that names no cluster, and
// --grid-results needs --grid.
func TestGridRefusesWhatItCannotRun(t *testing.T) {
	dir := t.TempDir()
	noSizes := filepath.Join(dir, "nosizes.yaml")
	os.WriteFile(noSizes, []byte("workloads: [math]\nprofiles: [gb300-glm5]\nloads: [0.6]\n"), 0o644)
	oneEngine := filepath.Join(dir, "one.yaml")
	os.WriteFile(oneEngine, []byte("workloads: [math]\nprofiles: [h100-glm46]\ngpus: [8]\nloads: [0.6]\n"), 0o644)
	for _, c := range []struct {
		args []string
		says string
	}{
		{[]string{"--grid", "small", "--gpus", "16"}, "--gpus cannot be given beside it"},
		{[]string{"--grid", noSizes}, "gpus (or engines)"},
		{[]string{"--grid", oneEngine}, "at least two engines"},
		{[]string{"--grid", filepath.Join(dir, "none.yaml")}, "name a grid shipped with evolve: small"},
		{[]string{"--grid-results", filepath.Join(dir, "r.jsonl")}, "give --grid too"},
	} {
		out, code := runBinOut(t, nil, append([]string{"sim"}, c.args...)...)
		if code != 2 || !strings.Contains(out, c.says) || strings.Contains(out, "scenarios (") {
			t.Errorf("sim %v: exit %d, want 2 and %q:\n%s", c.args, code, c.says, out)
		}
	}
}

// SIGTERM stops a grid at its simulations' next modelled minute: the
// rows that ended are printed with the summary over them, the kept rows
// file holds them, and a second run with it goes on from there.
func TestGridStopsOnSIGTERMWithWhatItHas(t *testing.T) {
	kept := filepath.Join(t.TempDir(), "rows.jsonl")
	cmd, out := startBin(t, []string{"XDG_CONFIG_HOME=" + t.TempDir()}, "sim", "--grid", "small", "--grid-results", kept)
	wait.Until(t, 60*time.Second, "the first scenario ends", func() bool { return strings.Contains(out.String(), "[1/3]") })
	signalAndWait(t, cmd, syscall.SIGTERM, out)
	s := out.String()
	if cmd.ProcessState.ExitCode() != 1 || !strings.Contains(s, "interrupted") || !strings.Contains(s, "summary over") ||
		!strings.Contains(s, "computer-use") {
		t.Fatalf("after SIGTERM: exit %d\n%s", cmd.ProcessState.ExitCode(), s)
	}
	b, err := os.ReadFile(kept)
	if err != nil || strings.Count(string(b), "\n") < 1 {
		t.Fatalf("kept rows: %v\n%s", err, b)
	}
	// Going on: the kept rows are not run again, the rest are.
	keptRows := strings.Count(string(b), "\n")
	again, code := runBin(t, nil, "sim", "--grid", "small", "--grid-results", kept)
	if ran := strings.Count(again, "/3] "); code != 0 || ran != 3-keptRows || !strings.Contains(again, "summary over 3 scenarios") {
		t.Fatalf("going on with %d rows kept: exit %d, %d scenarios ran\n%s", keptRows, code, ran, again)
	}
}
