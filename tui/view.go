package tui

import (
	"cmp"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/charmbracelet/lipgloss"
)

// Minimum terminal size.
const minWidth, minHeight = 80, 24

// narrowest is the least width the model draws in: minWidth alone, less
// as a pane of a Split.
func (m *Model) narrowest() int {
	if m.minCols > 0 {
		return m.minCols
	}
	return minWidth
}

// rootCause is the end of an error's chain, its cause: Go's wrapped
// errors read 'Get "http://host/api/v1/watch": dial tcp host: connect:
// connection refused', whose start a narrow header would show, and whose
// end says what went wrong.
func rootCause(msg string) string {
	if i := strings.LastIndex(msg, ": "); i >= 0 && i+2 < len(msg) {
		return msg[i+2:]
	}
	return msg
}

// staleAfter is how long a live stream may stay silent before the header
// says the data is stale.
const staleAfter = 10 * time.Second

var (
	stTitle    = lipgloss.NewStyle().Bold(true)
	stDim      = lipgloss.NewStyle().Faint(true)
	stPrefill  = lipgloss.NewStyle().Foreground(lipgloss.Color("6"))
	stDecode   = lipgloss.NewStyle().Foreground(lipgloss.Color("5"))
	stBad      = lipgloss.NewStyle().Foreground(lipgloss.Color("1")).Bold(true)
	stGood     = lipgloss.NewStyle().Foreground(lipgloss.Color("2"))
	stSelected = lipgloss.NewStyle().Reverse(true)
	stTab      = lipgloss.NewStyle().Reverse(true).Bold(true)
)

// View renders the screen: the header, the view's body in the lines left
// between it and the footer, and the footer, which wraps (a confirmation
// or an error is never cut).
func (m *Model) View() string {
	if m.width < m.narrowest() || m.height < minHeight {
		return fmt.Sprintf("terminal too small: evolve top needs %dx%d, this one is %dx%d\n(q quits)", minWidth, minHeight, m.width, m.height)
	}
	if m.paused && m.frozen != "" {
		return m.frozen
	}
	foot := m.footer()
	bodyH := m.height - 2 - len(foot)
	var body []string
	switch {
	case m.help:
		body = wrapLines(strings.Split(helpText, "\n"), m.width)
	case m.view == ViewPlanner:
		body = m.viewPlanner(bodyH)
	case m.view == ViewBranches:
		body = m.viewBranches(bodyH)
	case m.view == ViewEvents:
		body = m.viewEvents(bodyH)
	default:
		body = m.viewNodes(bodyH)
	}
	lines := append(strings.Split(m.header(), "\n"), body...)
	for i, l := range lines {
		if lipgloss.Width(l) > m.width {
			lines[i] = truncate(stripANSI(l), m.width) // a last guard: views fit their lines
		}
	}
	if max := m.height - len(foot); len(lines) > max {
		lines = lines[:max]
	}
	for len(lines) < m.height-len(foot) {
		lines = append(lines, "")
	}
	return strings.Join(append(lines, foot...), "\n")
}

const helpText = `Keys
  1 nodes   2 planner   3 branches   4 events   (or :nodes, :planner...)
  j/k, arrows     move the selection (nodes, branches) or scroll (planner
                  decisions, events); PgUp/PgDn, g/G: a page, the ends
  enter           details of the selected node; in branches, every node
                  holding the selected branch's blocks
  /               filter nodes, branches and events (esc clears)
  s               sort the nodes: id, role, queue, gpu-kv (▲▼ marks it)
  :               command: nodes, planner, branches, events,
                  role NODE prefill|decode, auto NODE, quit
  p / d           switch the selected node to prefill / decode and pin it
  a               hand the selected node back to the planner
  f               follow the selected branch (branches view)
  Z               pause the screen   q  quit   ?  this help
p, d, a and role ask first: [y/N]. The selection is a node, not a row.
LOAD: each node's queued and running requests, a bar a second, every row
on one scale, its peak in the column's head. Arrivals: requests a second
the planner sees coming in; finished: those the router answered. Roles
show as a letter and a word (P prefill, D decode): nothing is said by
colour alone. NO_COLOR turns colour off.   (any key closes this help)`

func (m *Model) header() string {
	tabs := []string{"1 nodes", "2 planner", "3 branches", "4 events"}
	for i := range tabs {
		if i == m.view {
			tabs[i] = stTab.Render(" " + tabs[i] + " ")
		} else {
			tabs[i] = " " + tabs[i] + " "
		}
	}
	conn := m.conn
	switch m.conn {
	case ConnLive:
		age := "no update yet"
		since := m.opt.Now().Sub(m.lastUpdate)
		if !m.lastUpdate.IsZero() {
			age = "updated " + since.Round(100*time.Millisecond).String() + " ago"
		}
		// Engines heartbeat every second, so a live cluster's stream
		// never goes quiet for long: a silent one is stuck somewhere. A
		// simulation sends only what changes, at its own pace: quiet
		// says nothing there.
		if m.outdated() {
			conn = stBad.Render("stale") + " (no update for " + since.Round(time.Second).String() + ")"
		} else {
			conn = stGood.Render("live") + " (" + age + ")"
		}
	case ConnReconnecting, ConnUnreachable:
		conn = stBad.Render(m.conn)
		if m.connErr != "" {
			conn += ": " + truncate(rootCause(m.connErr), 40)
		}
		if !m.lastUpdate.IsZero() {
			// What the screen shows is that old.
			conn += " (showing the state of " + m.opt.Now().Sub(m.lastUpdate).Round(time.Second).String() + " ago)"
		}
	}
	name := m.cluster.Model
	if name == "" {
		name = "evolve"
	}
	addr := stDim.Render(m.src.Addr())
	if sim := m.cluster.Simulation; sim != nil {
		// A simulation: its policy and modelled clock come first, the
		// address last (the first to go on a narrow screen).
		clock := fmt.Sprintf("modelled %s of %s", fmtDur(sim.ElapsedSec), fmtDur(sim.TotalSec))
		if sim.Done {
			clock += ", done"
		} else if sim.Pace > 0 {
			clock += fmt.Sprintf(", %gx", sim.Pace)
		}
		name = "simulated " + m.cluster.Policy + "  " + clock
	}
	if orch := m.orchestrators(); orch != "" {
		name += "  " + orch
	}
	line := fmt.Sprintf("%s  %s  %s", stTitle.Render("evolve top"), name, conn)
	if lipgloss.Width(line) > m.width {
		// Narrow: the state without its age.
		line = fmt.Sprintf("%s  %s  %s", stTitle.Render("evolve top"), name, strings.SplitN(conn, " (", 2)[0])
	}
	if m.opt.ReadOnly {
		line += "  [read-only]"
	}
	if m.paused {
		line += "  " + stBad.Render("PAUSED")
	}
	// The address goes last, and only where it fits: the connection's
	// state matters more on a narrow screen.
	if addr != "" && lipgloss.Width(line)+2+lipgloss.Width(addr) <= m.width {
		line += "  " + addr
	}
	return line + "\n" + strings.Join(tabs, "")
}

