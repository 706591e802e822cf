package tui

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	tea "github.com/charmbracelet/bubbletea"
	"github.com/charmbracelet/lipgloss"
	"github.com/evolvellm/evolve/controlapi"
	"github.com/muesli/termenv"
)

func init() { lipgloss.SetColorProfile(termenv.Ascii) } // no colour: tests read words

var t0 = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

// fakeSource records actions; its watch stream is fed by the test.
type fakeSource struct {
	mu      sync.Mutex
	actions []string
	watch   chan WatchEvent
}

func (f *fakeSource) Addr() string { return "http://fake:8001" }
func (f *fakeSource) Watch(ctx context.Context, out chan<- WatchEvent) error {
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case ev, ok := <-f.watch:
			if !ok {
				return fmt.Errorf("stream closed")
			}
			out <- ev
		}
	}
}
func (f *fakeSource) Cluster(context.Context) (Cluster, error) { return Cluster{Model: "m"}, nil }
func (f *fakeSource) Planner(context.Context) (Planner, error) { return Planner{}, fmt.Errorf("off") }
func (f *fakeSource) Branches(context.Context) ([]Branch, error) {
	return nil, nil
}
func (f *fakeSource) KV(context.Context) (KV, error) { return KV{}, nil }
func (f *fakeSource) SetRole(_ context.Context, node, role string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.actions = append(f.actions, "set "+node+" "+role)
	return nil
}
func (f *fakeSource) Unpin(_ context.Context, node string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.actions = append(f.actions, "unpin "+node)
	return nil
}

func newTest(t *testing.T, readonly bool) (*Model, *fakeSource) {
	f := &fakeSource{watch: make(chan WatchEvent, 16)}
	m := New(f, Options{ReadOnly: readonly, Now: func() time.Time { return t0 }})
	t.Cleanup(m.stop)
	m.Update(tea.WindowSizeMsg{Width: 120, Height: 40})
	return m, f
}

func snapshot(gen uint64, nodes ...Node) watchBatch {
	return watchBatch{{Type: "snapshot", Generation: gen, Nodes: nodes}}
}

func press(m *Model, keys ...string) tea.Cmd {
	var cmd tea.Cmd
	for _, k := range keys {
		var msg tea.KeyMsg
		switch k {
		case "enter":
			msg = tea.KeyMsg{Type: tea.KeyEnter}
		case "esc":
			msg = tea.KeyMsg{Type: tea.KeyEsc}
		default:
			msg = tea.KeyMsg{Type: tea.KeyRunes, Runes: []rune(k)}
		}
		_, cmd = m.Update(msg)
	}
	return cmd
}

func threeNodes() []Node {
	return []Node{
		{ID: "e0", Role: "prefill", Mode: "auto", State: "serving", Waiting: 2, Running: 1, TokensPerSec: 41250, GPUKVUsage: 0.5},
		{ID: "e1", Role: "decode", Mode: "auto", State: "serving", Running: 12, TokensPerSec: 610, GPUKVUsage: 0.8},
		{ID: "e2", Role: "decode", Mode: "pinned", State: "serving", Running: 3},
	}
}

