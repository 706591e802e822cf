package tui

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	tea "github.com/charmbracelet/bubbletea"

	"github.com/evolvellm/evolve/controlapi"
)

// Views.
const (
	ViewNodes = iota
	ViewPlanner
	ViewBranches
	ViewEvents
)

// Connection states shown in the header.
const (
	ConnConnecting   = "connecting"
	ConnLive         = "live"
	ConnReconnecting = "reconnecting"
	ConnUnreachable  = "unreachable"
)

// sortNames are the sort orders of the nodes table, cycled by s.
var sortNames = []string{"id", "role", "queue", "gpu-kv"}

// Options configure the monitor.
type Options struct {
	ReadOnly bool
	Poll     time.Duration // planner, branches and KV; default 1 s
	Now      func() time.Time
}

// Model is the monitor's state. It is a bubbletea model; tests drive it
// with messages and read View.
type Model struct {
	src           Source
	opt           Options
	ctx           context.Context
	stop          context.CancelFunc
	width, height int
	minCols       int // the least width it draws in; 0: minWidth
	view          int

	nodes      map[string]*Node
	gen        uint64
	conn       string
	connErr    string
	failures   int
	lastUpdate time.Time
	watchCh    chan WatchEvent

	cluster    Cluster
	planner    *Planner
	plannerErr string
	branches   []Branch
	kv         *KV

	// The selection is a node and a branch, not a row: it stays on them
	// as rows re-sort, filter and come and go. cursor and branchCursor
	// are their rows as last drawn.
	selNode, selBranch   string
	cursor, branchCursor int
	expanded             string // the branch whose WHERE lists every node
	scroll               [4]int // per view: lines scrolled (planner decisions, events)
	sortKey              int
	filter               string
	filtering            bool
	command              string // typed after ':'
	commanding           bool
	detail               bool
	help                 bool
	paused               bool
	follow               string // session/branch followed in the branches view
	confirm              *pendingAction
	message              string
	messageUntil         time.Time      // when the message goes (zero: with the next key)
	action               *pendingAction // the last switch asked for, whose end is told
	// report: drawn once for a printed report (evolve top --once, evolve
	// planner), not a screen: no scroll marks or recent events.
	report bool

	load     map[string][]float64 // recent queue+running per node
	reqRate  []float64            // recent requests/s arriving (planner demand)
	splits   []int                // recent prefill counts
	ttftPred []float64            // recent predicted TTFT
	events   []Event              // newest first
	// The events' history: the orchestrator's record when it serves one
	// (complete from historySince), else only what this monitor saw
	// since watchStart.
	historyKnown bool
	historySince time.Time
	watchStart   time.Time
	decisionSeen map[time.Time]bool
	prevBr       map[string]string // branch -> residency text at the last poll
	frozen       string            // the screen as it was when paused
}

// Event is one line of the events view.
type Event struct {
	Time time.Time
	Kind string // switch, up, down, lost, planner, evict, error, branch, watch
	Text string
	// recorded: from the orchestrator's record (replaced by its next
	// snapshot), not seen by this monitor itself.
	recorded bool
}

// How long a message stays in the footer: long enough to read, not so
// long that it tells of a switch long over.
const (
	messageFor      = 6 * time.Second
	errorMessageFor = 20 * time.Second
)

type pendingAction struct {
	node, role string // role "" with unpin
	unpin      bool
	text       string
}