// orchestrators says, for a cluster of several orchestrators, how many
// are up of those known, and which leads the planner; "" for one.
func (m *Model) orchestrators() string {
	os := m.cluster.Orchestrators
	if len(os) < 2 {
		return ""
	}
	up := 0
	for _, o := range os {
		if o.State == "up" {
			up++
		}
	}
	s := fmt.Sprintf("orchestrators %d/%d up", up, len(os))
	if up < len(os) {
		s = stBad.Render(s)
	}
	if m.cluster.Leader == "" {
		return s + ", " + stBad.Render("no leader")
	}
	return s + ", leader " + m.cluster.Leader
}

// outdated reports whether what the screen shows may no longer be the
// cluster's state: the orchestrator is lost, or a live cluster's stream
// has gone quiet for longer than its heartbeats allow.
func (m *Model) outdated() bool {
	if m.lastUpdate.IsZero() {
		return false
	}
	switch m.conn {
	case ConnReconnecting, ConnUnreachable:
		return true
	case ConnLive:
		return m.cluster.Simulation == nil && m.opt.Now().Sub(m.lastUpdate) > staleAfter
	}
	return false
}

// footer is the screen's last lines: a confirmation (its key first), the
// line being typed, a message, or the key hints; wrapped to the width, at
// most three lines.
func (m *Model) footer() []string {
	var text string
	style := lipgloss.NewStyle()
	switch msg := m.shownMessage(); {
	case m.confirm != nil:
		text, style = m.confirm.text, stBad
	case m.filtering:
		text = "filter: " + m.filter + "_  (enter keeps it, esc clears it)"
	case m.commanding:
		text = ":" + m.command + "_  (" + commandHelp + ")"
	case msg != "":
		text = msg
	default:
		return []string{stDim.Render(truncate("? help  q quit  1-4 views  p/d/a switch  / filter  : command  s sort  Z pause", m.width))}
	}
	lines := wrapWords(text, "", m.width)
	if len(lines) > 3 {
		lines = append(lines[:2], truncate(strings.Join(lines[2:], " "), m.width))
	}
	for i := range lines {
		lines[i] = style.Render(lines[i])
	}
	return lines
}

func (m *Model) summary() string {
	var p, d, sw, down, draining int
	for _, n := range m.nodes {
		switch {
		case n.State == "down":
			down++
		case n.State == "switching":
			sw++
		case n.State == "draining":
			draining++
		case n.Role == "prefill":
			p++
		default:
			d++
		}
	}
	head := fmt.Sprintf("nodes %d: %d prefill, %d decode serving, %d switching, %d down", len(m.nodes), p, d, sw, down)
	if m.outdated() {
		// Said in words, not only by the faint rows below: NO_COLOR
		// shows no faintness.
		head = "last known " + head
	}
	if draining > 0 {
		head += fmt.Sprintf(", %d draining", draining)
	}
	segs := []string{head}
	if len(m.reqRate) > 0 {
		// What the planner sees arriving, not what finished (below).
		segs = append(segs, fmt.Sprintf("arrivals %.1f req/s %s", m.reqRate[len(m.reqRate)-1], scaledSparkline(m.reqRate, 12, func(v float64) string { return fmt.Sprintf("%.1f", v) })))
	}
	if m.planner != nil && m.planner.Current.Prefill+m.planner.Current.Decode > 0 {
		segs = append(segs, fmt.Sprintf("predicted TTFT %s, E2E %s", seconds(m.planner.Current.TTFT), seconds(m.planner.Current.E2E)))
	}
	if m.kv != nil && m.kv.PromptTokens > 0 {
		segs = append(segs, fmt.Sprintf("KV hits: GPU %.0f%%, host %.0f%%", m.kv.GPUHitRate*100, m.kv.HostHitRate*100))
	}
	// API keys at their share: their agents wait, or get 429s.
	for _, l := range m.cluster.KeyLimits {
		if l.Waiting > 0 || l.InFlight >= l.MaxConcurrency {
			seg := fmt.Sprintf("key %s at its limit: %d of %d in flight", l.Name, l.InFlight, l.MaxConcurrency)
			if l.Waiting > 0 {
				seg += fmt.Sprintf(", %d waiting", l.Waiting)
			}
			segs = append(segs, seg)
		}
	}
	s := wrapSegments(segs, m.width)
	// Measured, not predicted: the last minute's requests (a simulation's
	// last full modelled minute).
	var measured []string
	if sim := m.cluster.Simulation; sim != nil {
		measured = append(measured, fmt.Sprintf("modelled %s: %d requests done", fmtDur(sim.ElapsedSec), sim.Requests))
	}
	if r := m.cluster.Recent; r != nil && r.Requests > 0 {
		measured = append(measured, fmt.Sprintf("finished in the last %s: %d req (%.1f/s)", fmtDur(r.WindowSec), r.Requests, r.RequestsSec),
			fmt.Sprintf("TTFT P50 %.2fs P95 %.2fs, E2E P50 %.1fs", r.TTFTP50, r.TTFTP95, r.E2EP50))
		if x := m.cluster.Speedup; x > 0 && x != 1 {
			// Engines at --speedup: what the router measured is
			// wall-clock, and so is what the planner predicts (it learns
			// pass costs in wall time: modelled ones over the speedup).
			measured = append(measured, fmt.Sprintf("wall clock, predictions too: engines run %gx (modelled times are %gx these)", x, x))
		}
	}
	if len(measured) > 0 {
		s += "\n" + wrapSegments(measured, m.width)
	}
	return strings.Join(wrapLines(strings.Split(s, "\n"), m.width), "\n")
}