func TestNodesViewShowsTheCluster(t *testing.T) {
	m, _ := newTest(t, false)
	m.Update(snapshot(3, threeNodes()...))
	v := m.View()
	for _, want := range []string{"evolve top", "live", "1 nodes", "P prefill", "D decode", "pinned", "nodes 3: 1 prefill, 2 decode serving"} {
		if !strings.Contains(v, want) {
			t.Fatalf("view lacks %q:\n%s", want, v)
		}
	}
	// A node event updates the row; a switch shows its phase.
	n := threeNodes()[1]
	n.State = "switching"
	n.Switch = &Switch{To: "prefill", Phase: "draining"}
	m.Update(watchBatch{{Type: "node", Generation: 4, Node: &n}})
	if v := m.View(); !strings.Contains(v, "to prefill, draining") {
		t.Fatalf("switch not shown:\n%s", v)
	}
	if m.events[0].Kind != "switch" {
		t.Fatalf("events %+v", m.events)
	}
	// Handing its answers over, the row says so; done, the event says
	// how many moved.
	n.Switch = &Switch{To: "prefill", Phase: "handing over", HandedOver: 3}
	m.Update(watchBatch{{Type: "node", Generation: 5, Node: &n}})
	if v := m.View(); !strings.Contains(v, "to prefill, handing over") {
		t.Fatalf("handover not shown:\n%s", v)
	}
	n.State, n.Role, n.Switch = "serving", "prefill", nil
	n.History = append(n.History, RoleChange{From: "decode", To: "prefill", Reason: "planner: 1:2 -> 2:1", HandedOver: 3})
	m.Update(watchBatch{{Type: "node", Generation: 6, Node: &n}})
	if e := m.events[0]; e.Kind != "switch" || !strings.Contains(e.Text, "is now prefill (planner: 1:2 -> 2:1; handed 3 answers over)") {
		t.Fatalf("events %+v", m.events)
	}
	n.State, n.Role = "serving", "decode"
	m.Update(watchBatch{{Type: "node", Generation: 7, Node: &n}}) // back, for what follows
	// Sorting by queue puts the busiest first.
	press(m, "s", "s")
	if ns := m.sortedNodes(); ns[0].ID != "e1" {
		t.Fatalf("sorted by %s: %s first", sortNames[m.sortKey], ns[0].ID)
	}
	// Filtering.
	press(m, "/", "p", "r", "e", "enter")
	if ns := m.sortedNodes(); len(ns) != 1 || ns[0].ID != "e0" {
		t.Fatalf("filter %q: %d nodes", m.filter, len(ns))
	}
}

func TestSwitchIsConfirmedThenSent(t *testing.T) {
	m, f := newTest(t, false)
	m.Update(snapshot(1, threeNodes()...))
	press(m, "j") // e1, a decode node
	press(m, "p")
	if m.confirm == nil || !strings.Contains(m.View(), "Switch e1 from decode to prefill and pin it?") {
		t.Fatalf("no confirmation:\n%s", m.View())
	}
	if !strings.Contains(m.View(), "drains 12 in flight") || !strings.Contains(m.View(), "› e1") {
		t.Fatalf("the confirmation does not say what will happen:\n%s", m.View())
	}
	cmd := press(m, "y")
	if cmd == nil {
		t.Fatal("confirmed, but nothing sent")
	}
	m.Update(cmd())
	if len(f.actions) != 1 || f.actions[0] != "set e1 prefill" || !strings.Contains(m.message, "switch e1 to prefill") {
		t.Fatalf("actions %v, message %q", f.actions, m.message)
	}
	// n cancels.
	press(m, "d")
	if cmd := press(m, "n"); cmd != nil || m.message != "cancelled" {
		t.Fatalf("cancel: %q", m.message)
	}
	// a on a pinned node unpins it, after confirmation.
	press(m, "j")
	press(m, "a")
	m.Update(press(m, "y")())
	if len(f.actions) != 2 || f.actions[1] != "unpin e2" {
		t.Fatalf("actions %v", f.actions)
	}
}

func TestReadOnlyRefusesSwitches(t *testing.T) {
	m, f := newTest(t, true)
	m.Update(snapshot(1, threeNodes()...))
	press(m, "d")
	if m.confirm != nil || !strings.Contains(m.message, "read-only") || len(f.actions) != 0 {
		t.Fatalf("read-only: confirm %v, message %q", m.confirm, m.message)
	}
	if !strings.Contains(m.View(), "[read-only]") {
		t.Fatal("the header does not say read-only")
	}
}