// New returns a monitor of src.
func New(src Source, opt Options) *Model {
	if opt.Poll <= 0 {
		opt.Poll = time.Second
	}
	if opt.Now == nil {
		opt.Now = time.Now
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Model{src: src, opt: opt, ctx: ctx, stop: cancel, nodes: map[string]*Node{}, conn: ConnConnecting,
		load: map[string][]float64{}, prevBr: map[string]string{}, decisionSeen: map[time.Time]bool{}, width: 120, height: 40}
}

// Messages.
type (
	watchBatch   []WatchEvent
	watchEnded   struct{ err error }
	reconnectMsg struct{}
	pollTick     struct{}
	polled       struct {
		cluster  *Cluster
		planner  *Planner
		pErr     error
		branches []Branch
		kv       *KV
		err      error
	}
	actionDone struct {
		what string
		err  error
	}
)

// Init starts the watch stream and the polls.
func (m *Model) Init() tea.Cmd {
	return tea.Batch(m.connect(), m.poll(), tea.Tick(m.opt.Poll, func(time.Time) tea.Msg { return pollTick{} }))
}

// connect opens the watch stream; events arrive in coalesced batches.
func (m *Model) connect() tea.Cmd {
	ch := make(chan WatchEvent, 1024)
	m.watchCh = ch
	ended := make(chan error, 1)
	go func() { ended <- m.src.Watch(m.ctx, ch); close(ch) }()
	return m.readWatch(ch, ended)
}

func (m *Model) readWatch(ch chan WatchEvent, ended chan error) tea.Cmd {
	return func() tea.Msg {
		ev, ok := <-ch
		if !ok {
			return watchEnded{err: <-ended}
		}
		batch := watchBatch{ev}
		// Coalesce a burst: take what is already queued, up to a bound.
		for len(batch) < 512 {
			select {
			case ev, ok := <-ch:
				if !ok {
					return batchThenEnd{batch, <-ended}
				}
				batch = append(batch, ev)
				continue
			default:
			}
			break
		}
		return batchWith{batch, ch, ended}
	}
}

type batchWith struct {
	batch watchBatch
	ch    chan WatchEvent
	ended chan error
}

type batchThenEnd struct {
	batch watchBatch
	err   error
}

func (m *Model) poll() tea.Cmd {
	src := m.src
	return func() tea.Msg {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		var p polled
		if c, err := src.Cluster(ctx); err == nil {
			p.cluster = &c
		} else {
			p.err = err
		}
		if pl, err := src.Planner(ctx); err == nil {
			p.planner = &pl
		} else {
			p.pErr = err
		}
		if b, err := src.Branches(ctx); err == nil {
			p.branches = b
		}
		if k, err := src.KV(ctx); err == nil {
			p.kv = &k
		}
		return p
	}
}

// Update handles a message.
func (m *Model) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	switch msg := msg.(type) {
	case tea.WindowSizeMsg:
		m.width, m.height = msg.Width, msg.Height
	case tea.KeyMsg:
		if msg.Type == tea.KeyRunes && len(msg.Runes) > 1 {
			// Keys typed faster than the screen reads them (or pasted)
			// arrive together: each is a key of its own.
			var cmds []tea.Cmd
			for _, r := range msg.Runes {
				cmds = append(cmds, m.key(string(r)))
			}
			return m, tea.Sequence(cmds...)
		}
		return m, m.key(msg.String())
	case batchWith:
		m.apply(msg.batch)
		return m, m.readWatch(msg.ch, msg.ended)
	case batchThenEnd:
		m.apply(msg.batch)
		return m, m.ended(msg.err)
	case watchBatch:
		m.apply(msg)
	case watchEnded:
		return m, m.ended(msg.err)
	case reconnectMsg:
		return m, m.connect()
	case pollTick:
		cmds := []tea.Cmd{tea.Tick(m.opt.Poll, func(time.Time) tea.Msg { return pollTick{} })}
		m.sampleLoad()
		if !m.paused {
			cmds = append(cmds, m.poll())
		}
		return m, tea.Batch(cmds...)
	case polled:
		m.applyPoll(msg)
	case actionDone:
		if msg.err != nil {
			m.say(fmt.Sprintf("%s failed: %v", msg.what, msg.err), errorMessageFor)
			m.event("error", m.message)
		} else {
			m.say(msg.what+": asked; its STATE shows the switch", messageFor)
		}
	}
	return m, nil
}