// filterLine says what the filter hides, or "" without one.
func (m *Model) filterLine(shown, of int, what string) string {
	switch {
	case m.filtering:
		return ""
	case m.filter == "":
		return ""
	}
	return fmt.Sprintf("filter %q: %d of %d %s shown (/ edits it, esc clears it)", m.filter, shown, of, what)
}

// wrapSegments joins segments with "  |  " on lines of at most width
// cells, so that a narrow terminal shows every figure instead of cutting
// the line.
func wrapSegments(segs []string, width int) string { return wrapJoin(segs, "  |  ", "", "", width) }

// wrapJoin joins parts with sep on lines of at most width cells; where the
// next part would not fit, the line ends with lineEnd and the next starts
// with indent. The first line starts after a label as wide as indent.
func wrapJoin(parts []string, sep, lineEnd, indent string, width int) string {
	var b strings.Builder
	used := len(indent)
	for i, part := range parts {
		w := lipgloss.Width(part)
		switch {
		case i == 0:
		case used+len(sep)+w <= width:
			b.WriteString(sep)
			used += len(sep)
		default:
			b.WriteString(lineEnd + "\n" + indent)
			used = len(indent)
		}
		b.WriteString(part)
		used += w
	}
	return b.String()
}

// wrapWords wraps text at its spaces onto lines of at most width cells,
// each after the first starting with indent; spaces within a line stay as
// written (columns), and a word longer than a line is cut onto the next.
func wrapWords(text, indent string, width int) []string {
	var lines []string
	line, used, empty := "", 0, true // empty: nothing but the indent yet
	next := func() {
		lines = append(lines, line)
		line, used, empty = indent, len(indent), true
	}
	rest := text
	for rest != "" {
		word := strings.TrimLeft(rest, " ")
		sp := rest[:len(rest)-len(word)]
		if i := strings.IndexByte(word, ' '); i >= 0 {
			word, rest = word[:i], word[i:]
		} else {
			rest = ""
		}
		if word == "" {
			break // trailing spaces
		}
		if empty && len(lines) > 0 {
			sp = ""
		}
		for word != "" {
			ww := lipgloss.Width(word)
			if used+len(sp)+ww <= width {
				line += sp + word
				used += len(sp) + ww
				empty = false
				break
			}
			if !empty {
				next()
				sp = ""
				continue
			}
			// Longer than a whole line: cut it.
			r := []rune(word)
			room := min(len(r), max(1, width-used-len(sp)))
			line += sp + string(r[:room])
			empty, word, sp = false, string(r[room:]), ""
			if word != "" {
				next()
			}
		}
	}
	if !empty || len(lines) == 0 {
		lines = append(lines, line)
	}
	return lines
}

// wrapLines wraps each line that is too wide, its continuation indented
// two more than the line is.
func wrapLines(lines []string, width int) []string {
	var out []string
	for _, l := range lines {
		if lipgloss.Width(l) <= width {
			out = append(out, l)
			continue
		}
		plain := stripANSI(l)
		indent := strings.Repeat(" ", len(plain)-len(strings.TrimLeft(plain, " ")))
		out = append(out, wrapWords(plain, indent+"  ", width)...)
	}
	return out
}

// nodeState is a node's state as the table shows it: a switch says where
// it goes and how far it is.
func nodeState(n *Node) string {
	if n.Switch != nil {
		return fmt.Sprintf("to %s, %s", n.Switch.To, n.Switch.Phase)
	}
	return n.State
}

// shortState is nodeState in at most w cells: a switch as its role's
// letter and its phase's first word (→P offloading), else cut.
func shortState(n *Node, w int) string {
	s := nodeState(n)
	if len([]rune(s)) > w && n.Switch != nil && n.Switch.To != "" {
		phase := map[string]string{"draining": "drain", "handing over": "handover", "offloading": "offload", "flipping": "flip"}[n.Switch.Phase]
		s = "→" + strings.ToUpper(n.Switch.To[:1]) + " " + cmp.Or(phase, n.Switch.Phase)
	}
	return truncate(s, w)
}

// sortMark is the sort's mark on the head of column sort: ▲ smallest
// first, ▼ largest (role: prefill) first.
func (m *Model) sortMark(sort string) string {
	if sortNames[m.sortKey] != sort {
		return ""
	}
	if sort == "id" {
		return "▲"
	}
	return "▼"
}

