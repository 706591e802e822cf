package tui

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	tea "github.com/charmbracelet/bubbletea"
	"github.com/charmbracelet/x/exp/golden"
	"github.com/charmbracelet/x/exp/teatest"
)

func init() { time.Local = time.UTC } // golden times are written in UTC

// goldenSource is a cluster frozen in time: three nodes mid-switch, a
// planner with a decision, two agent sessions, a KV summary.
type goldenSource struct{ fakeSource }

func (*goldenSource) Cluster(context.Context) (Cluster, error) {
	return Cluster{Model: "moonshotai/Kimi-K2-Instruct", Policy: "evolve"}, nil
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
	p.PrefillFit.Coefs = []Coef{{"per_token_us", 6.5, 0.01}}
	p.DecodeFit.Coefs = []Coef{{"per_seq_us", 7.3, 0.002}}
	p.Decisions = []Decision{{Time: t0.Add(-5 * time.Minute), Action: "move", Reason: "3:0 -> 2:1: objective 9.2s -> 8.1s",
		Moves: []Move{{"e2", "decode"}}}}
	return p, nil
}

func (*goldenSource) Branches(context.Context) ([]Branch, error) {
	return []Branch{
		{Session: "agent-1", Branch: "main", State: "waiting", Blocks: 812, Turns: 14, LastUsed: t0.Add(-3 * time.Second),
			Residency: []Residency{{Node: "e0", GPU: 812, Host: 0}, {Node: "e1", GPU: 790, Host: 22}}},
		{Session: "agent-1", Branch: "explore", Parent: "main", State: "active", Blocks: 340, Turns: 3,
			Residency: []Residency{{Node: "e1", GPU: 340, Host: 0}}},
		{Session: "agent-2", Branch: "main.c1", Parent: "main", State: "active", Blocks: 130, Turns: 1},
		{Session: "agent-2", Branch: "main", State: "ended", Blocks: 0, Turns: 40},
	}, nil
}

func (*goldenSource) KV(context.Context) (KV, error) {
	k := KV{PromptTokens: 1000, GPUHitRate: 0.86, HostHitRate: 0.04, LiveBranches: 3}
	return k, nil
}

// runGolden drives the monitor as a program at 100x30 without colour,
// types keys, and compares the screen it ends on with a golden file
// (go test ./tui -update rewrites them).
func runGolden(t *testing.T, keys string, wait string) {
	f := &goldenSource{fakeSource{watch: make(chan WatchEvent, 16)}}
	m := New(f, Options{Now: func() time.Time { return t0 }, Poll: time.Hour})
	tm := teatest.NewTestModel(t, m, teatest.WithInitialTermSize(100, 30))
	n := threeNodes()
	n[1].State = "switching"
	n[1].Switch = &Switch{To: "prefill", Phase: "offloading"}
	f.watch <- WatchEvent{Type: "snapshot", Generation: 7, Nodes: n}
	teatest.WaitFor(t, tm.Output(), func(b []byte) bool { return bytes.Contains(b, []byte("e2")) },
		teatest.WithDuration(5*time.Second))
	for _, k := range strings.Split(keys, " ") {
		if k != "" {
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
	golden.RequireEqual(t, []byte(fm.View()))
}

func TestGoldenNodes(t *testing.T)    { runGolden(t, "j", "") }
func TestGoldenPlanner(t *testing.T)  { runGolden(t, "2", "decisions") }
func TestGoldenBranches(t *testing.T) { runGolden(t, "3", "agent-2") }
func TestGoldenEvents(t *testing.T)   { runGolden(t, "4", "events, newest first") }