// say shows text in the footer for d (0: until the next key).
func (m *Model) say(text string, d time.Duration) {
	m.message, m.messageUntil = text, time.Time{}
	if d > 0 {
		m.messageUntil = m.opt.Now().Add(d)
	}
}

// shownMessage is the footer's message, "" once it has expired.
func (m *Model) shownMessage() string {
	if m.message == "" || !m.messageUntil.IsZero() && m.opt.Now().After(m.messageUntil) {
		return ""
	}
	return m.message
}

// ended handles the end of the watch stream: reconnect with backoff.
func (m *Model) ended(err error) tea.Cmd {
	if m.ctx.Err() != nil {
		return nil
	}
	m.failures++
	m.conn = ConnReconnecting
	if m.failures > 3 {
		m.conn = ConnUnreachable
	}
	if err != nil {
		m.connErr = err.Error()
	}
	wait := min(time.Duration(1<<min(m.failures-1, 4))*500*time.Millisecond, 8*time.Second)
	return tea.Tick(wait, func(time.Time) tea.Msg { return reconnectMsg{} })
}

// apply folds watch events into the nodes. A gap in generations means
// events were lost: the stream is reopened for a fresh snapshot.
func (m *Model) apply(batch watchBatch) {
	now := m.opt.Now()
	for _, ev := range batch {
		switch ev.Type {
		case "snapshot":
			old := m.nodes
			m.nodes = map[string]*Node{}
			for i := range ev.Nodes {
				n := ev.Nodes[i]
				m.nodes[n.ID] = &n
			}
			m.snapshotEvents(ev, old, now)
			m.gen = ev.Generation
			m.conn, m.failures, m.connErr = ConnLive, 0, ""
		case "node":
			if ev.Node == nil {
				continue
			}
			if m.gen != 0 && ev.Generation > m.gen+1 {
				m.event("error", fmt.Sprintf("missed %d updates; resyncing", ev.Generation-m.gen-1))
				m.gen = ev.Generation
				m.stop()
				m.ctx, m.stop = context.WithCancel(context.Background())
				continue // the stream restarts with a snapshot
			}
			m.gen = max(m.gen, ev.Generation)
			n := *ev.Node
			if !m.historyKnown {
				m.noteChange(m.nodes[n.ID], &n, now)
			}
			m.noteSwitchEnd(m.nodes[n.ID], &n)
			m.nodes[n.ID] = &n
		case "event":
			if ev.Event != nil && m.historyKnown {
				m.addEvent(Event{Time: ev.Event.Time, Kind: ev.Event.Kind, Text: ev.Event.Text, recorded: true})
			}
		}
		m.lastUpdate = now
	}
}

// snapshotEvents takes a snapshot's history: the orchestrator's record,
// which replaces what an earlier snapshot gave; or, from a server that
// keeps none, what changed since the last snapshot, and for the first a
// plain line that the watch began, rather than joins made up at its time.
func (m *Model) snapshotEvents(ev WatchEvent, old map[string]*Node, now time.Time) {
	if !ev.HistorySince.IsZero() {
		m.historyKnown, m.historySince = true, ev.HistorySince
		kept := m.events[:0:0]
		for _, e := range m.events {
			if !e.recorded {
				kept = append(kept, e)
			}
		}
		m.events = kept
		for _, e := range ev.Events {
			m.addEvent(Event{Time: e.Time, Kind: e.Kind, Text: e.Text, recorded: true})
		}
		if m.watchStart.IsZero() {
			m.watchStart = now
		}
		return
	}
	m.historyKnown = false
	if m.watchStart.IsZero() {
		m.watchStart = now
		var p, d int
		for _, n := range m.nodes {
			if n.Role == "prefill" {
				p++
			} else {
				d++
			}
		}
		m.event("watch", fmt.Sprintf("watch began: %d nodes (%d prefill, %d decode); what happened before is not known here", len(m.nodes), p, d))
		return
	}
	for id, n := range m.nodes {
		m.noteChange(old[id], n, now)
	}
}