// viewNodes is the nodes view in h lines: the summary, the table (its
// rows scrolled to keep the selection in sight), the selected node's
// details (enter), and as many recent events as fit below.
func (m *Model) viewNodes(h int) []string {
	out := strings.Split(m.summary(), "\n")
	ref := map[string]float64{}
	if m.kv != nil {
		for _, n := range m.kv.Nodes {
			ref[n.ID] = n.ReferencedShare
		}
	}
	nodes := m.sortedNodes()
	if f := m.filterLine(len(nodes), len(m.nodes), "nodes"); f != "" {
		out = append(out, wrapWords(f, "  ", m.width)...)
	}
	out = append(out, "")
	sel := m.selected()
	outdated := m.outdated()
	// The NODE and STATE columns are as wide as what they hold, and the
	// load sparkline takes what width is left: at 80 columns every
	// figure still shows, and rows keep their colour (a row cut to fit
	// loses it).
	idW, stW := lipgloss.Width("NODE▲"), len("STATE")
	for _, n := range nodes {
		idW, stW = max(idW, len([]rune(n.ID))), max(stW, len([]rune(nodeState(n))))
	}
	// A row is 64 cells and its two names. Where they do not fit, a
	// state takes its short form; then REF, HOST-KV and TOK/S go, in that
	// order, so that the name stays whole; last the name is cut.
	idW, stW = min(idW, 32), min(stW, 24)
	fixed := 64
	cols := map[string]bool{"ref": true, "host": true, "tok": true}
	if fixed+idW+stW > m.width {
		stW = min(stW, max(11, m.width-fixed-idW)) // →P handover
	}
	for _, c := range []struct {
		name string
		w    int
	}{{"ref", 6}, {"host", 8}, {"tok", 7}} {
		if fixed+idW+stW > m.width {
			cols[c.name], fixed = false, fixed-c.w
		}
	}
	stW = max(7, min(stW, m.width-fixed-idW))
	idW = max(4, min(idW, m.width-fixed-stW))
	loadW := min(60, m.width-(fixed+idW+stW)-2)
	opt := func(col, text string) string {
		if !cols[col] {
			return ""
		}
		return " " + text
	}
	head := fmt.Sprintf("  %s %s %-6s %-*s %s %6s%s %s%s%s", padRight("NODE"+m.sortMark("id"), idW), padRight("ROLE"+m.sortMark("role"), 10), "MODE", stW, "STATE",
		padLeft("QUEUE"+m.sortMark("queue"), 6), "RUN", opt("tok", fmt.Sprintf("%6s", "TOK/S")), padLeft("GPU-KV"+m.sortMark("gpu-kv"), 7), opt("host", "HOST-KV"), opt("ref", "  REF"))
	// One scale for every row, its peak in the head: a bar means the
	// same load on every node.
	peak, samples := 0.0, 0
	for _, n := range nodes {
		for _, v := range lastN(m.load[n.ID], loadW) {
			peak, samples = max(peak, v), samples+1
		}
	}
	if samples == 0 {
		loadW = 0 // nothing sampled yet (a snapshot): no column
	}
	if loadW >= 8 {
		head += "  " + truncate("LOAD ≤"+rate(peak), loadW)
	}
	out = append(out, head)
	// The rows that fit; the details (enter) get what is left, at least
	// a few lines.
	var detail []string
	if m.detail && sel != nil {
		detail = append([]string{""}, m.nodeDetail(sel)...)
	}
	rows := max(1, h-len(out))
	if len(detail) > 0 {
		rows = max(1, min(len(nodes), rows-min(len(detail), 5)))
	}
	if !m.report && len(nodes) > rows {
		rows = max(1, rows-1) // a line that says how many more
	}
	start := 0
	if m.cursor >= rows {
		start = m.cursor - rows + 1
	}
	end := min(len(nodes), start+rows)
	if m.report {
		start, end = 0, len(nodes)
	}
	for _, n := range nodes[start:end] {
		role := "D decode "
		rs := stDecode
		if n.Role == "prefill" {
			role, rs = "P prefill", stPrefill
		}
		mark := "  "
		if sel != nil && n.ID == sel.ID {
			mark = "› " // the selection is shown by more than reverse video
		}
		refText := "    -" // not reported (a simulation does not compute it)
		if r, ok := ref[n.ID]; ok {
			refText = fmt.Sprintf("%4.0f%%", r*100)
		}
		line := fmt.Sprintf("%s%-*s %s %-6s %-*s %6d %6d%s %6.0f%%%s%s", mark,
			idW, truncate(n.ID, idW), rs.Render(fmt.Sprintf("%-10s", role)), n.Mode, stW, shortState(n, stW), n.Waiting, n.Running,
			opt("tok", fmt.Sprintf("%6s", rate(n.TokensPerSec))), n.GPUKVUsage*100, opt("host", fmt.Sprintf("%6.0f%%", n.HostKVUsage*100)), opt("ref", refText))
		if loadW >= 8 {
			line += "  " + sparklineTo(lastN(m.load[n.ID], loadW), peak)
		}
		switch {
		case outdated:
			// Not the nodes' state now: the header says how old it is.
			line = stDim.Render(stripANSI(line))
		case n.State == "down":
			line = stBad.Render(line)
		}
		if sel != nil && n.ID == sel.ID {
			line = stSelected.Render(stripANSI(line))
		}
		out = append(out, line)
	}
	if len(nodes) == 0 {
		out = append(out, stDim.Render("  no nodes yet"))
	}
	if more := len(nodes) - end; !m.report && (start > 0 || more > 0) {
		out = append(out, stDim.Render(fmt.Sprintf("  rows %d-%d of %d (j/k moves, PgUp/PgDn pages)", start+1, end, len(nodes))))
	}
	if len(detail) > 0 {
		out = append(out, detail[:min(len(detail), max(0, h-len(out)))]...)
	}
	// The room left shows the latest events: at 200x50 a screen, not a
	// table and forty blank lines.
	if left := h - len(out) - 2; !m.report && left >= 3 {
		out = append(out, "", stTitle.Render("recent events")+stDim.Render("  (4: all of them)"))
		out = append(out, m.eventLines(m.filteredEvents(), 0, left)...)
	}
	return out
}