// A gap in the watch stream's generations means lost updates: the monitor
// says so and reopens the stream for a snapshot.
func TestGenerationGapResyncs(t *testing.T) {
	m, _ := newTest(t, false)
	m.Update(snapshot(5, threeNodes()...))
	old := m.ctx
	n := threeNodes()[0]
	m.Update(watchBatch{{Type: "node", Generation: 9, Node: &n}})
	if old.Err() == nil || m.ctx.Err() != nil {
		t.Fatal("the old stream was not closed for a resync")
	}
	if m.events[0].Kind != "error" || !strings.Contains(m.events[0].Text, "missed 3 updates") {
		t.Fatalf("events %+v", m.events)
	}
	// The stream ends; the monitor reconnects and says so meanwhile.
	_, cmd := m.Update(watchEnded{err: fmt.Errorf("closed")})
	if cmd == nil || m.conn != ConnReconnecting || !strings.Contains(m.View(), "reconnecting") {
		t.Fatalf("after the stream ended: %s", m.conn)
	}
	// Its header says why, by the cause at the end of Go's error chain,
	// and how old the state on screen is.
	now := t0.Add(12 * time.Second)
	m.opt.Now = func() time.Time { return now }
	for i := 0; i < 4; i++ {
		m.Update(watchEnded{err: fmt.Errorf(`Get "http://127.0.0.1:34465/api/v1/watch": dial tcp 127.0.0.1:34465: connect: connection refused`)})
	}
	if m.conn != ConnUnreachable || !strings.Contains(m.View(), "unreachable: connection refused (showing the state of 12s ago)") {
		t.Fatalf("conn %s:\n%s", m.conn, m.View())
	}
	// The node table says it is the last state known, not the state now.
	if v := m.View(); !strings.Contains(v, "last known nodes 3:") {
		t.Fatalf("the node table does not say it is old:\n%s", v)
	}
	// On a narrow screen the cause stays, the age goes.
	m.Update(tea.WindowSizeMsg{Width: 80, Height: 40})
	if h := strings.Split(m.View(), "\n")[0]; !strings.Contains(h, "unreachable: connection refused") || strings.Contains(h, "showing") {
		t.Fatalf("narrow header %q", h)
	}
	m.Update(tea.WindowSizeMsg{Width: 120, Height: 40})
	m.Update(snapshot(20, threeNodes()...))
	if m.conn != ConnLive || strings.Contains(m.View(), "last known") {
		t.Fatalf("after a snapshot: %s:\n%s", m.conn, m.View())
	}
}

// f follows a branch: the cursor stays on it while the list changes, and
// its blocks moving between nodes show as events.
func TestFollowABranchAcrossARoleChange(t *testing.T) {
	m, _ := newTest(t, false)
	res := func(node string, gpu, host int) []Residency { return []Residency{{Node: node, GPU: gpu, Host: host}} }
	m.Update(polled{branches: []Branch{
		{Session: "a", Branch: "main", State: "waiting", Blocks: 10, Residency: res("e1", 10, 0)},
		{Session: "b", Branch: "main", State: "active", Blocks: 5, Residency: res("e2", 5, 0)},
	}})
	press(m, "3", "j", "f")
	if m.follow != "b/main" {
		t.Fatalf("following %q", m.follow)
	}
	// e2 switched role: its GPU KV went to its host pool; a new session
	// sorts before b.
	m.Update(polled{branches: []Branch{
		{Session: "a", Branch: "main", State: "waiting", Blocks: 10, Residency: res("e1", 10, 0)},
		{Session: "aa", Branch: "x", State: "active", Blocks: 1},
		{Session: "b", Branch: "main", State: "waiting", Blocks: 5, Residency: res("e2", 0, 5)},
	}})
	if b := m.selectedBranch(); b == nil || b.Session != "b" {
		t.Fatalf("the cursor left the followed branch: %+v", b)
	}
	if m.events[0].Kind != "branch" || !strings.Contains(m.events[0].Text, "e2 5G/0H -> e2 0G/5H") {
		t.Fatalf("events %+v", m.events)
	}
	if v := m.View(); !strings.Contains(v, "following b/main") || !strings.Contains(v, "e2 0G/5H") {
		t.Fatalf("view:\n%s", v)
	}
}

