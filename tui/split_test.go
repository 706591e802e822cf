package tui

import (
	"bytes"
	"context"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	tea "github.com/charmbracelet/bubbletea"
	"github.com/charmbracelet/lipgloss"
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
	return Planner{}, errorString("policy dynamo has no evolve planner")
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
	if v := s.View(); !strings.Contains(v, "side by side needs 155x24, one above the other 80x49; this one is 150x30") {
		t.Fatalf("a 150-column screen: %q", v)
	}
	s.Update(tea.KeyMsg{Type: tea.KeyRunes, Runes: []rune("1")})

	// 156 columns: two panes of 76, every figure of the nodes table
	// shown, the LOAD sparklines dropped.
	s.Update(tea.WindowSizeMsg{Width: 156, Height: 30})
	v := s.View()
	lines := strings.Split(v, "\n")
	if len(lines) != 30 || !strings.Contains(v, " │ ") || strings.Contains(v, "too small") || strings.Contains(v, "LOAD") ||
		!strings.Contains(v, "sim-b") || !regexp.MustCompile(`e2 .* 0%\s+-\s+│`).MatchString(v) {
		t.Fatalf("156x30 side by side:\n%s", v)
	}
	for _, l := range lines {
		if w := lipgloss.Width(l); w > 156 {
			t.Fatalf("a line of %d cells on 156 columns: %q", w, l)
		}
	}

	// Tall and narrow: one above the other, a rule between.
	s.Update(tea.WindowSizeMsg{Width: 100, Height: 50})
	v = s.View()
	lines = strings.Split(v, "\n")
	rule := slices.Index(lines, strings.Repeat("─", 100))
	if len(lines) != 50 || rule != 24 || !strings.Contains(strings.Join(lines[:rule], "\n"), "e2") ||
		!strings.Contains(strings.Join(lines[rule:], "\n"), "sim-b") || strings.Contains(v, "sim-b │") {
		t.Fatalf("100x50 stacked (rule at line %d of %d):\n%s", rule, len(lines), v)
	}
	if w, h := a.width, a.height; w != 100 || h != 24 || b.height != 25 {
		t.Fatalf("stacked panes sized %dx%d and %dx%d", w, h, b.width, b.height)
	}
}