// nodeDetail is the selected node's pane: its address, why it is as it
// is, its role history and the branches whose KV it holds.
func (m *Model) nodeDetail(sel *Node) []string {
	out := []string{strings.TrimSpace(stTitle.Render("node "+sel.ID) + "  " + sel.Address)}
	if sel.Reason != "" {
		out = append(out, wrapWords("  why: "+sel.Reason, "       ", m.width)...)
	}
	out = append(out, "  role history (newest first):")
	for i := len(sel.History) - 1; i >= 0 && i >= len(sel.History)-5; i-- {
		h := sel.History[i]
		out = append(out, wrapWords(fmt.Sprintf("    %s  %s -> %s  %s", h.Time.Local().Format("15:04:05"), h.From, h.To, h.Reason), strings.Repeat(" ", 14), m.width)...)
	}
	if len(sel.History) == 0 {
		out = append(out, "    none")
	}
	out = append(out, "  KV by branch:")
	shown := 0
	for _, br := range m.branches {
		for _, r := range br.Residency {
			if r.Node == sel.ID && shown < 5 {
				out = append(out, fmt.Sprintf("    %-30s %-8s %5d GPU %5d host blocks", truncate(br.Session+"/"+br.Branch, 30), br.State, r.GPU, r.Host))
				shown++
			}
		}
	}
	if shown == 0 {
		out = append(out, "    none known")
	}
	return out
}

// section is a part of the planner view; where the screen is short, those
// of the highest drop go first.
type section struct {
	lines []string
	short []string // what stays of it when dropped (nil: nothing)
	drop  int      // 0: always shown
}

// viewPlanner is the planner view in h lines: its state, costs, demand,
// split and predictions, then its decisions, newest first, in the lines
// left (j/k scrolls them); on a short screen the least needed parts go
// so that decisions still show.
func (m *Model) viewPlanner(h int) []string {
	if m.planner == nil {
		if m.plannerErr != "" {
			return wrapWords("planner: "+m.plannerErr, "  ", m.width)
		}
		return []string{"planner: waiting for its first status"}
	}
	secs := m.plannerSections()
	decisions, firsts := m.decisionLines()
	need := func() int {
		n := 2 + firsts // a blank, the head, the first three decisions
		for _, s := range secs {
			n += len(s.lines)
		}
		return n
	}
	for drop := 5; drop > 0 && need() > h; drop-- {
		for i := range secs {
			if secs[i].drop == drop {
				secs[i].lines = secs[i].short
			}
		}
	}
	var out []string
	for _, s := range secs {
		out = append(out, s.lines...)
	}
	out = append(out, "")
	left := h - len(out) - 1
	if m.report {
		out = append(out, "decisions (newest first)")
		return append(out, decisions...)
	}
	first := min(m.scroll[ViewPlanner], max(0, len(decisions)-left))
	m.scroll[ViewPlanner] = first
	shown := decisions[first:min(len(decisions), first+max(0, left))]
	head := "decisions (newest first)"
	if first > 0 || first+len(shown) < len(decisions) {
		head += stDim.Render(fmt.Sprintf("  lines %d-%d of %d (j/k scrolls)", first+1, first+len(shown), len(decisions)))
	}
	return append(append(out, head), shown...)
}

