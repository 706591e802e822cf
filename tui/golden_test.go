package tui

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	tea "github.com/charmbracelet/bubbletea"
	"github.com/charmbracelet/x/exp/golden"
	"github.com/charmbracelet/x/exp/teatest"
)

func init() { time.Local = time.UTC } // golden times are written in UTC

// goldenSource is a cluster frozen in time: five nodes, one mid-switch
// and one down, a planner with decisions, two agent sessions with a tree
// of branches, a KV summary, and the orchestrator's record of what
// happened before the monitor started.
type goldenSource struct{ fakeSource }

func (*goldenSource) Cluster(context.Context) (Cluster, error) {
	return Cluster{Model: "moonshotai/Kimi-K2-Instruct", Policy: "evolve", Speedup: 10,
		Recent: &Recent{WindowSec: 60, Requests: 96, RequestsSec: 1.6, TTFTP50: 0.42, TTFTP95: 1.31, E2EP50: 12.4}}, nil
}

func (*goldenSource) Planner(context.Context) (Planner, error) {
	p := Planner{State: "waiting", Reason: "2:1 -> 1:2 recommended for 40s; acts after 60s", Enabled: true,
		Prefill: 2, Decode: 1, Recommend: 1, HeldSec: 40, ActsInSec: 20, GainSec: 310, CostSec: 12,
		Current: Pred{Prefill: 2, Decode: 1, TTFT: 0.21, ITL: 0.0194, E2E: 8.1},
		Best:    Pred{Prefill: 1, Decode: 2, TTFT: 0.25, ITL: 0.0185, E2E: 7.6},
		Short:   Demand{HorizonSec: 30, Requests: 4.2, PrefillTok: 21000, OutputTok: 9100, LocalTok: 800, HiddenTok: 6000, PrefillQueue: 12},
		Long:    Demand{HorizonSec: 600, Requests: 3.1},
		Avoided: []string{"0:3 (1:2 was overloaded at this demand)"},
		Limits:  Limits{MaxBatchedTokens: 8192, MaxSeqs: 256, GPUKVTokens: 12_000_000}}
	p.PrefillFit.Ready, p.PrefillFit.Samples, p.PrefillFit.RelErr = true, 812, 0.004
	p.DecodeFit.Ready, p.DecodeFit.Samples, p.DecodeFit.RelErr = true, 40211, 0.001
	p.PrefillFit.Coefs = []Coef{{"base_ms", 1.75, 0.008}, {"per_token_us", 6.5, 0.01}, {"per_token_context_ns", 0.0626, 0.0022}}
	p.DecodeFit.Coefs = []Coef{{"per_seq_us", 7.3, 0.002}, {"per_context_token_ns", 9.41e-06, 0.00075}}
	for i := range 6 {
		p.Decisions = append(p.Decisions, Decision{Time: t0.Add(time.Duration(i-12) * time.Minute), Action: "hold",
			Reason: fmt.Sprintf("%d:1 is within 2%% of the best split: objective 8.%ds, a move would gain 12 request-s, less than its cost of 40", 2, i)})
	}
	p.Decisions = append(p.Decisions, Decision{Time: t0.Add(-5 * time.Minute), Action: "move", Reason: "3:0 -> 2:1: objective 9.2s -> 8.1s (TTFT 0.30s -> 0.21s, ITL 21.0ms -> 19.4ms), gain 475 request-s > cost 40, held 62s",
		Moves: []Move{{"e2", "decode"}}})
	return p, nil
}

func (*goldenSource) Branches(context.Context) ([]Branch, error) {
	return []Branch{
		{Session: "agent-1", Branch: "main", State: "waiting", Blocks: 812, Turns: 14, LastUsed: t0.Add(-3 * time.Second),
			Residency: []Residency{{Node: "e0", GPU: 812, Host: 0}, {Node: "e1", GPU: 790, Host: 22}, {Node: "e4", GPU: 0, Host: 812}}},
		{Session: "agent-1", Branch: "explore", Parent: "main", State: "active", Blocks: 340, Turns: 3,
			Residency: []Residency{{Node: "e1", GPU: 340, Host: 0}}},
		{Session: "agent-1", Branch: "explore.retry", Parent: "explore", State: "active", Blocks: 352, Turns: 1,
			Residency: []Residency{{Node: "e1", GPU: 352, Host: 0}}},
		{Session: "agent-1", Branch: "tests", Parent: "main", State: "waiting", Blocks: 90, Turns: 2,
			Residency: []Residency{{Node: "e4", GPU: 90, Host: 0}}},
		{Session: "agent-2", Branch: "main.c1", Parent: "main", State: "active", Blocks: 130, Turns: 1},
		{Session: "agent-2", Branch: "main", State: "ended", Blocks: 0, Turns: 40},
	}, nil
}

func (*goldenSource) KV(context.Context) (KV, error) {
	k := KV{PromptTokens: 1000, GPUHitRate: 0.86, HostHitRate: 0.04, LiveBranches: 5}
	return k, nil
}

