package tui

import (
	"bytes"
	"context"
	"testing"
	"time"

	tea "github.com/charmbracelet/bubbletea"
	"github.com/charmbracelet/x/exp/golden"
	"github.com/charmbracelet/x/exp/teatest"
)

// simSource is a simulated cluster (evolve sim --live) frozen in time.
type simSource struct{ goldenSource }

func (*simSource) Addr() string { return "http://127.0.0.1:7070/dynamo" }
func (*simSource) Cluster(context.Context) (Cluster, error) {
	return Cluster{Model: "moonshotai/Kimi-K2-Instruct", Policy: "dynamo",
		Simulation: &Simulation{ElapsedSec: 2538, TotalSec: 5400, Pace: 10, Requests: 9120},
		Recent:     &Recent{WindowSec: 60, Requests: 310, RequestsSec: 5.2, TTFTP50: 2.27, TTFTP95: 5.8, E2EP50: 11.5}}, nil
}
func (*simSource) Planner(context.Context) (Planner, error) {
	return Planner{}, errorString("GET /api/v1/planner: policy dynamo has no evolve planner")
}

type errorString string

func (e errorString) Error() string { return string(e) }

// Two clusters side by side: each pane gets its own watch stream, keys
// move both, a pane's events reach only it.
func TestSplitShowsTwoClusters(t *testing.T) {
	left := &goldenSource{fakeSource{watch: make(chan WatchEvent, 16)}}
	right := &simSource{goldenSource{fakeSource{watch: make(chan WatchEvent, 16)}}}
	opt := Options{Now: func() time.Time { return t0 }, Poll: time.Hour, ReadOnly: true}
	a, b := New(left, opt), New(right, opt)
	tm := teatest.NewTestModel(t, NewSplit(a, b), teatest.WithInitialTermSize(203, 30))
	left.watch <- WatchEvent{Type: "snapshot", Generation: 7, Nodes: threeNodes()}
	n := threeNodes()[:2]
	n[0].ID, n[1].ID = "sim-a", "sim-b"
	right.watch <- WatchEvent{Type: "snapshot", Generation: 3, Nodes: n}
	teatest.WaitFor(t, tm.Output(), func(s []byte) bool {
		return bytes.Contains(s, []byte("sim-b")) && bytes.Contains(s, []byte("e2")) && bytes.Contains(s, []byte("last 1m00s"))
	}, teatest.WithDuration(5*time.Second))
	if err := tm.Quit(); err != nil {
		t.Fatal(err)
	}
	s := tm.FinalModel(t, teatest.WithFinalTimeout(5*time.Second)).(*Split)
	if len(a.nodes) != 3 || len(b.nodes) != 2 || b.nodes["sim-a"] == nil || a.nodes["sim-a"] != nil {
		t.Fatalf("panes got the wrong streams: left %d nodes, right %d", len(a.nodes), len(b.nodes))
	}
	golden.RequireEqual(t, []byte(s.View()))

	s.Update(tea.KeyMsg{Type: tea.KeyRunes, Runes: []rune("2")})
	if a.view != ViewPlanner || b.view != ViewPlanner {
		t.Fatalf("key 2 moved the panes to views %d and %d", a.view, b.view)
	}
	s.Update(tea.WindowSizeMsg{Width: 150, Height: 30})
	if v := s.View(); !bytes.Contains([]byte(v), []byte("side by side needs 163x24")) {
		t.Fatalf("a 150-column screen: %q", v)
	}
}
