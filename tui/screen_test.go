package tui

import (
	"fmt"
	"strings"
	"testing"
	"time"

	tea "github.com/charmbracelet/bubbletea"
	"github.com/charmbracelet/lipgloss"
)

// fits fails when a line of the screen is wider than width, or was cut.
func fits(t *testing.T, screen string, width int) {
	t.Helper()
	for _, l := range strings.Split(screen, "\n") {
		if w := lipgloss.Width(l); w > width {
			t.Fatalf("a line of %d cells at %d columns:\n%s", w, width, screen)
		}
		if strings.Contains(l, "…") {
			t.Fatalf("a line was cut:\n%s", screen)
		}
	}
}

// lastLines are the screen's last n lines.
func lastLines(screen string, n int) []string {
	lines := strings.Split(screen, "\n")
	return lines[max(0, len(lines)-n):]
}

// At 80 columns the confirmation shows its key first and the whole
// question, wrapped, rather than cut before [y/N].
func TestConfirmationFits80ColumnsKeyFirst(t *testing.T) {
	m, _ := newTest(t, false)
	m.Update(tea.WindowSizeMsg{Width: 80, Height: 24})
	n := threeNodes()
	n[1].ID = "gb300-rack-07-engine-1" // a long name makes the question longer
	n[1].Waiting = 9
	m.Update(snapshot(1, n...))
	m.selNode = n[1].ID
	press(m, "p")
	v := m.View()
	fits(t, v, 80)
	foot := strings.Join(lastLines(v, 3), " ")
	if !strings.HasPrefix(lastLines(v, 3)[0], "[y/N] Switch gb300-rack-07-engine-1 from decode to prefill") {
		t.Fatalf("the footer does not start with the key:\n%s", v)
	}
	for _, want := range []string{"drains 21 in flight", "the planner leaves it."} {
		if !strings.Contains(foot, want) {
			t.Fatalf("the question lacks %q:\n%s", want, v)
		}
	}
	// The screen keeps its height: the body gave the footer its line.
	if got := len(strings.Split(v, "\n")); got != 24 {
		t.Fatalf("%d lines at 24 rows", got)
	}
	press(m, "n")
	press(m, "a")
	if v := m.View(); !strings.Contains(v, "already in auto mode") {
		t.Fatalf("a on an auto node:\n%s", v)
	}
}

// The selection is a node: as rows re-sort on a refresh, under another
// sort or a filter, it stays on its node, and p asks about that node.
func TestSelectionFollowsTheNodeNotTheRow(t *testing.T) {
	m, _ := newTest(t, false)
	m.Update(snapshot(1, threeNodes()...))
	press(m, "s", "s", "s") // by gpu-kv: e1 (80%), e0 (50%), e2
	press(m, "j")           // the second row: e0
	if sel := m.selected(); sel.ID != "e0" {
		t.Fatalf("selected %s", sel.ID)
	}
	// A refresh re-sorts: e2's KV fills, and it moves to the top.
	n := threeNodes()[2]
	n.GPUKVUsage = 0.95
	m.Update(watchBatch{{Type: "node", Generation: 2, Node: &n}})
	if ns := m.sortedNodes(); ns[0].ID != "e2" {
		t.Fatalf("not re-sorted: %s first", ns[0].ID)
	}
	if v := m.View(); !strings.Contains(v, "› e0") || m.selected().ID != "e0" {
		t.Fatalf("the selection left e0 as the rows re-sorted:\n%s", v)
	}
	press(m, "d")
	if m.confirm == nil || m.confirm.node != "e0" {
		t.Fatalf("d asked about %+v, the screen shows e0 selected", m.confirm)
	}
	press(m, "n")
	// Another sort, a filter that keeps it: still e0.
	press(m, "s")
	if m.selected().ID != "e0" {
		t.Fatalf("after a sort: %s", m.selected().ID)
	}
	typed(m, "/e")
	press(m, "enter")
	if m.selected().ID != "e0" {
		t.Fatalf("after a filter: %s", m.selected().ID)
	}
	// A filter that hides it: the selection is the row drawn, and moves
	// from there.
	typed(m, "/pinned")
	press(m, "enter")
	if sel := m.selected(); sel.ID != "e2" || !strings.Contains(m.View(), "› e2") {
		t.Fatalf("filtered to e2, selected %s", sel.ID)
	}
}

