package tui

import (
	"fmt"
	"math"
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

// View renders the screen.
func (m *Model) View() string {
	if m.width < m.narrowest() || m.height < minHeight {
		return fmt.Sprintf("terminal too small: evolve top needs %dx%d, this one is %dx%d\n(q quits)", minWidth, minHeight, m.width, m.height)
	}
	if m.paused && m.frozen != "" {
		return m.frozen
	}
	var body string
	switch {
	case m.help:
		body = helpText
	case m.view == ViewPlanner:
		body = m.viewPlanner()
	case m.view == ViewBranches:
		body = m.viewBranches()
	case m.view == ViewEvents:
		body = m.viewEvents()
	default:
		body = m.viewNodes()
	}
	out := m.header() + "\n" + body
	lines := strings.Split(out, "\n")
	for i, l := range lines {
		if lipgloss.Width(l) > m.width {
			lines[i] = truncate(stripANSI(l), m.width)
		}
	}
	if max := m.height - 1; len(lines) > max {
		lines = lines[:max]
	}
	for len(lines) < m.height-1 {
		lines = append(lines, "")
	}
	foot := m.footer()
	if lipgloss.Width(foot) > m.width {
		foot = truncate(stripANSI(foot), m.width)
	}
	return strings.Join(lines, "\n") + "\n" + foot
}

const helpText = `Keys
  1 nodes   2 planner   3 branches   4 events
  j/k or arrows   move          enter   details of the selected node
  /               filter (esc clears)   s   sort the nodes (id, role, queue, gpu-kv)
  :               command: nodes, planner, branches, events, role NODE prefill|decode,
                  auto NODE, quit (a switch asks first, as p, d and a do)
  p / d           switch the selected node to prefill / decode and pin it (asks first)
  a               hand the selected node back to the planner (asks first)
  f               follow the selected branch (branches view)
  Z               pause the screen  q   quit   ?   this help

Roles show as a letter and a word (P prefill, D decode); states and modes
are words: nothing is said by colour alone. NO_COLOR turns colour off.
(any key closes this help)`

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

func (m *Model) footer() string {
	switch {
	case m.confirm != nil:
		return stBad.Render(m.confirm.text)
	case m.filtering:
		return "filter: " + m.filter + "_  (enter keeps it, esc clears it)"
	case m.commanding:
		return ":" + m.command + "_  (" + commandHelp + ")"
	case m.message != "":
		return m.message
	}
	return stDim.Render("? help  q quit  1-4 views  p/d/a switch  / filter  : command  s sort  Z pause")
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
		segs = append(segs, fmt.Sprintf("%.1f req/s %s", m.reqRate[len(m.reqRate)-1], sparkline(m.reqRate, 12)))
	}
	if m.planner != nil && m.planner.Current.Prefill+m.planner.Current.Decode > 0 {
		segs = append(segs, fmt.Sprintf("predicted TTFT %.2fs, E2E %.1fs", m.planner.Current.TTFT, m.planner.Current.E2E))
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
		measured = append(measured, fmt.Sprintf("last %s: %d req (%.1f/s), TTFT P50 %.2fs P95 %.2fs, E2E P50 %.1fs",
			fmtDur(r.WindowSec), r.Requests, r.RequestsSec, r.TTFTP50, r.TTFTP95, r.E2EP50))
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
	return s
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

// nodeState is a node's state as the table shows it: a switch says where
// it goes and how far it is.
func nodeState(n *Node) string {
	if n.Switch != nil {
		return fmt.Sprintf("to %s, %s", n.Switch.To, n.Switch.Phase)
	}
	return n.State
}

func (m *Model) viewNodes() string {
	var b strings.Builder
	b.WriteString(m.summary() + "\n\n")
	ref := map[string]float64{}
	if m.kv != nil {
		for _, n := range m.kv.Nodes {
			ref[n.ID] = n.ReferencedShare
		}
	}
	nodes := m.sortedNodes()
	sel := m.selected()
	outdated := m.outdated()
	// The NODE and STATE columns are as wide as what they hold, and the
	// load sparkline takes what width is left: at 80 columns every
	// figure still shows, and rows keep their colour (a row cut to fit
	// loses it).
	idW, stW := len("NODE"), len("STATE")
	for _, n := range nodes {
		idW, stW = max(idW, len([]rune(n.ID))), max(stW, len([]rune(nodeState(n))))
	}
	idW, stW = min(idW, 16), min(stW, 24)
	loadW := min(12, m.width-(64+idW+stW)-2)
	head := fmt.Sprintf("  %-*s %-10s %-6s %-*s %6s %6s %6s %7s %7s %5s", idW, "NODE", "ROLE", "MODE", stW, "STATE", "QUEUE", "RUN", "TOK/S", "GPU-KV", "HOST-KV", "REF")
	if loadW >= 4 {
		head += "  LOAD"
	}
	b.WriteString(head + "\n")
	for _, n := range nodes {
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
		line := fmt.Sprintf("%s%-*s %s %-6s %-*s %6d %6d %6s %6.0f%% %6.0f%% %s", mark,
			idW, truncate(n.ID, idW), rs.Render(fmt.Sprintf("%-10s", role)), n.Mode, stW, truncate(nodeState(n), stW), n.Waiting, n.Running,
			rate(n.TokensPerSec), n.GPUKVUsage*100, n.HostKVUsage*100, refText)
		if loadW >= 4 {
			line += "  " + sparkline(m.load[n.ID], loadW)
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
		b.WriteString(line + "\n")
	}
	if len(nodes) == 0 {
		b.WriteString(stDim.Render("  no nodes yet") + "\n")
	}
	if m.detail && sel != nil {
		b.WriteString("\n" + stTitle.Render("node "+sel.ID) + "  " + sel.Address + "\n")
		if sel.Reason != "" {
			b.WriteString("  why: " + sel.Reason + "\n")
		}
		b.WriteString("  role history (newest first):\n")
		for i := len(sel.History) - 1; i >= 0 && i >= len(sel.History)-5; i-- {
			h := sel.History[i]
			fmt.Fprintf(&b, "    %s  %s -> %s  %s\n", h.Time.Local().Format("15:04:05"), h.From, h.To, truncate(h.Reason, m.width-40))
		}
		if len(sel.History) == 0 {
			b.WriteString("    none\n")
		}
		b.WriteString("  KV by branch:\n")
		shown := 0
		for _, br := range m.branches {
			for _, r := range br.Residency {
				if r.Node == sel.ID && shown < 5 {
					fmt.Fprintf(&b, "    %-30s %-8s %5d GPU %5d host blocks\n", truncate(br.Session+"/"+br.Branch, 30), br.State, r.GPU, r.Host)
					shown++
				}
			}
		}
		if shown == 0 {
			b.WriteString("    none known\n")
		}
	}
	return b.String()
}

func (m *Model) viewPlanner() string {
	var b strings.Builder
	if m.planner == nil {
		if m.plannerErr != "" {
			return "planner: " + m.plannerErr + "\n"
		}
		return "planner: waiting for its first status\n"
	}
	p := m.planner
	mode := "moves auto nodes"
	if !p.Enabled {
		mode = "recommends only"
	}
	fmt.Fprintf(&b, "%s (%s)\n  %s\n", stTitle.Render("planner: "+p.State), mode, m.fitText(p.Reason, "  ", m.width))
	if x := p.Speedup; x > 0 && x != 1 {
		// Simulated engines at --speedup: the planner learned their
		// passes in wall time, and so predicts.
		fmt.Fprintf(&b, "  %s\n", m.fitText(fmt.Sprintf("wall clock: engines run %gx, so modelled costs and times are %gx those below", x, x), "  ", m.width))
	}
	b.WriteString("\n")
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
		fit := fmt.Sprintf("%d passes, %s", f.fit.Samples, conf)
		if f.fit.Samples > 0 {
			// No passes, no error to speak of.
			fit = fmt.Sprintf("%d passes, ±%.1f%%, %s", f.fit.Samples, f.fit.RelErr*100, conf)
		}
		if len(parts) == 0 {
			// Nothing learned yet: one line, not an empty one above it.
			fmt.Fprintf(&b, "%-13s %s\n", f.name, fit)
			continue
		}
		fmt.Fprintf(&b, "%-13s %s\n%-13s %s\n", f.name, wrapJoin(parts, ", ", ",", strings.Repeat(" ", 14), m.width), "", fit)
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
	fmt.Fprintf(&b, "\ndemand        %.2f req/s now (%s), %.0f prefill tok/s, %.0f output tok/s\n", p.Short.Requests, trend, p.Short.PrefillTok, p.Short.OutputTok)
	if p.Short.HiddenTok > 0.05*p.Short.PrefillTok { // worth an operator's attention
		b.WriteString(strings.Repeat(" ", 14) + wrapJoin([]string{fmt.Sprintf("of which %.0f prefill tok/s not seen in arrivals", p.Short.HiddenTok),
			fmt.Sprintf("(%.0f requests queued on prefill nodes)", p.Short.PrefillQueue)}, " ", "", strings.Repeat(" ", 14), m.width) + "\n")
	}
	if p.Short.LocalTok >= 0.5 {
		// Without it output-heavy traffic, whose prompts skip the prefill
		// nodes, reads as next to no prefill at all.
		b.WriteString(strings.Repeat(" ", 14) + wrapJoin([]string{fmt.Sprintf("and %.0f prefill tok/s on decode nodes", p.Short.LocalTok),
			"(uncached parts too short for a prefill node)"}, " ", "", strings.Repeat(" ", 14), m.width) + "\n")
	}
	split := []string{fmt.Sprintf("%d prefill : %d decode", p.Prefill, p.Decode)}
	if p.Recommend >= 0 && p.Recommend != p.Prefill {
		split = append(split, fmt.Sprintf(" ->  recommended %d : %d,", p.Recommend, p.Prefill+p.Decode-p.Recommend),
			fmt.Sprintf("held %.0fs, acts in %.0fs;", p.HeldSec, p.ActsInSec), fmt.Sprintf("gain %.0f vs cost %.0f request-s", p.GainSec, p.CostSec))
	}
	fmt.Fprintf(&b, "split         %s\n", wrapJoin(split, " ", "", strings.Repeat(" ", 14), m.width))
	pred := func(x Pred) string {
		if x.Saturated {
			return fmt.Sprintf("%d:%d overloaded", x.Prefill, x.Decode)
		}
		return fmt.Sprintf("%d:%d  TTFT %.3fs  ITL %.1fms  E2E %.2fs", x.Prefill, x.Decode, x.TTFT, x.ITL*1e3, x.E2E)
	}
	if p.Current.Prefill+p.Current.Decode > 0 {
		fmt.Fprintf(&b, "predicted     now  %s\n              best %s\n", pred(p.Current), pred(p.Best))
	}
	if l := p.Limits; l.MaxBatchedTokens > 0 {
		// rate's compact figures serve counts as well (12.0M KV tokens).
		parts := []string{fmt.Sprintf("%d tokens a pass,", l.MaxBatchedTokens), "no sequence limit known"}
		if l.MaxSeqs > 0 {
			parts[1] = fmt.Sprintf("%d sequences", l.MaxSeqs)
		}
		if l.GPUKVTokens > 0 {
			parts[1] += ","
			parts = append(parts, rate(float64(l.GPUKVTokens))+" KV tokens")
		}
		fmt.Fprintf(&b, "engine limits %s\n", wrapJoin(parts, " ", "", strings.Repeat(" ", 14), m.width))
	}
	for i, a := range p.Avoided {
		label := "avoiding"
		if i > 0 {
			label = ""
		}
		fmt.Fprintf(&b, "%-14s%s\n", label, m.fitText(a, strings.Repeat(" ", 14), m.width))
	}
	if len(m.splits) > 0 {
		fs := make([]float64, len(m.splits))
		for i, v := range m.splits {
			fs[i] = float64(v)
		}
		fmt.Fprintf(&b, "\nprefill nodes %s  (last %d samples)\n", sparkline(fs, 40), len(fs))
		fmt.Fprintf(&b, "pred. TTFT    %s\n", sparkline(m.ttftPred, 40))
	}
	b.WriteString("\ndecisions (newest first)\n")
	for i := len(p.Decisions) - 1; i >= 0 && i >= len(p.Decisions)-8; i-- {
		d := p.Decisions[i]
		var moves []string
		for _, mv := range d.Moves {
			moves = append(moves, mv.Node+"->"+mv.To)
		}
		head := fmt.Sprintf("  %s %s %s: ", d.Time.Local().Format("15:04:05"), d.Action, strings.Join(moves, ","))
		if m.wrap {
			// Continuation lines indent under the time.
			fmt.Fprintf(&b, "  %s\n", wrapJoin(append([]string{strings.TrimSpace(head)}, strings.Fields(d.Reason)...), " ", "", "    ", m.width))
		} else {
			fmt.Fprintf(&b, "%s%s\n", head, truncate(d.Reason, m.width-lipgloss.Width(head)))
		}
	}
	if len(p.Decisions) == 0 {
		b.WriteString("  none yet\n")
	}
	return b.String()
}

func (m *Model) viewBranches() string {
	var b strings.Builder
	bs, depth := m.treeBranches()
	sel := m.selectedBranch()
	live := 0
	for _, br := range bs {
		if br.State != "ended" {
			live++
		}
	}
	fmt.Fprintf(&b, "%d branches (%d live)", len(bs), live)
	if m.follow != "" {
		b.WriteString("  following " + m.follow)
	}
	b.WriteString("\n\n")
	// Keep the selection in sight.
	rows := m.height - 8
	start := 0
	if m.branchCursor >= rows {
		start = m.branchCursor - rows + 1
	}
	end := min(len(bs), start+rows)
	// Names as the tree shows them; their column is as wide as the
	// widest shown, so that WHERE keeps the rest of the line.
	names := make([]string, end-start)
	nameW := len("SESSION / BRANCH")
	for i := start; i < end; i++ {
		br := bs[i]
		name := strings.Repeat("  ", depth[i]) + "└ " + br.Branch
		if depth[i] == 0 && (i == start || bs[i-1].Session != br.Session) {
			name = br.Session + " / " + br.Branch
		}
		names[i-start] = name
		nameW = max(nameW, len([]rune(name)))
	}
	nameW = min(nameW, 36)
	fmt.Fprintf(&b, "  %-*s %-8s %6s %5s  %s\n", nameW, "SESSION / BRANCH", "STATE", "BLOCKS", "TURNS", "WHERE (node GPU/host blocks)")
	for i := start; i < end; i++ {
		br := bs[i]
		name := names[i-start]
		mark := "  "
		if sel != nil && br.Session == sel.Session && br.Branch == sel.Branch {
			mark = "› "
		}
		line := fmt.Sprintf("%s%-*s %-8s %6d %5d  %s", mark, nameW, truncate(name, nameW), br.State, br.Blocks, br.Turns, fitWhere(br, m.width-nameW-26))
		if br.State == "ended" {
			line = stDim.Render(line)
		}
		if sel != nil && br.Session == sel.Session && br.Branch == sel.Branch {
			line = stSelected.Render(stripANSI(line))
		}
		b.WriteString(line + "\n")
	}
	if len(bs) == 0 {
		b.WriteString(stDim.Render("  no agent branches: agents name them with X-Evolve-Session and X-Evolve-Branch") + "\n")
	}
	return b.String()
}

func (m *Model) viewEvents() string {
	var b strings.Builder
	b.WriteString("events, newest first\n\n")
	for i, e := range m.events {
		if i >= m.height-6 {
			break
		}
		fmt.Fprintf(&b, "%s  %-7s %s\n", e.Time.Local().Format("15:04:05"), e.Kind, truncate(e.Text, m.width-20))
	}
	if len(m.events) == 0 {
		b.WriteString(stDim.Render("  none yet") + "\n")
	}
	return b.String()
}

var sparkChars = []rune("▁▂▃▄▅▆▇█")

// sparkline draws the last n values scaled to their maximum.
func sparkline(v []float64, n int) string {
	if len(v) > n {
		v = v[len(v)-n:]
	}
	hi := 0.0
	for _, x := range v {
		hi = max(hi, x)
	}
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

// fitText fits s after indent into width: wrapped at its spaces onto lines
// that start with indent when the model wraps, else cut.
func (m *Model) fitText(s, indent string, width int) string {
	if !m.wrap {
		return truncate(s, width-len(indent))
	}
	return wrapJoin(strings.Fields(s), " ", "", indent, width)
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
// "per_block_us -0.161 ±0.53", not "±3.3e+02%").
func coefText(c Coef) string {
	v := math.Abs(c.Value)
	switch rel := 100 * c.StdErr / v; {
	case v == 0 || rel >= 100 || math.IsNaN(rel):
		return fmt.Sprintf("%s %.3g ±%.2g", c.Name, c.Value, c.StdErr)
	case rel < 0.1:
		return fmt.Sprintf("%s %.3g ±<0.1%%", c.Name, c.Value)
	default:
		return fmt.Sprintf("%s %.3g ±%.2g%%", c.Name, c.Value, rel)
	}
}