// sampleLoad records every node's queue and running requests, once a poll.
func (m *Model) sampleLoad() {
	for id, n := range m.nodes {
		m.load[id] = appendRing(m.load[id], float64(n.Waiting+n.Running), 120)
	}
}

// noteChange records the events a node's update implies (when the
// server keeps no record of its own).
func (m *Model) noteChange(old, n *Node, now time.Time) {
	for _, e := range controlapi.NodeEvents(old, n, now) {
		m.addEvent(Event{Time: e.Time, Kind: e.Kind, Text: e.Text})
	}
}

// noteSwitchEnd tells, in the footer, of the end of the switch this
// monitor asked for: the message of its start is over.
func (m *Model) noteSwitchEnd(old, n *Node) {
	c := m.action
	if old == nil || c == nil || n.ID != c.node || n.Switch != nil || n.State == "switching" {
		return
	}
	if c.unpin && n.Mode != "auto" || !c.unpin && (n.Role != c.role || n.Mode != "pinned") {
		return
	}
	m.action = nil
	m.say(fmt.Sprintf("%s is now %s (%s)", n.ID, n.Role, n.Mode), messageFor)
}

// event records what this monitor saw now.
func (m *Model) event(kind, text string) {
	m.addEvent(Event{Time: m.opt.Now(), Kind: kind, Text: text})
}

// addEvent puts e among the events, newest first (before those of its
// own time), and forgets the oldest past a bound.
func (m *Model) addEvent(e Event) {
	i := 0
	for i < len(m.events) && m.events[i].Time.After(e.Time) {
		i++
	}
	m.events = slices.Insert(m.events, i, e)
	if len(m.events) > 1000 {
		m.events = m.events[:1000]
	}
}

func (m *Model) applyPoll(p polled) {
	if p.cluster != nil {
		m.cluster = *p.cluster
	}
	if p.planner != nil {
		// The planner's decisions, from its own record, at their times.
		for _, d := range p.planner.Decisions {
			if m.decisionSeen[d.Time] {
				continue
			}
			m.decisionSeen[d.Time] = true
			m.addEvent(Event{Time: d.Time, Kind: "planner", Text: decisionText(d)})
		}
		m.planner, m.plannerErr = p.planner, ""
		m.reqRate = appendRing(m.reqRate, p.planner.Short.Requests, 60)
		m.splits = appendRingInt(m.splits, p.planner.Prefill, 60)
		m.ttftPred = appendRing(m.ttftPred, p.planner.Current.TTFT, 60)
	} else if p.pErr != nil {
		m.plannerErr = p.pErr.Error()
	}
	if p.branches != nil {
		for _, b := range p.branches {
			key := b.Session + "/" + b.Branch
			where := residency(b)
			if prev, ok := m.prevBr[key]; ok && prev != where && key == m.follow {
				m.event("branch", fmt.Sprintf("%s moved: %s -> %s", key, prev, where))
			}
			m.prevBr[key] = where
		}
		m.branches = p.branches
	}
	if p.kv != nil {
		m.noteEvictions(p.kv)
		m.kv = p.kv
	}
}

// noteEvictions adds an event for each node that evicted copies of blocks
// live agent branches reference since the last poll.
func (m *Model) noteEvictions(k *KV) {
	if m.kv == nil {
		return // the first poll: counters since the nodes joined
	}
	prev := map[string]KVNode{}
	for _, n := range m.kv.Nodes {
		prev[n.ID] = n
	}
	for _, n := range k.Nodes {
		p, ok := prev[n.ID]
		if !ok {
			continue
		}
		gpu, host, lost := n.RefEvictedGPU-p.RefEvictedGPU, n.RefEvictedHost-p.RefEvictedHost, n.RefLost-p.RefLost
		if gpu <= 0 && host <= 0 {
			continue
		}
		text := fmt.Sprintf("%s evicted referenced blocks: %d from GPU, %d from host", n.ID, gpu, host)
		if lost > 0 {
			text += fmt.Sprintf("; %d were the last copy (to recompute)", lost)
		} else {
			text += "; every one still has a copy"
		}
		m.event("evict", text)
	}
}