// plannerSections are the planner view's parts above its decisions.
func (m *Model) plannerSections() []section {
	p := m.planner
	ind := strings.Repeat(" ", 14)
	mode := "moves auto nodes"
	if !p.Enabled {
		mode = "recommends only"
	}
	top := []string{stTitle.Render("planner: "+p.State) + " (" + mode + ")"}
	top = append(top, wrapWords("  "+p.Reason, "  ", m.width)...)
	if x := p.Speedup; x > 0 && x != 1 {
		// Simulated engines at --speedup: the planner learned their
		// passes in wall time, and so predicts.
		top = append(top, wrapWords(fmt.Sprintf("  wall clock: engines run %gx, so modelled costs and times are %gx those below", x, x), "  ", m.width)...)
	}
	secs := []section{{lines: append(top, "")}}
	for _, f := range []struct {
		name string
		fit  Fit
	}{{"prefill cost", p.PrefillFit}, {"decode cost", p.DecodeFit}} {
		var parts []string
		for _, c := range f.fit.Coefs {
			parts = append(parts, coefText(c))
		}
		conf := "trusted"
		if !f.fit.Ready {
			conf = f.fit.Note
		}
		fit := counted(f.fit.Samples, "pass") + ", " + conf
		if f.fit.Samples > 0 {
			// No passes, no error to speak of.
			fit = fmt.Sprintf("%s, ±%s, %s", counted(f.fit.Samples, "pass"), percent(f.fit.RelErr), conf)
		}
		if len(parts) == 0 {
			// Nothing learned yet: one line, not an empty one above it.
			secs = append(secs, section{lines: []string{fmt.Sprintf("%-13s %s", f.name, fit)}})
			continue
		}
		coefs := strings.Split(fmt.Sprintf("%-13s %s", f.name, wrapJoin(parts, ", ", ",", ind, m.width)), "\n")
		// Short of lines, the fit's figures stay, under its name.
		secs = append(secs, section{lines: append(coefs, fmt.Sprintf("%-13s %s", "", fit)), short: []string{fmt.Sprintf("%-13s %s", f.name, fit)}, drop: 2})
	}
	trend := "steady"
	if p.Long.Requests > 0 {
		switch r := p.Short.Requests / p.Long.Requests; {
		case r > 1.2:
			trend = "rising"
		case r < 0.8:
			trend = "falling"
		}
	}
	secs = append(secs, section{lines: append([]string{""}, wrapWords(fmt.Sprintf("demand        %.2f req/s arriving now (%s), %.0f prefill tok/s, %.0f output tok/s", p.Short.Requests, trend, p.Short.PrefillTok, p.Short.OutputTok), ind, m.width)...)})
	var sub []string
	if p.Short.HiddenTok > 0.05*p.Short.PrefillTok { // worth an operator's attention
		sub = append(sub, wrapWords(fmt.Sprintf("%sof which %.0f prefill tok/s not seen in arrivals (%.0f requests queued on prefill nodes)", ind, p.Short.HiddenTok, p.Short.PrefillQueue), ind, m.width)...)
	}
	if p.Short.LocalTok >= 0.5 {
		// Without it output-heavy traffic, whose prompts skip the prefill
		// nodes, reads as next to no prefill at all.
		sub = append(sub, wrapWords(fmt.Sprintf("%sand %.0f prefill tok/s on decode nodes (uncached parts too short for a prefill node)", ind, p.Short.LocalTok), ind, m.width)...)
	}
	secs = append(secs, section{lines: sub, drop: 1})
	split := []string{fmt.Sprintf("%d prefill : %d decode", p.Prefill, p.Decode)}
	if p.Recommend >= 0 && p.Recommend != p.Prefill {
		split = append(split, fmt.Sprintf(" ->  recommended %d : %d,", p.Recommend, p.Prefill+p.Decode-p.Recommend),
			fmt.Sprintf("held %.0fs, acts in %.0fs;", p.HeldSec, p.ActsInSec), fmt.Sprintf("gain %.0f vs cost %.0f request-s", p.GainSec, p.CostSec))
	}
	secs = append(secs, section{lines: strings.Split("split         "+wrapJoin(split, " ", "", ind, m.width), "\n")})
	pred := func(x Pred) string {
		if x.Saturated {
			return fmt.Sprintf("%d:%d overloaded", x.Prefill, x.Decode)
		}
		return fmt.Sprintf("%d:%d  TTFT %s  ITL %s  E2E %s", x.Prefill, x.Decode, seconds(x.TTFT), seconds(x.ITL), seconds(x.E2E))
	}
	if p.Current.Prefill+p.Current.Decode > 0 {
		secs = append(secs, section{lines: []string{"predicted     now  " + pred(p.Current), ind + "best " + pred(p.Best)}})
	}
	if l := p.Limits; l.MaxBatchedTokens > 0 {
		// rate's compact figures serve counts as well (12.0M KV tokens).
		text := fmt.Sprintf("engine limits %d tokens a pass, no sequence limit known", l.MaxBatchedTokens)
		if l.MaxSeqs > 0 {
			text = fmt.Sprintf("engine limits %d tokens a pass, %d sequences", l.MaxBatchedTokens, l.MaxSeqs)
		}
		if l.GPUKVTokens > 0 {
			text += ", " + rate(float64(l.GPUKVTokens)) + " KV tokens"
		}
		secs = append(secs, section{lines: wrapWords(text, ind, m.width), drop: 4})
	}
	var avoided []string
	for i, a := range p.Avoided {
		label := "avoiding"
		if i > 0 {
			label = ""
		}
		avoided = append(avoided, wrapWords(fmt.Sprintf("%-14s%s", label, a), ind, m.width)...)
	}
	secs = append(secs, section{lines: avoided, drop: 3})
	if len(m.splits) > 0 && !m.report {
		fs := make([]float64, len(m.splits))
		for i, v := range m.splits {
			fs[i] = float64(v)
		}
		secs = append(secs, section{lines: []string{"",
			fmt.Sprintf("prefill nodes %s  0-%d, last %d samples", sparklineTo(fs, float64(p.Prefill+p.Decode)), p.Prefill+p.Decode, len(fs)),
			fmt.Sprintf("pred. TTFT    %s", scaledSparkline(m.ttftPred, 40, seconds))}, drop: 5})
	}
	return secs
}

// decisionLines are the planner's decisions, newest first, each wrapped
// under its time, and how many lines the first three take.
func (m *Model) decisionLines() (lines []string, firsts int) {
	p := m.planner
	for i := len(p.Decisions) - 1; i >= 0 && (!m.report || i >= len(p.Decisions)-8); i-- {
		d := p.Decisions[i]
		lines = append(lines, wrapWords("  "+d.Time.Local().Format("15:04:05")+" "+decisionText(d), "    ", m.width)...)
		if len(p.Decisions)-i <= 3 {
			firsts = len(lines)
		}
	}
	if len(p.Decisions) == 0 {
		lines, firsts = []string{"  none yet"}, 1
	}
	return lines, firsts
}

// decisionText is a decision as a line of text: what it did, to which
// nodes, and why.
func decisionText(d Decision) string {
	var moves []string
	for _, mv := range d.Moves {
		moves = append(moves, mv.Node+"->"+mv.To)
	}
	head := d.Action
	if len(moves) > 0 {
		head += " " + strings.Join(moves, ",")
	}
	return head + ": " + d.Reason
}

// TreePrefix draws each branch's place in its session's tree: ├ for a
// branch with a sibling after it, └ for the last, │ down the levels whose
// branches go on below.
func TreePrefix(depth []int) []string {
	out := make([]string, len(depth))
	last := make([]bool, len(depth))
	for i, d := range depth {
		last[i] = true
		for j := i + 1; j < len(depth) && depth[j] >= d && depth[j] > 0; j++ {
			if depth[j] == d {
				last[i] = false
				break
			}
		}
	}
	var ancestors []int // the branch at each level above, as the walk goes
	for i, d := range depth {
		ancestors = append(ancestors[:min(d, len(ancestors))], i)
		if d == 0 {
			continue
		}
		var b strings.Builder
		for k := 1; k < d; k++ {
			if last[ancestors[k]] {
				b.WriteString("  ")
			} else {
				b.WriteString("│ ")
			}
		}
		if last[i] {
			b.WriteString("└ ")
		} else {
			b.WriteString("├ ")
		}
		out[i] = b.String()
	}
	return out
}