// Branches too: the selected branch stays selected as sessions come
// before it in the list.
func TestBranchSelectionFollowsTheBranch(t *testing.T) {
	m, _ := newTest(t, false)
	m.Update(polled{branches: []Branch{{Session: "b", Branch: "main"}, {Session: "c", Branch: "main"}}})
	press(m, "3", "j")
	m.Update(polled{branches: []Branch{{Session: "a", Branch: "main"}, {Session: "b", Branch: "main"}, {Session: "c", Branch: "main"}}})
	if b := m.selectedBranch(); b.Session != "c" {
		t.Fatalf("selected %s/%s after a session sorted before it", b.Session, b.Branch)
	}
}

// A snapshot with the orchestrator's record shows the past at its times,
// says from when it is complete, and takes what comes next from the
// stream; a later snapshot's record replaces it, keeping what the
// monitor saw itself.
func TestEventsComeFromTheOrchestratorsRecord(t *testing.T) {
	m, _ := newTest(t, false)
	joined, switched := t0.Add(-30*time.Minute), t0.Add(-10*time.Minute)
	ev := WatchEvent{Type: "snapshot", Generation: 4, Nodes: threeNodes(), HistorySince: joined.Add(-time.Second), Events: []RecordedEvent{
		{Time: joined, Kind: "up", Node: "e0", Text: "e0 joined as prefill (serving)"},
		{Time: switched, Kind: "switch", Node: "e1", Text: "e1 is now decode (planner: 2:1 -> 1:2)"},
	}}
	m.Update(watchBatch{ev})
	press(m, "4")
	v := m.View()
	for _, want := range []string{"11:30:00  up      e0 joined as prefill", "11:50:00  switch  e1 is now decode", "complete since 11:29:59"} {
		if !strings.Contains(v, want) {
			t.Fatalf("the events view lacks %q:\n%s", want, v)
		}
	}
	if strings.Contains(v, "12:00:00  up") || strings.Contains(v, "not shown") {
		t.Fatalf("joins made up at the monitor's start, or history said missing:\n%s", v)
	}
	// Node updates are not turned into events here: the stream sends the
	// orchestrator's.
	n := threeNodes()[2]
	n.State, n.Reason = "down", "no heartbeat for 3s"
	m.Update(watchBatch{{Type: "node", Generation: 5, Node: &n}})
	m.Update(watchBatch{{Type: "event", Event: &RecordedEvent{Time: t0, Kind: "down", Node: "e2", Text: "e2 is down: no heartbeat for 3s"}}})
	if c := strings.Count(m.View(), "e2 is down"); c != 1 {
		t.Fatalf("%d lines of e2 going down:\n%s", c, m.View())
	}
	m.event("error", "seen here")
	// Reconnected: the new record replaces the old one.
	ev.Events = append(ev.Events, RecordedEvent{Time: t0, Kind: "down", Node: "e2", Text: "e2 is down: no heartbeat for 3s"})
	m.Update(watchBatch{ev})
	v = m.View()
	if strings.Count(v, "e2 is down") != 1 || strings.Count(v, "e0 joined") != 1 || !strings.Contains(v, "seen here") {
		t.Fatalf("after a second snapshot:\n%s", v)
	}
}

// A server that keeps no record (a simulation, an older orchestrator):
// the view says plainly that history before the watch is not shown, and
// makes up no joins.
func TestEventsWithoutARecordSaySo(t *testing.T) {
	m, _ := newTest(t, false)
	m.Update(snapshot(1, threeNodes()...))
	press(m, "4")
	v := m.View()
	if !strings.Contains(v, "history before 12:00:00, when this watch began, is not shown") || strings.Contains(v, "joined") {
		t.Fatalf("events view:\n%s", v)
	}
	if !strings.Contains(v, "watch began: 3 nodes (1 prefill, 2 decode)") {
		t.Fatalf("no line for the start of the watch:\n%s", v)
	}
}