func appendRing(r []float64, v float64, n int) []float64 {
	r = append(r, v)
	if len(r) > n {
		r = r[len(r)-n:]
	}
	return r
}

func appendRingInt(r []int, v, n int) []int {
	r = append(r, v)
	if len(r) > n {
		r = r[len(r)-n:]
	}
	return r
}

// sortedNodes lists the nodes in table order, filtered.
func (m *Model) sortedNodes() []*Node {
	out := make([]*Node, 0, len(m.nodes))
	for _, n := range m.nodes {
		if m.filter != "" && !strings.Contains(n.ID+" "+n.Role+" "+n.State+" "+n.Mode, m.filter) {
			continue
		}
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		switch sortNames[m.sortKey] {
		case "role":
			if a.Role != b.Role {
				return a.Role > b.Role // prefill first
			}
		case "queue":
			if qa, qb := a.Waiting+a.Running, b.Waiting+b.Running; qa != qb {
				return qa > qb
			}
		case "gpu-kv":
			if a.GPUKVUsage != b.GPUKVUsage {
				return a.GPUKVUsage > b.GPUKVUsage
			}
		}
		return controlapi.CompareIDs(a.ID, b.ID) < 0
	})
	return out
}

// selected is the selected node: the one chosen, wherever its row is
// now; if it is gone (or filtered out), the one drawn in its row, which
// becomes the selection.
func (m *Model) selected() *Node {
	ns := m.sortedNodes()
	if len(ns) == 0 {
		return nil
	}
	for i, n := range ns {
		if n.ID == m.selNode {
			m.cursor = i
			return n
		}
	}
	m.cursor = min(max(m.cursor, 0), len(ns)-1)
	m.selNode = ns[m.cursor].ID
	return ns[m.cursor]
}

// moveNode moves the selection by d rows.
func (m *Model) moveNode(d int) {
	ns := m.sortedNodes()
	if len(ns) == 0 || m.selected() == nil {
		return
	}
	m.cursor = min(max(m.cursor+d, 0), len(ns)-1)
	m.selNode = ns[m.cursor].ID
}

// edit applies key k to a line being typed (the filter, a command):
// enter ends it, esc ends and clears it, backspace takes a character
// back. It reports whether typing goes on.
func edit(line *string, k string) bool {
	switch k {
	case "enter":
		return false
	case "esc":
		*line = ""
		return false
	case "backspace":
		if *line != "" {
			*line = (*line)[:len(*line)-1]
		}
	default:
		if len(k) == 1 {
			*line += k
		}
	}
	return true
}