// viewBranches is the branches view in h lines: the session trees, their
// rows scrolled to keep the selection in sight, and under the selected
// one, when opened (enter), every node that holds its blocks.
func (m *Model) viewBranches(h int) []string {
	bs, depth := m.treeBranches()
	sel := m.selectedBranch()
	live := 0
	for _, br := range bs {
		if br.State != "ended" {
			live++
		}
	}
	title := fmt.Sprintf("%d branches (%d live)", len(bs), live)
	if m.follow != "" {
		title += "  following " + m.follow
	}
	out := wrapWords(title, "  ", m.width)
	if f := m.filterLine(len(bs), len(m.branches), "branches"); f != "" {
		out = append(out, wrapWords(f, "  ", m.width)...)
	}
	out = append(out, "")
	prefix := TreePrefix(depth)
	names := make([]string, len(bs))
	nameW := len("SESSION / BRANCH")
	for i, br := range bs {
		names[i] = prefix[i] + br.Branch
		if depth[i] == 0 {
			names[i] = br.Session + " / " + br.Branch
		}
		nameW = max(nameW, len([]rune(names[i])))
	}
	nameW = min(nameW, 36)
	whereW := m.width - nameW - 26
	out = append(out, fmt.Sprintf("  %-*s %-8s %6s %5s  %s", nameW, "SESSION / BRANCH", "STATE", "BLOCKS", "TURNS", truncate("WHERE (node GPU/host; enter: all)", whereW)))
	var open []string // the selected branch's holders, one a line
	if sel != nil && m.expanded == sel.Session+"/"+sel.Branch {
		for _, r := range sel.Residency {
			open = append(open, fmt.Sprintf("  %*s%s %d GPU, %d host blocks", nameW+26, "", r.Node, r.GPU, r.Host))
		}
		if len(open) == 0 {
			open = []string{fmt.Sprintf("  %*sno node holds its blocks", nameW+26, "")}
		}
	}
	rows := max(1, h-len(out)-len(open))
	if !m.report && len(bs) > rows {
		rows = max(1, rows-1)
	}
	start := 0
	if m.branchCursor >= rows {
		start = m.branchCursor - rows + 1
	}
	end := min(len(bs), start+rows)
	for i := start; i < end; i++ {
		br := bs[i]
		isSel := sel != nil && br.Session == sel.Session && br.Branch == sel.Branch
		mark := "  "
		if isSel {
			mark = "› "
		}
		where := fitWhere(br, whereW)
		if isSel && len(open) > 0 {
			where = fmt.Sprintf("%d nodes:", len(br.Residency))
		}
		line := fmt.Sprintf("%s%-*s %-8s %6d %5d  %s", mark, nameW, truncate(names[i], nameW), br.State, br.Blocks, br.Turns, where)
		if br.State == "ended" {
			line = stDim.Render(line)
		}
		if isSel {
			line = stSelected.Render(stripANSI(line))
		}
		out = append(out, line)
		if isSel {
			out = append(out, open...)
		}
	}
	if len(bs) == 0 {
		for _, l := range wrapWords("  no agent branches: agents name them with X-Evolve-Session and X-Evolve-Branch", "  ", m.width) {
			out = append(out, stDim.Render(l))
		}
	}
	if !m.report && (start > 0 || end < len(bs)) {
		out = append(out, stDim.Render(fmt.Sprintf("  rows %d-%d of %d (j/k moves)", start+1, end, len(bs))))
	}
	return out
}

// filteredEvents are the events the filter keeps.
func (m *Model) filteredEvents() []Event {
	if m.filter == "" {
		return m.events
	}
	var out []Event
	for _, e := range m.events {
		if strings.Contains(e.Kind+" "+e.Text, m.filter) {
			out = append(out, e)
		}
	}
	return out
}

// eventLines draws events from line first on, in at most n lines: the
// time and kind, the text wrapped under itself.
func (m *Model) eventLines(events []Event, first, n int) []string {
	var out []string
	for _, e := range events {
		lines := wrapWords(fmt.Sprintf("%s  %-7s %s", e.Time.Local().Format("15:04:05"), e.Kind, e.Text), strings.Repeat(" ", 18), m.width)
		out = append(out, lines...)
		if len(out) >= first+n {
			break
		}
	}
	if len(events) == 0 {
		return []string{stDim.Render("  none yet")}
	}
	out = out[min(first, len(out)):]
	return out[:min(n, len(out))]
}

// historyNote says where the events' history comes from, and from when.
func (m *Model) historyNote() string {
	switch {
	case m.historyKnown:
		return "from the orchestrator's record, complete since " + m.historySince.Local().Format("15:04:05") + "; evictions and errors since this watch began"
	case !m.watchStart.IsZero():
		return "history before " + m.watchStart.Local().Format("15:04:05") + ", when this watch began, is not shown: the server keeps no record of it"
	}
	return "waiting for the watch stream"
}

// viewEvents is the events view in h lines, newest first; j/k scrolls.
func (m *Model) viewEvents(h int) []string {
	events := m.filteredEvents()
	out := wrapWords("events, newest first: "+m.historyNote(), "  ", m.width)
	if f := m.filterLine(len(events), len(m.events), "events"); f != "" {
		out = append(out, wrapWords(f, "  ", m.width)...)
	}
	out = append(out, "")
	all := m.eventLines(events, 0, 1<<30)
	left := max(1, h-len(out))
	if len(all) > left {
		left-- // a line that says where the screen is
	}
	first := min(m.scroll[ViewEvents], max(0, len(all)-left))
	m.scroll[ViewEvents] = first
	out = append(out, all[first:min(len(all), first+left)]...)
	if len(all) > left {
		out = append(out, stDim.Render(fmt.Sprintf("  lines %d-%d of %d (j/k scrolls, g/G the ends)", first+1, min(len(all), first+left), len(all))))
	}
	return out
}