func TestTooSmallAndHelp(t *testing.T) {
	m, _ := newTest(t, false)
	m.Update(tea.WindowSizeMsg{Width: 70, Height: 20})
	if v := m.View(); !strings.Contains(v, "terminal too small") || !strings.Contains(v, "70x20") {
		t.Fatalf("small: %s", v)
	}
	m.Update(tea.WindowSizeMsg{Width: 100, Height: 30})
	press(m, "?")
	if !strings.Contains(m.View(), "switch the selected node to prefill") {
		t.Fatal("no help")
	}
	press(m, "x")
	if m.help {
		t.Fatal("help stays open")
	}
	if cmd := press(m, "q"); cmd == nil {
		t.Fatal("q does not quit")
	}
}

func BenchmarkRender256Nodes(b *testing.B) {
	f := &fakeSource{watch: make(chan WatchEvent)}
	m := New(f, Options{Now: func() time.Time { return t0 }})
	defer m.stop()
	m.Update(tea.WindowSizeMsg{Width: 200, Height: 300})
	var nodes []Node
	for i := 0; i < 256; i++ {
		nodes = append(nodes, Node{ID: fmt.Sprintf("gb300-%03d", i), Role: []string{"prefill", "decode"}[i%2], Mode: "auto", State: "serving", Running: i})
	}
	m.Update(snapshot(1, nodes...))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		_ = m.View()
	}
}

// Evictions of referenced blocks between two polls show in the events
// view, with whether any was the last copy.
func TestReferencedEvictionsAreEvents(t *testing.T) {
	m, _ := newTest(t, false)
	kv := func(gpu, host, lost int64) *KV {
		return &KV{Nodes: []KVNode{{ID: "e1", RefEvictedGPU: gpu, RefEvictedHost: host, RefLost: lost}, {ID: "e2"}}}
	}
	m.applyPoll(polled{kv: kv(40, 0, 0)}) // counters since the node joined: no event
	m.applyPoll(polled{kv: kv(40, 0, 0)})
	if len(m.events) != 0 {
		t.Fatalf("events without new evictions: %+v", m.events)
	}
	m.applyPoll(polled{kv: kv(52, 0, 0)})
	m.applyPoll(polled{kv: kv(52, 3, 3)})
	if len(m.events) != 2 || m.events[0].Kind != "evict" || !strings.Contains(m.events[0].Text, "3 were the last copy") ||
		!strings.Contains(m.events[1].Text, "12 from GPU") || !strings.Contains(m.events[1].Text, "still has a copy") {
		t.Fatalf("events %+v", m.events)
	}
	press(m, "4")
	if v := m.View(); !strings.Contains(v, "e1 evicted referenced blocks") {
		t.Fatalf("events view:\n%s", v)
	}
}

// Engines at --speedup: the router's latencies are wall-clock, as are the
// planner's predictions (its pass costs are modelled ones over the
// speedup), and the header says so: an operator who knows the profile's
// modelled costs must not read them as modelled.
func TestMeasuredLatenciesSayTheyAreWallClockAtSpeedup(t *testing.T) {
	m := New(&fakeSource{watch: make(chan WatchEvent)}, Options{Now: func() time.Time { return t0 }, Poll: time.Hour})
	m.cluster = Cluster{Model: "m", Speedup: 10,
		Recent: &Recent{WindowSec: 60, Requests: 144, RequestsSec: 2.4, TTFTP50: 0.45, TTFTP95: 1.43, E2EP50: 14.2}}
	if s := m.summary(); !strings.Contains(s, "TTFT P50 0.45s") || !strings.Contains(s, "wall clock, predictions too: engines run 10x (modelled times are 10x these)") {
		t.Fatalf("at 10x:\n%s", s)
	}
	m.cluster.Speedup = 0
	if s := m.summary(); strings.Contains(s, "wall clock") {
		t.Fatalf("real time:\n%s", s)
	}
}

