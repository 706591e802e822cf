package main

import (
	"os/exec"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/evolvellm/evolve/loadgen"
	"github.com/evolvellm/evolve/tui"
	"github.com/evolvellm/evolve/workload"
)

// narrowLines fails for a line wider than 80 columns (but those that
// name a path under skip, which are as long as the path).
func narrowLines(t *testing.T, out string, skip ...string) {
	t.Helper()
	for _, l := range strings.Split(out, "\n") {
		if len(skip) > 0 && strings.Contains(l, skip[0]) {
			continue
		}
		if n := utf8.RuneCountInString(l); n > 80 {
			t.Fatalf("a line of %d columns:\n%s\nin\n%s", n, l, out)
		}
	}
}

// evolve up --agents' progress fits 80 columns and says the workload's
// phase and the modelled time, with a line where the schedule changes
// phase; the summary lists the planner's moves at their times.
func TestAgentProgressSaysThePhaseAndFits80Columns(t *testing.T) {
	m, err := workload.New("shift", 24)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	p := newAgentProgress(&b, m, 10, 80)
	p.intro(24, "gb300-kimi-k2")
	p.start = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	p.total = 20 * time.Minute
	dist := workload.Dist{N: 40, P50: 0.21, P95: 0.38}
	for _, at := range []time.Duration{5 * time.Second, 5 * time.Minute, 6*time.Minute + 5*time.Second, 9 * time.Minute, 12*time.Minute + 5*time.Second} {
		p.line(loadgen.Snapshot{Elapsed: at, Requests: 107849, Errors: 3, TTFT: dist, E2E: workload.Dist{N: 40, P50: 12.4, P95: 148}}, " | split 1P/3D")
	}
	p.line(loadgen.Snapshot{Elapsed: 13 * time.Minute}, " | split 2P/2D")
	out := b.String()
	narrowLines(t, out)
	for _, want := range []string{
		"running 24 shift:math>computer-use:1h:1h:1h agents",
		"math for 1h00m, then a change to computer-use over 1h00m",
		"a wall minute is 10m00s modelled",
		"t=5s/20m00s  50s modelled: math  1P/3D  107849 req, 3 err  TTFT 0.21s/0.38s",
		"-- 6m00s wall, 1h00m modelled: the change to computer-use began",
		"t=6m05s/20m00s  1h00m modelled: →computer-use 1%",
		"t=9m00s/20m00s  1h30m modelled: →computer-use 50%",
		"-- 12m00s wall, 2h00m modelled: computer-use alone from here on",
		"t=12m05s/20m00s  2h00m modelled: computer-use",
		"2P/2D  0 req  TTFT -  E2E -", // no answer finished: no latency of 0; no errors: none said
	} {
		if !strings.Contains(out, want) {
			t.Errorf("progress lacks %q:\n%s", want, out)
		}
	}
	// A long line goes on, indented, on the next.
	if !strings.Contains(out, "\n    E2E 12s/148s") {
		t.Errorf("the long lines do not wrap at their segments:\n%s", out)
	}

	// The summary's table fits too, a long value going on under itself.
	b.Reset()
	fw := &fitWriter{w: &b, width: 80}
	fw.Write([]byte("throughput  31700 output tokens/s\nprompt KV   96.7% GPU hit, 0.0% host hit, 3.3% computed; 2.6% moved from prefill to decode engines\n"))
	if got := b.String(); got != "throughput  31700 output tokens/s\nprompt KV   96.7% GPU hit, 0.0% host hit, 3.3% computed; 2.6% moved from prefill\n            to decode engines\n" {
		t.Errorf("fitted summary:\n%s", got)
	}

	b.Reset()
	p.width = 80
	p.moves(&b, []tui.Decision{
		{Time: p.start.Add(-time.Minute), Action: "move", Moves: []tui.Move{{Node: "engine-9", To: "decode"}}}, // before the run
		{Time: p.start.Add(time.Minute), Action: "hold", Reason: "steady"},
		{Time: p.start.Add(12*time.Minute + 35*time.Second), Action: "move", Reason: "1:3 -> 2:2: objective 16.2s -> 11.0s, gain 475 request-s > cost 40, held 62s",
			Moves: []tui.Move{{Node: "engine-1", To: "prefill"}}},
	})
	out = b.String()
	narrowLines(t, out)
	if !strings.Contains(out, "planner     1 move:") || !strings.Contains(out, "12m35s wall (2h05m modelled): engine-1 to prefill; 1:3 -> 2:2") || strings.Contains(out, "engine-9") {
		t.Fatalf("moves:\n%s", out)
	}
	b.Reset()
	p.moves(&b, nil)
	if !strings.Contains(b.String(), "no moves") {
		t.Fatalf("no moves:\n%s", b.String())
	}
}

// The real thing: a short run of evolve up --agents writes lines that fit
// 80 columns, its phase and modelled time, and a summary that names the
// planner's moves.
func TestUpAgentsOutputFits80Columns(t *testing.T) {
	state := t.TempDir()
	env := []string{"XDG_STATE_HOME=" + state}
	cmd := exec.Command(evolveBin, "up", "--agents", "4", "--workload", "shift:math>computer-use:60s:60s:10m", "--duration", "11s", "--engines", "2",
		"--profile", "gb300-kimi-k2", "--speedup", "10", "--router-addr", "127.0.0.1:0", "--control-addr", "127.0.0.1:0")
	cmd.Env = append(cmd.Environ(), env...)
	b, err := cmd.CombinedOutput()
	out := string(b)
	if err != nil {
		t.Fatalf("up --agents: %v\n%s", err, out)
	}
	narrowLines(t, out, state)
	for _, want := range []string{"t=5s/11s  50s modelled: math  1P/1D  ", "-- 6s wall, 1m00s modelled: the change to computer-use began",
		"t=10s/11s  1m40s modelled: →computer-use 67%", "planner     "} {
		if !strings.Contains(out, want) {
			t.Errorf("up --agents' output lacks %q:\n%s", want, out)
		}
	}
}

// up --help says what --agents does to the defaults it shows: the
// profile and the speedup it runs with are not the ones shown for them.
func TestUpHelpSaysWhatAgentsChange(t *testing.T) {
	help, code := runBinOut(t, nil, "up", "--help")
	flat := strings.Join(strings.Fields(help), " ")
	for _, want := range []string{
		"unless given, --profile becomes gb300-kimi-k2 (agent-sized contexts) and --speedup 10",
		"(with --agents the default is gb300-kimi-k2)",
		"(with --agents the default is 10)",
	} {
		if code != 0 || !strings.Contains(flat, want) {
			t.Errorf("up --help lacks %q:\n%s", want, help)
		}
	}
}