// key handles a key press.
func (m *Model) key(k string) tea.Cmd {
	if m.commanding {
		if m.commanding = edit(&m.command, k); !m.commanding && k == "enter" {
			return m.run(m.command)
		}
		return nil
	}
	if m.filtering {
		m.filtering = edit(&m.filter, k) // enter keeps the filter, esc clears it
		return nil
	}
	if m.confirm != nil {
		c := m.confirm
		m.confirm = nil
		if k != "y" && k != "Y" {
			m.say("cancelled", messageFor)
			return nil
		}
		return m.act(c)
	}
	if m.help {
		m.help = false
		return nil
	}
	if m.messageUntil.IsZero() {
		m.message = "" // a message without a time lasts until a key
	}
	switch k {
	case "q", "ctrl+c":
		m.stop()
		return tea.Quit
	case "1", "2", "3", "4":
		m.view = int(k[0] - '1')
	case "j", "down":
		m.move(1)
	case "k", "up":
		m.move(-1)
	case "pgdown", "ctrl+d", " ":
		m.move(max(1, m.height/2))
	case "pgup", "ctrl+u":
		m.move(-max(1, m.height/2))
	case "home", "g":
		m.move(-1 << 30)
	case "end", "G":
		m.move(1 << 30)
	case "enter":
		if m.view == ViewBranches {
			// Open the selected branch's WHERE: every node that holds
			// some of its blocks, a line each.
			if b := m.selectedBranch(); b != nil {
				if key := b.Session + "/" + b.Branch; m.expanded == key {
					m.expanded = ""
				} else {
					m.expanded = key
				}
			}
		} else {
			m.detail = !m.detail
		}
	case "/":
		m.filtering, m.filter = true, ""
	case "esc":
		m.filter, m.expanded = "", ""
	case ":":
		m.commanding, m.command = true, ""
	case "s":
		m.sortKey = (m.sortKey + 1) % len(sortNames)
		m.say("sorted by "+sortNames[m.sortKey]+"; the selection stays on "+m.selNode, messageFor)
	case "?":
		m.help = true
	case "Z":
		m.paused = !m.paused
		if m.paused {
			m.say("paused: the screen holds still; Z resumes", 0)
			m.frozen = ""
			m.frozen = m.View()
		} else {
			m.frozen = ""
			m.say("resumed", messageFor)
		}
	case "f":
		if b := m.selectedBranch(); b != nil {
			key := b.Session + "/" + b.Branch
			if m.follow == key {
				m.follow = ""
				m.say("not following", messageFor)
			} else {
				m.follow = key
				m.say("following "+key, messageFor)
			}
		}
	case "p", "d", "a":
		return m.ask(k)
	}
	return nil
}

// move moves the view's selection (nodes, branches) or scrolls it
// (planner decisions, events) by d lines.
func (m *Model) move(d int) {
	switch m.view {
	case ViewNodes:
		m.moveNode(d)
	case ViewBranches:
		bs, _ := m.treeBranches()
		if len(bs) == 0 || m.selectedBranch() == nil {
			return
		}
		m.branchCursor = min(max(m.branchCursor+d, 0), len(bs)-1)
		m.selBranch = bs[m.branchCursor].Session + "/" + bs[m.branchCursor].Branch
		m.follow = ""
	default:
		m.scroll[m.view] = max(0, m.scroll[m.view]+d) // bounded when drawn
	}
}

// commandHelp lists what ':' takes.
const commandHelp = "nodes, planner, branches, events, role NODE prefill|decode, auto NODE, quit"

// run carries out a command typed after ':' (k9s-style): a view by name,
// a role switch or a hand-back of any node (asked first, as p, d and a
// are), or quit.
func (m *Model) run(line string) tea.Cmd {
	f := strings.Fields(line)
	if len(f) == 0 {
		return nil
	}
	views := map[string]int{"nodes": ViewNodes, "planner": ViewPlanner, "branches": ViewBranches, "events": ViewEvents}
	if v, ok := views[f[0]]; ok && len(f) == 1 {
		m.view = v
		return nil
	}
	switch {
	case len(f) == 1 && (f[0] == "q" || f[0] == "quit"):
		m.stop()
		return tea.Quit
	case len(f) == 3 && f[0] == "role" && (f[2] == "prefill" || f[2] == "decode"),
		len(f) == 2 && f[0] == "auto":
		n := m.nodes[f[1]]
		if n == nil {
			m.say(fmt.Sprintf("no node %q (nodes: %s)", f[1], strings.Join(m.nodeIDs(), ", ")), errorMessageFor)
			return nil
		}
		k := "a"
		if f[0] == "role" {
			k = f[2][:1]
		}
		return m.askFor(n, k)
	}
	m.say(fmt.Sprintf("unknown command %q: want %s", line, commandHelp), errorMessageFor)
	return nil
}

// nodeIDs lists the nodes' ids in order.
func (m *Model) nodeIDs() []string {
	ids := make([]string, 0, len(m.nodes))
	for id := range m.nodes {
		ids = append(ids, id)
	}
	slices.SortFunc(ids, controlapi.CompareIDs)
	return ids
}