// Agents, branches and nodes are listed as people count them: a2 before
// a10, engine-2 before engine-10.
func TestListsCountAsPeopleDo(t *testing.T) {
	var bs []Branch
	for _, s := range []string{"a10-s0", "a2-s0", "a1-s0"} {
		for _, b := range []string{"b10", "b2", "b0"} {
			parent := "b0"
			if b == "b0" {
				parent = ""
			}
			bs = append(bs, Branch{Session: s, Branch: b, Parent: parent})
		}
	}
	tree, depth := Tree(bs, "")
	var got []string
	for i, b := range tree {
		got = append(got, fmt.Sprintf("%s/%s:%d", b.Session, b.Branch, depth[i]))
	}
	want := "a1-s0/b0:0 a1-s0/b2:1 a1-s0/b10:1 a2-s0/b0:0 a2-s0/b2:1 a2-s0/b10:1 a10-s0/b0:0 a10-s0/b2:1 a10-s0/b10:1"
	if strings.Join(got, " ") != want {
		t.Fatalf("tree order\n got %s\nwant %s", strings.Join(got, " "), want)
	}
	m := &Model{nodes: map[string]*Node{}}
	for _, id := range []string{"engine-10", "engine-2", "engine-1"} {
		m.nodes[id] = &Node{ID: id}
	}
	var ids []string
	for _, n := range m.sortedNodes() {
		ids = append(ids, n.ID)
	}
	if strings.Join(ids, " ") != "engine-1 engine-2 engine-10" {
		t.Fatalf("node order %v", ids)
	}
}

// At 80 columns, the narrowest top allows, every figure still shows: the
// summary wraps at its separators, and the nodes table is as wide as its
// contents (the load sparkline takes what is left).
func TestNarrowTerminalShowsEveryFigure(t *testing.T) {
	m, _ := newTest(t, false)
	m.Update(tea.WindowSizeMsg{Width: 80, Height: 24})
	var nodes []Node
	for i := range 4 {
		role := "decode"
		if i == 0 {
			role = "prefill"
		}
		nodes = append(nodes, Node{ID: fmt.Sprintf("engine-%d", i), Role: role, Mode: "auto", State: "serving", Running: 3, GPUKVUsage: 0.42, HostKVUsage: 0.07})
	}
	m.Update(snapshot(3, nodes...))
	m.reqRate = []float64{4.2, 5.6}
	m.planner = &Planner{Current: Pred{Prefill: 1, Decode: 3, TTFT: 0.02, E2E: 25.4}}
	m.kv = &KV{PromptTokens: 1000, GPUHitRate: 0.89, HostHitRate: 0.01}
	m.cluster.Speedup = 10
	m.cluster.Recent = &Recent{WindowSec: 60, Requests: 86, RequestsSec: 1.4, TTFTP50: 0.56, TTFTP95: 1.34, E2EP50: 1.1}
	v := m.View()
	for _, l := range strings.Split(v, "\n") {
		if w := lipgloss.Width(l); w > 80 {
			t.Fatalf("a line of %d cells:\n%s", w, v)
		}
		if strings.Contains(l, "…") {
			t.Fatalf("a line was cut:\n%s", v)
		}
	}
	for _, want := range []string{"KV hits: GPU 89%", "predicted TTFT 20.0ms", "arrivals 5.6 req/s", "E2E P50 1.1s", "engines run 10x (modelled times are 10x these)", "HOST-KV", "REF", "42%", "7%"} {
		if !strings.Contains(v, want) {
			t.Fatalf("no %q at 80 columns:\n%s", want, v)
		}
	}
	// A simulation's header is longer: the connection's age goes first.
	m.cluster.Model, m.cluster.Policy = "moonshotai/Kimi-K2-Instruct", "evolve"
	m.cluster.Simulation = &Simulation{ElapsedSec: 248, TotalSec: 660, Pace: 20}
	if h := strings.Split(m.header(), "\n")[0]; lipgloss.Width(h) > 80 || !strings.HasSuffix(h, "live") || !strings.Contains(h, "modelled 4m08s of 11m00s, 20x") {
		t.Fatalf("simulation header at 80 columns: %q", h)
	}
}