// The planner's decisions come from its own record, each at its time,
// the first poll's included.
func TestPlannerDecisionsAreEventsAtTheirTimes(t *testing.T) {
	m, _ := newTest(t, false)
	p := &Planner{Decisions: []Decision{{Time: t0.Add(-20 * time.Minute), Action: "move", Reason: "1:3 -> 2:2", Moves: []Move{{"e1", "prefill"}}}}}
	m.applyPoll(polled{planner: p})
	m.applyPoll(polled{planner: p})
	if len(m.events) != 1 || !m.events[0].Time.Equal(t0.Add(-20*time.Minute)) || m.events[0].Text != "move e1->prefill: 1:3 -> 2:2" {
		t.Fatalf("events %+v", m.events)
	}
}

// What the screen cannot otherwise show: the filter, the two request
// rates by name, the LOAD scale, the sort's column; and messages that go
// once said.
func TestTheScreenSaysWhatItShows(t *testing.T) {
	now := t0
	m, _ := newTest(t, false)
	m.opt.Now = func() time.Time { return now }
	m.Update(snapshot(1, threeNodes()...))
	m.reqRate = []float64{1.2, 1.7}
	m.cluster.Recent = &Recent{WindowSec: 60, Requests: 24, RequestsSec: 0.4}
	for i := range 20 {
		m.load["e1"] = append(m.load["e1"], float64(i%13))
	}
	v := m.View()
	for _, want := range []string{"arrivals 1.7 req/s", "≤1.7", "finished in the last 1m00s: 24 req (0.4/s)", "LOAD ≤12", "NODE▲"} {
		if !strings.Contains(v, want) {
			t.Fatalf("no %q:\n%s", want, v)
		}
	}
	typed(m, "/dec")
	press(m, "enter")
	if v := m.View(); !strings.Contains(v, `filter "dec": 2 of 3 nodes shown`) {
		t.Fatalf("the filter is not shown:\n%s", v)
	}
	press(m, "esc", "s", "s")
	if v := m.View(); !strings.Contains(v, "QUEUE▼") || strings.Contains(v, "NODE▲") || strings.Contains(v, "filter") {
		t.Fatalf("sorted by queue:\n%s", v)
	}
	// A switch asked: said, then gone.
	press(m, "p")
	m.Update(press(m, "y")())
	if !strings.Contains(m.View(), "switch e0 to prefill: asked") && !strings.Contains(m.View(), "switch e1 to prefill: asked") {
		t.Fatalf("no message:\n%s", m.View())
	}
	now = now.Add(10 * time.Second)
	if v := m.View(); strings.Contains(v, ": asked") {
		t.Fatalf("the message stays 10 s on:\n%s", v)
	}
}

// The end of a switch asked here is told in the footer, and goes too.
func TestTheEndOfASwitchIsTold(t *testing.T) {
	now := t0
	m, _ := newTest(t, false)
	m.opt.Now = func() time.Time { return now }
	m.Update(snapshot(1, threeNodes()...))
	press(m, "j", "p")
	m.Update(press(m, "y")())
	n := threeNodes()[1]
	n.State, n.Switch = "switching", &Switch{To: "prefill", Phase: "draining"}
	m.Update(watchBatch{{Type: "node", Generation: 2, Node: &n}})
	n.State, n.Switch, n.Role, n.Mode = "serving", nil, "prefill", "pinned"
	m.Update(watchBatch{{Type: "node", Generation: 3, Node: &n}})
	if foot := lastLines(m.View(), 1)[0]; foot != "e1 is now prefill (pinned)" {
		t.Fatalf("footer %q", foot)
	}
	now = now.Add(time.Minute)
	if foot := lastLines(m.View(), 1)[0]; !strings.Contains(foot, "? help") {
		t.Fatalf("a minute on, footer %q", foot)
	}
}