// ask prepares a switch of the selected node and asks for confirmation.
func (m *Model) ask(k string) tea.Cmd {
	n := m.selected()
	if n == nil || m.view != ViewNodes {
		return nil
	}
	return m.askFor(n, k)
}

// askFor prepares a switch of node n (k: p prefill, d decode, a back to
// the planner) and asks for confirmation: the key to press first, so that
// a narrow footer shows it whatever else it cuts.
func (m *Model) askFor(n *Node, k string) tea.Cmd {
	if m.opt.ReadOnly {
		m.say("read-only: switching nodes is disabled (started with --readonly)", errorMessageFor)
		return nil
	}
	switch k {
	case "a":
		if n.Mode != "pinned" {
			m.say(n.ID+" is already in auto mode", messageFor)
			return nil
		}
		m.confirm = &pendingAction{node: n.ID, unpin: true,
			text: fmt.Sprintf("[y/N] Hand %s back to the planner? It stays %s until the planner moves it.", n.ID, n.Role)}
	default:
		role := "prefill"
		if k == "d" {
			role = "decode"
		}
		if n.Role == role && n.Mode == "pinned" {
			m.say(fmt.Sprintf("%s is already a pinned %s node", n.ID, role), messageFor)
			return nil
		}
		what := fmt.Sprintf("It drains %d in flight, moves its GPU KV to host, then serves %s; the planner leaves it.", n.Waiting+n.Running, role)
		if n.Role == role {
			what = "It keeps its role; the planner leaves it."
		}
		m.confirm = &pendingAction{node: n.ID, role: role,
			text: fmt.Sprintf("[y/N] Switch %s from %s to %s and pin it? %s", n.ID, n.Role, role, what)}
	}
	return nil
}

func (m *Model) act(c *pendingAction) tea.Cmd {
	src := m.src
	m.action = c
	return func() tea.Msg {
		// Long enough for the planner's lease to move to another
		// orchestrator (the source asks again meanwhile).
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if c.unpin {
			return actionDone{what: "unpin " + c.node, err: src.Unpin(ctx, c.node)}
		}
		return actionDone{what: fmt.Sprintf("switch %s to %s", c.node, c.role), err: src.SetRole(ctx, c.node, c.role)}
	}
}

// treeBranches lists the branches in tree order with their depth.
func (m *Model) treeBranches() ([]Branch, []int) { return Tree(m.branches, m.filter) }

// Tree orders branches as a tree per session (sessions sorted; a branch
// under the one it forked from) and gives each its depth; filter keeps the
// branches whose session/branch contains it.
func Tree(branches []Branch, filter string) ([]Branch, []int) {
	bySession := map[string][]Branch{}
	var sessions []string
	for _, b := range branches {
		if filter != "" && !strings.Contains(b.Session+"/"+b.Branch, filter) {
			continue
		}
		if _, ok := bySession[b.Session]; !ok {
			sessions = append(sessions, b.Session)
		}
		bySession[b.Session] = append(bySession[b.Session], b)
	}
	slices.SortFunc(sessions, controlapi.CompareIDs)
	var out []Branch
	var depth []int
	for _, s := range sessions {
		bs := bySession[s]
		slices.SortStableFunc(bs, func(a, b Branch) int { return controlapi.CompareIDs(a.Branch, b.Branch) })
		known := map[string]bool{}
		for _, b := range bs {
			known[b.Branch] = true
		}
		seen := map[string]bool{}
		var walk func(b Branch, d int)
		walk = func(b Branch, d int) {
			if seen[b.Branch] {
				return
			}
			seen[b.Branch] = true
			out, depth = append(out, b), append(depth, d)
			for _, c := range bs {
				if c.Parent == b.Branch {
					walk(c, d+1)
				}
			}
		}
		for _, b := range bs {
			if b.Parent == "" || !known[b.Parent] {
				walk(b, 0)
			}
		}
	}
	return out, depth
}