// typed presses each character of s.
func typed(m *Model, s string) tea.Cmd {
	var cmd tea.Cmd
	for _, r := range s {
		cmd = press(m, string(r))
	}
	return cmd
}

// ':' takes k9s-style commands: a view by name, a switch of any node
// (asked first, as p, d and a are), quit; a mistake says what it takes.
func TestCommandMode(t *testing.T) {
	m, f := newTest(t, false)
	m.Update(snapshot(1, threeNodes()...))
	typed(m, ":planner")
	if !strings.Contains(m.View(), ":planner_") {
		t.Fatalf("the footer does not show the command:\n%s", m.View())
	}
	press(m, "enter")
	if m.view != ViewPlanner {
		t.Fatalf("view %d after :planner", m.view)
	}
	typed(m, ":role e0 decode")
	press(m, "enter")
	if m.confirm == nil || !strings.Contains(m.View(), "Switch e0 from prefill to decode and pin it?") {
		t.Fatalf("no confirmation:\n%s", m.View())
	}
	m.Update(press(m, "y")())
	typed(m, ":auto e2")
	press(m, "enter")
	m.Update(press(m, "y")())
	if strings.Join(f.actions, ", ") != "set e0 decode, unpin e2" {
		t.Fatalf("actions %v", f.actions)
	}
	for cmd, want := range map[string]string{":role e9 decode": `no node "e9"`, ":rolee": "unknown command", ":role e1 sideways": "unknown command"} {
		t.Run(cmd, func(t *testing.T) {
			typed(m, cmd)
			press(m, "enter")
			if m.confirm != nil || !strings.Contains(m.message, want) {
				t.Fatalf("%s: message %q", cmd, m.message)
			}
		})
	}
	// esc drops a half-typed command; in the filter, it clears the filter.
	typed(m, ":qu")
	press(m, "esc")
	typed(m, ":nodes")
	press(m, "enter")
	typed(m, "/e1")
	press(m, "enter")
	if len(m.sortedNodes()) != 1 {
		t.Fatalf("filter e1: %d nodes", len(m.sortedNodes()))
	}
	press(m, "esc")
	if m.filter != "" || len(m.sortedNodes()) != 3 {
		t.Fatalf("esc did not clear the filter %q", m.filter)
	}
	// Keys that arrive together (typed fast, pasted) count one by one.
	m.Update(tea.KeyMsg{Type: tea.KeyRunes, Runes: []rune(":role e1 prefill")})
	press(m, "enter")
	if m.confirm == nil || !strings.Contains(m.View(), "Switch e1 from decode to prefill") {
		t.Fatalf("keys in one message:\n%s", m.View())
	}
	press(m, "n")
	if cmd := typed(m, ":quit"); cmd != nil {
		t.Fatal("quit before enter")
	}
	if cmd := press(m, "enter"); cmd == nil {
		t.Fatal(":quit did not quit")
	}
}

// A stream that stays open and silent (an orchestrator stuck, a proxy
// holding the connection) is shown as stale, not live.
func TestSilentStreamIsStale(t *testing.T) {
	now := t0
	f := &fakeSource{watch: make(chan WatchEvent, 16)}
	m := New(f, Options{Now: func() time.Time { return now }})
	t.Cleanup(m.stop)
	m.Update(tea.WindowSizeMsg{Width: 120, Height: 40})
	m.Update(snapshot(1, threeNodes()...))
	if h := m.header(); !strings.Contains(h, "live (updated 0s ago)") {
		t.Fatalf("fresh: %s", h)
	}
	now = t0.Add(25 * time.Second)
	if h := m.header(); !strings.Contains(h, "stale (no update for 25s)") || strings.Contains(h, "live") {
		t.Fatalf("after 25 s of silence: %s", h)
	}
	if v := m.View(); !strings.Contains(v, "last known nodes 3:") {
		t.Fatalf("a stale node table does not say so:\n%s", v)
	}
	m.cluster.Simulation = &Simulation{}
	if h := m.header(); !strings.Contains(h, "live") {
		t.Fatalf("a simulation sends only what changes, at its pace: quiet, not stale: %s", h)
	}
	if v := m.View(); strings.Contains(v, "last known") {
		t.Fatalf("a quiet simulation's nodes are shown as old:\n%s", v)
	}
}