// goldenNodes are the five nodes of the golden cluster.
func goldenNodes() []Node {
	n := threeNodes()
	n[1].State = "switching"
	n[1].Switch = &Switch{To: "prefill", Phase: "offloading"}
	return append(n,
		Node{ID: "e3", Role: "decode", Mode: "auto", State: "down", Reason: "no heartbeat for 3s"},
		Node{ID: "e4", Role: "decode", Mode: "auto", State: "serving", Waiting: 4, Running: 18, TokensPerSec: 1900, GPUKVUsage: 0.64, HostKVUsage: 0.12})
}

// goldenHistory is the orchestrator's record the snapshot brings: what
// happened before the monitor started.
func goldenHistory() WatchEvent {
	ev := WatchEvent{Type: "snapshot", Generation: 7, Nodes: goldenNodes(), HistorySince: t0.Add(-20 * time.Minute)}
	for i, n := range goldenNodes() {
		ev.Events = append(ev.Events, RecordedEvent{Time: t0.Add(-20*time.Minute + time.Duration(i)*time.Second), Kind: "up", Node: n.ID,
			Text: fmt.Sprintf("%s joined as %s (serving)", n.ID, n.Role)})
	}
	ev.Events = append(ev.Events,
		RecordedEvent{Time: t0.Add(-5*time.Minute + 2*time.Second), Kind: "switch", Node: "e2", Text: "e2 switching prefill -> decode"},
		RecordedEvent{Time: t0.Add(-5*time.Minute + 3*time.Second), Kind: "switch", Node: "e2", Text: "e2 is now decode (planner: 3:0 -> 2:1: objective 9.2s -> 8.1s; handed 2 answers over)"},
		RecordedEvent{Time: t0.Add(-time.Minute), Kind: "down", Node: "e3", Text: "e3 is down: no heartbeat for 3s; the 3 answers it was streaming go on on other nodes"},
		RecordedEvent{Time: t0.Add(-20 * time.Second), Kind: "switch", Node: "e1", Text: "e1 switching decode -> prefill"})
	return ev
}

// runGolden drives the monitor as a program at a size without colour,
// types keys, and compares the screen it ends on with a golden file
// (go test ./tui -update rewrites them).
func runGolden(t *testing.T, w, h int, keys []string, wait string) {
	f := &goldenSource{fakeSource{watch: make(chan WatchEvent, 16)}}
	m := New(f, Options{Now: func() time.Time { return t0 }, Poll: time.Hour})
	for i, n := range goldenNodes() {
		for s := range 40 { // the last 40 s of load, a different rhythm per node
			m.load[n.ID] = append(m.load[n.ID], float64((s*(i+1))%9+2*i))
		}
	}
	tm := teatest.NewTestModel(t, m, teatest.WithInitialTermSize(w, h))
	f.watch <- goldenHistory()
	teatest.WaitFor(t, tm.Output(), func(b []byte) bool { return bytes.Contains(b, []byte("e4")) },
		teatest.WithDuration(5*time.Second))
	for _, k := range keys {
		switch k {
		case "enter":
			tm.Send(tea.KeyMsg{Type: tea.KeyEnter})
		default:
			tm.Send(tea.KeyMsg{Type: tea.KeyRunes, Runes: []rune(k)})
		}
	}
	if wait != "" {
		teatest.WaitFor(t, tm.Output(), func(b []byte) bool { return bytes.Contains(b, []byte(wait)) },
			teatest.WithDuration(5*time.Second))
	}
	if err := tm.Quit(); err != nil {
		t.Fatal(err)
	}
	fm := tm.FinalModel(t, teatest.WithFinalTimeout(5*time.Second)).(*Model)
	screen := fm.View()
	lines := strings.Split(screen, "\n")
	if len(lines) != h {
		t.Errorf("the screen has %d lines, the terminal %d", len(lines), h)
	}
	for i, l := range lines {
		if n := len([]rune(l)); n > w {
			t.Errorf("line %d is %d columns wide, the terminal %d: %q", i+1, n, w, l)
		}
	}
	golden.RequireEqual(t, []byte(screen))
}

// goldenSizes are the terminals every view is drawn in: the least top
// takes, a laptop's, a large screen's.
var goldenSizes = [][2]int{{80, 24}, {120, 36}, {200, 50}}

func goldenEachSize(t *testing.T, keys []string, wait string) {
	for _, sz := range goldenSizes {
		t.Run(fmt.Sprintf("%dx%d", sz[0], sz[1]), func(t *testing.T) { runGolden(t, sz[0], sz[1], keys, wait) })
	}
}

func TestGoldenNodes(t *testing.T)    { goldenEachSize(t, []string{"j", "enter"}, "role history") }
func TestGoldenPlanner(t *testing.T)  { goldenEachSize(t, []string{"2"}, "decisions") }
func TestGoldenBranches(t *testing.T) { goldenEachSize(t, []string{"3", "enter"}, "3 nodes:") }
func TestGoldenEvents(t *testing.T)   { goldenEachSize(t, []string{"4"}, "events, newest first") }
func TestGoldenHelp(t *testing.T)     { goldenEachSize(t, []string{"?"}, "any key closes") }