// At 80x24 long lines wrap: events, a ':' error, the help.
func TestLongLinesWrapAt80x24(t *testing.T) {
	m, _ := newTest(t, false)
	m.Update(tea.WindowSizeMsg{Width: 80, Height: 24})
	m.Update(snapshot(1, threeNodes()...))
	long := "e1 is now prefill (planner: 1:3 -> 2:2: objective 46.61s -> 23.30s (TTFT 0.01s -> 0.01s, ITL 10.9ms -> 5.5ms), gain 475s > cost 0s, held 7s)"
	m.event("switch", long)
	press(m, "4")
	v := m.View()
	fits(t, v, 80)
	if !strings.Contains(strings.Join(strings.Fields(v), " "), "gain 475s > cost 0s, held 7s)") {
		t.Fatalf("the event's end is not on screen:\n%s", v)
	}
	typed(m, ":role nonsuch sideways please")
	press(m, "enter")
	v = m.View()
	fits(t, v, 80)
	if !strings.Contains(strings.Join(lastLines(v, 3), " "), "role NODE prefill|decode, auto NODE, quit") {
		t.Fatalf("the error's end is cut:\n%s", v)
	}
	press(m, "?")
	fits(t, m.View(), 80)
	if !strings.Contains(m.View(), "any key closes this help") {
		t.Fatalf("help at 80x24:\n%s", m.View())
	}
}

// A tall screen is used: the nodes view shows recent events under the
// table, the events view as many events as fit, and many nodes scroll
// with the selection in sight.
func TestEachViewUsesTheHeight(t *testing.T) {
	m, _ := newTest(t, false)
	m.Update(tea.WindowSizeMsg{Width: 200, Height: 50})
	m.Update(snapshot(1, threeNodes()...))
	for i := range 60 {
		m.event("evict", fmt.Sprintf("event %d", i))
	}
	v := m.View()
	if !strings.Contains(v, "recent events") || strings.Count(v, "evict") < 30 {
		t.Fatalf("the nodes view leaves the height empty:\n%s", v)
	}
	press(m, "4")
	if c := strings.Count(m.View(), "evict"); c < 40 {
		t.Fatalf("%d events at 50 rows:\n%s", c, m.View())
	}
	press(m, "G")
	if v := m.View(); !strings.Contains(v, "event 0\n") || !strings.Contains(v, "of 61") {
		t.Fatalf("scrolled to the end:\n%s", v)
	}
	// 100 nodes at 80x24: the selection stays in sight as it moves.
	var many []Node
	for i := range 100 {
		many = append(many, Node{ID: fmt.Sprintf("n%d", i), Role: "decode", Mode: "auto", State: "serving"})
	}
	m.Update(tea.WindowSizeMsg{Width: 80, Height: 24})
	m.Update(snapshot(2, many...))
	press(m, "1")
	for range 50 {
		press(m, "j")
	}
	if v := m.View(); !strings.Contains(v, "› n50 ") || !strings.Contains(v, "of 100") {
		t.Fatalf("the selection went below the screen:\n%s", v)
	}
}

// The branch tree is drawn with ├, │ and └; enter opens the selected
// branch's WHERE, a line per node.
func TestBranchTreeAndItsWhere(t *testing.T) {
	if got := strings.Join(TreePrefix([]int{0, 1, 2, 2, 1, 0, 1}), "|"); got != "|├ |│ ├ |│ └ |└ ||└ " {
		t.Fatalf("tree %q", got)
	}
	m, _ := newTest(t, false)
	m.Update(tea.WindowSizeMsg{Width: 80, Height: 24})
	var res []Residency
	for i := range 5 {
		res = append(res, Residency{Node: fmt.Sprintf("engine-%d", i), GPU: 100 * i, Host: i})
	}
	m.Update(polled{branches: []Branch{{Session: "s", Branch: "main", State: "active", Residency: res},
		{Session: "s", Branch: "x", Parent: "main"}, {Session: "s", Branch: "y", Parent: "main"}}})
	press(m, "3")
	if v := m.View(); !strings.Contains(v, "+4 more") || !strings.Contains(v, "├ x") || !strings.Contains(v, "└ y") {
		t.Fatalf("branches:\n%s", v)
	}
	press(m, "enter")
	v := m.View()
	for _, r := range res {
		if !strings.Contains(v, fmt.Sprintf("%s %d GPU, %d host blocks", r.Node, r.GPU, r.Host)) {
			t.Fatalf("opened WHERE lacks %s:\n%s", r.Node, v)
		}
	}
	press(m, "enter")
	if strings.Contains(m.View(), "engine-4 400 GPU") {
		t.Fatal("enter does not close it")
	}
}