// A node that fails while streaming says, when it shows down, how many of
// its answers go on elsewhere; answers that could not are an event of
// their own.
func TestAFailedNodeSaysWhatBecameOfItsAnswers(t *testing.T) {
	m, _ := newTest(t, false)
	m.Update(snapshot(3, threeNodes()...))
	n := threeNodes()[2]
	n.Interrupted = 4
	m.Update(watchBatch{{Type: "node", Generation: 4, Node: &n}})
	n.State, n.Reason = "down", "no heartbeat for 3s"
	m.Update(watchBatch{{Type: "node", Generation: 5, Node: &n}})
	if e := m.events[0]; e.Kind != "down" || !strings.Contains(e.Text, n.ID+" is down: no heartbeat for 3s; the 4 answers it was streaming go on on other nodes") {
		t.Fatalf("events %+v", m.events)
	}
	n.Lost = 1
	m.Update(watchBatch{{Type: "node", Generation: 6, Node: &n}})
	if e := m.events[0]; e.Kind != "lost" || !strings.Contains(e.Text, "1 of the answers it was streaming when it failed could not go on") {
		t.Fatalf("events %+v", m.events)
	}
	press(m, "4")
	if v := m.View(); !strings.Contains(v, "lost") || !strings.Contains(v, "go on on other nodes") {
		t.Fatalf("events view:\n%s", v)
	}
}

// An API key at its share shows in the summary, with its waiting
// requests; one with room does not.
func TestSummaryNamesKeysAtTheirLimit(t *testing.T) {
	m := New(&fakeSource{watch: make(chan WatchEvent)}, Options{Now: func() time.Time { return t0 }, Poll: time.Hour})
	m.cluster = Cluster{Model: "m", KeyLimits: []KeyLimit{
		{Name: "team-a", MaxConcurrency: 64, InFlight: 64, Waiting: 3},
		{Name: "team-b", MaxConcurrency: 32, InFlight: 5},
		{Name: "team-c", MaxConcurrency: 8, InFlight: 8}}}
	s := m.summary()
	if !strings.Contains(s, "key team-a at its limit: 64 of 64 in flight, 3 waiting") || !strings.Contains(s, "key team-c at its limit: 8 of 8 in flight") ||
		strings.Contains(s, "team-b") {
		t.Fatalf("summary:\n%s", s)
	}
}

// With several orchestrators the header says how many are up and which
// leads; one silent, or no leader, shows plainly.
func TestHeaderShowsTheOrchestrators(t *testing.T) {
	m := New(&fakeSource{watch: make(chan WatchEvent)}, Options{Now: func() time.Time { return t0 }, Poll: time.Hour})
	m.Update(tea.WindowSizeMsg{Width: 160, Height: 40})
	m.cluster = Cluster{Model: "m"}
	if h := m.header(); strings.Contains(h, "orchestrators") {
		t.Fatalf("one orchestrator, header:\n%s", h)
	}
	m.cluster = Cluster{Model: "m", Leader: "orch-b", Orchestrators: []controlapi.Orchestrator{
		{Name: "orch-a", State: "up"}, {Name: "orch-b", State: "up", Leader: true}, {Name: "orch-c", State: "silent"}}}
	if h := m.header(); !strings.Contains(h, "orchestrators 2/3 up") || !strings.Contains(h, "leader orch-b") {
		t.Fatalf("header:\n%s", h)
	}
	m.cluster.Leader = ""
	if h := m.header(); !strings.Contains(h, "no leader") {
		t.Fatalf("header without a leader:\n%s", h)
	}
}