// lastN is the last n values of v.
func lastN(v []float64, n int) []float64 {
	if n < 0 {
		return nil
	}
	return v[max(0, len(v)-n):]
}

// padRight and padLeft pad s to n cells (the sort marks are one cell,
// more bytes).
func padRight(s string, n int) string { return s + strings.Repeat(" ", max(0, n-lipgloss.Width(s))) }
func padLeft(s string, n int) string  { return strings.Repeat(" ", max(0, n-lipgloss.Width(s))) + s }

// counted is n and the noun, plural unless n is 1.
func counted(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	if strings.HasSuffix(noun, "s") {
		return fmt.Sprintf("%d %ses", n, noun)
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// percent is a share as people read it: 0.3%, 12%, <0.1%.
func percent(x float64) string {
	switch p := x * 100; {
	case p < 0.1:
		return "<0.1%"
	case p < 10:
		return fmt.Sprintf("%.1f%%", p)
	default:
		return fmt.Sprintf("%.0f%%", p)
	}
}

// seconds is a duration in seconds as people read it: 1.4ms, 0.21s, 8.1s.
func seconds(s float64) string {
	switch {
	case s <= 0:
		return "0s"
	case s < 0.001:
		return fmt.Sprintf("%.0fµs", s*1e6)
	case s < 0.1:
		return fmt.Sprintf("%.1fms", s*1e3)
	case s < 1:
		return fmt.Sprintf("%.2fs", s)
	default:
		return fmt.Sprintf("%.1fs", s)
	}
}

var sparkChars = []rune("▁▂▃▄▅▆▇█")

// sparklineTo draws v on a scale from 0 to hi: one scale for rows that
// are compared.
func sparklineTo(v []float64, hi float64) string {
	var b strings.Builder
	for _, x := range v {
		i := 0
		if hi > 0 {
			i = int(x / hi * float64(len(sparkChars)-1))
		}
		b.WriteRune(sparkChars[min(max(i, 0), len(sparkChars)-1)])
	}
	return b.String()
}

// scaledSparkline draws the last n values of v scaled to their peak, and
// says the peak (as format writes it): a bar is then a figure.
func scaledSparkline(v []float64, n int, format func(float64) string) string {
	v = lastN(v, n)
	hi := 0.0
	for _, x := range v {
		hi = max(hi, x)
	}
	return sparklineTo(v, hi) + " ≤" + format(hi)
}

func truncate(s string, n int) string {
	if n < 1 {
		return ""
	}
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	if n == 1 {
		return "…"
	}
	return string(r[:n-1]) + "…"
}

// stripANSI removes colour codes, so that a selected row can be drawn
// reversed as a whole.
func stripANSI(s string) string {
	var b strings.Builder
	in := false
	for _, r := range s {
		switch {
		case r == '\x1b':
			in = true
		case in && (r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z'):
			in = false
		case !in:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// fmtDur shows seconds as 1h02m03s, 4m05s or 6s.
func fmtDur(sec float64) string {
	t := int(sec)
	switch h, mi, se := t/3600, t/60%60, t%60; {
	case h > 0:
		return fmt.Sprintf("%dh%02dm%02ds", h, mi, se)
	case mi > 0:
		return fmt.Sprintf("%dm%02ds", mi, se)
	default:
		return fmt.Sprintf("%ds", se)
	}
}

// rate shows a per-second figure in at most six characters: 950, 12.3k, 1.2M.
func rate(v float64) string {
	switch {
	case v < 1000:
		return fmt.Sprintf("%.0f", v)
	case v < 1e6:
		return fmt.Sprintf("%.1fk", v/1e3)
	default:
		return fmt.Sprintf("%.1fM", v/1e6)
	}
}

// coefText is a learned coefficient and its standard error, the error as a
// share of the value ("per_token_us 6.5 ±0.2%") so that a tiny error reads
// at a glance instead of as 6.8e-07; in absolute terms when the value is 0
// or the error is as large as it (a term the passes have not yet exercised,
// "per_block_us -0.161 ±0.53", not "±3.3e+02%"). Figures too small for
// their unit move to a smaller one ("per_context_token_ps 0.0094 ±0.75",
// not "per_context_token_ns 9.41e-06 ±0.00075"): never an exponent.
func coefText(c Coef) string {
	name, val, se := c.Name, c.Value, c.StdErr
	units := []string{"_s", "_ms", "_us", "_ns", "_ps", "_fs"}
	for i, u := range units[:len(units)-1] {
		if !strings.HasSuffix(name, u) {
			continue
		}
		for j := i + 1; j < len(units) && max(math.Abs(val), se) > 0 && max(math.Abs(val), se) < 0.01; j++ {
			name, val, se = strings.TrimSuffix(name, units[j-1])+units[j], val*1000, se*1000
		}
		break
	}
	v := math.Abs(val)
	switch rel := 100 * se / v; {
	case v == 0 || rel >= 100 || math.IsNaN(rel):
		return fmt.Sprintf("%s %s ±%s", name, plainNum(val, 3), plainNum(se, 2))
	case rel < 0.1:
		return fmt.Sprintf("%s %s ±<0.1%%", name, plainNum(val, 3))
	default:
		return fmt.Sprintf("%s %s ±%s%%", name, plainNum(val, 3), plainNum(rel, 2))
	}
}

// plainNum writes x to digits significant figures without an exponent:
// 0.00941, 520, 6.5; what would need one below 0.0001 is "≈0".
func plainNum(x float64, digits int) string {
	switch a := math.Abs(x); {
	case x == 0:
		return "0"
	case a < 1e-4:
		return "≈0"
	case a >= math.Pow(10, float64(digits)):
		return fmt.Sprintf("%.0f", x)
	}
	return strconv.FormatFloat(x, 'g', digits, 64)
}