// selectedBranch is the selected branch: the one chosen (or followed),
// wherever its row is now; if it is gone, the one in its row.
func (m *Model) selectedBranch() *Branch {
	bs, _ := m.treeBranches()
	if len(bs) == 0 {
		return nil
	}
	want := m.selBranch
	if m.follow != "" {
		want = m.follow
	}
	for i := range bs {
		if bs[i].Session+"/"+bs[i].Branch == want {
			m.branchCursor, m.selBranch = i, want
			return &bs[i]
		}
	}
	m.branchCursor = min(max(m.branchCursor, 0), len(bs)-1)
	b := &bs[m.branchCursor]
	m.selBranch = b.Session + "/" + b.Branch
	return b
}

// Where says where a branch's blocks live: node GPU/host blocks.
func Where(b Branch) string { return residency(b) }

// WhereShort names the node holding most of a branch's blocks, with its
// GPU and host copies, and how many other nodes hold some.
func WhereShort(b Branch) string {
	if len(b.Residency) == 0 {
		return "-"
	}
	best := b.Residency[0]
	for _, r := range b.Residency[1:] {
		if r.GPU+r.Host > best.GPU+best.Host {
			best = r
		}
	}
	s := fmt.Sprintf("%s %dG/%dH", best.Node, best.GPU, best.Host)
	if n := len(b.Residency) - 1; n > 0 {
		s += fmt.Sprintf(" +%d more", n)
	}
	return s
}

// fitWhere is Where when it fits width, else WhereShort (cut if need be).
func fitWhere(b Branch, width int) string {
	if full := residency(b); len([]rune(full)) <= width {
		return full
	}
	return truncate(WhereShort(b), width)
}

func residency(b Branch) string {
	var parts []string
	for _, r := range b.Residency {
		parts = append(parts, fmt.Sprintf("%s %dG/%dH", r.Node, r.GPU, r.Host))
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ", ")
}

// Render draws the nodes view of a snapshot at a fixed size, for evolve
// top --once and for tests.
func Render(c Cluster, nodes []Node, p *Planner, k *KV, b []Branch, addr string, width, height int) string {
	m := New(staticSource(addr), Options{})
	m.width, m.height, m.report = width, height, true
	m.cluster, m.planner, m.kv, m.branches = c, p, k, b
	m.apply(watchBatch{{Type: "snapshot", Nodes: nodes}})
	if p != nil {
		m.reqRate = []float64{p.Short.Requests}
	}
	m.stop()
	// The screen without the key help and the blank lines under it.
	lines := strings.Split(m.View(), "\n")
	lines = lines[:len(lines)-1]
	for len(lines) > 0 && strings.TrimSpace(lines[len(lines)-1]) == "" {
		lines = lines[:len(lines)-1]
	}
	return strings.Join(lines, "\n") + "\n"
}

// RenderPlanner draws the planner view of a status, for evolve planner.
func RenderPlanner(p Planner, width int) string {
	m := New(staticSource(""), Options{})
	m.stop()
	m.width, m.planner, m.report = width, &p, true
	return strings.Join(m.viewPlanner(1<<30), "\n") + "\n"
}

// staticSource is a Source with nothing behind it but an address.
type staticSource string

func (s staticSource) Addr() string { return string(s) }
func (staticSource) Watch(ctx context.Context, _ chan<- WatchEvent) error {
	<-ctx.Done()
	return ctx.Err()
}
func (staticSource) Cluster(context.Context) (Cluster, error) { return Cluster{}, nil }
func (staticSource) Planner(context.Context) (Planner, error) {
	return Planner{}, fmt.Errorf("no planner")
}
func (staticSource) Branches(context.Context) ([]Branch, error)    { return nil, nil }
func (staticSource) KV(context.Context) (KV, error)                { return KV{}, nil }
func (staticSource) SetRole(context.Context, string, string) error { return fmt.Errorf("static") }
func (staticSource) Unpin(context.Context, string) error           { return fmt.Errorf("static") }
