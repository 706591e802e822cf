package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// evolve top in a real terminal (tmux) against a real local cluster: the
// operator selects a decode node, presses p, confirms, and sees its role
// change in the table.
func TestTopSwitchesANodeInTmux(t *testing.T) {
	requireTmux(t)
	c := upCluster(t, "--engines", "2", "--prefill", "1", "--profile", "tiny")
	term := openTerminal(t, 120, 32, "env "+strings.Join(c.env, " ")+" "+evolveBin+" top")
	screen := func() string { return term.screen(false) }
	keys := term.keys
	waitFor := func(what string, cond func(string) bool) string {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for {
			s := screen()
			if cond(s) {
				return s
			}
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s; screen:\n%s", what, s)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	waitFor("the nodes table", func(s string) bool {
		return strings.Contains(s, "live") && strings.Contains(s, "engine-1") && strings.Contains(s, "D decode")
	})
	// Keys typed before the program reads its input are lost, as in any
	// terminal: type j until the selection moves.
	moved := false
	for i := 0; i < 20 && !moved; i++ {
		keys("j")
		time.Sleep(250 * time.Millisecond)
		moved = strings.Contains(screen(), "› engine-1")
	}
	if !moved {
		t.Fatalf("the selection never moved to engine-1:\n%s", screen())
	}
	keys("p")
	waitFor("the confirmation", func(s string) bool { return strings.Contains(s, "Switch engine-1 from decode to prefill and pin it?") })
	keys("y")
	s := waitFor("engine-1 pinned as prefill", func(s string) bool {
		for _, l := range strings.Split(s, "\n") {
			if strings.Contains(l, "engine-1") && strings.Contains(l, "P prefill") && strings.Contains(l, "pinned") {
				return true
			}
		}
		return false
	})
	if !strings.Contains(s, "2 prefill, 0 decode serving") && !strings.Contains(s, "switch engine-1 to prefill") {
		t.Fatalf("screen after the switch:\n%s", s)
	}
	// The cluster agrees.
	if n := c.node("engine-1"); n["role"] != "prefill" || n["mode"] != "pinned" {
		t.Fatalf("engine-1: %v", n)
	}
	keys("4")
	waitFor("the switch in the events view", func(s string) bool { return strings.Contains(s, "engine-1 is now prefill") })
	keys("q")
	waitFor("evolve top to quit", func(string) bool { return !term.running() })
}

// Without a terminal, evolve top refuses and points to --once; --once -o
// json prints a snapshot for scripts.
func TestTopOnceAndNoTerminal(t *testing.T) {
	c := upCluster(t, "--engines", "2", "--prefill", "1", "--profile", "tiny")
	out, code := runBinOut(t, c.env, "top")
	if code != 2 || !strings.Contains(out, "--once") {
		t.Fatalf("top without a terminal: exit %d: %s", code, out)
	}
	out, code = runBinOut(t, c.env, "top", "--once", "-o", "json")
	var snap struct {
		Cluster struct {
			Model string `json:"model"`
		} `json:"cluster"`
		Nodes []struct {
			ID   string `json:"id"`
			Role string `json:"role"`
		} `json:"nodes"`
		Planner *struct {
			State string `json:"state"`
		} `json:"planner"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &snap) != nil || len(snap.Nodes) != 2 || snap.Cluster.Model == "" || snap.Planner == nil {
		t.Fatalf("top --once -o json: %d\n%s", code, out)
	}
	out, code = runBinOut(t, c.env, "top", "--once")
	if code != 0 || !strings.Contains(out, "P prefill") || !strings.Contains(out, "evolve top") {
		t.Fatalf("top --once: %d\n%s", code, out)
	}
	// Nothing there: --once says so, and how to start one, as top does.
	out, code = runBinOut(t, c.env, "top", "--once", "-o", "json", "--server", "http://127.0.0.1:1")
	if code != 1 || !strings.Contains(out, "no orchestrator at http://127.0.0.1:1") || !strings.Contains(out, "start one with 'evolve up', or pass --server") {
		t.Fatalf("top --once against nothing: %d\n%s", code, out)
	}
}

// NO_COLOR turns colour off; without it, roles are coloured (and named).
// CI=true in the environment turns it off too (termenv), so the colour
// case forces it.
func TestTopHonoursNoColor(t *testing.T) {
	requireTmux(t)
	c := upCluster(t, "--engines", "2", "--prefill", "1", "--profile", "tiny")
	colours := func(extra string) int {
		term := openTerminal(t, 120, 30, "env TERM=xterm-256color "+extra+" "+strings.Join(c.env, " ")+" "+evolveBin+" top")
		defer term.close()
		var screen string
		for i := 0; i < 50 && !strings.Contains(screen, "engine-1"); i++ {
			time.Sleep(100 * time.Millisecond)
			screen = term.screen(true)
		}
		n := 0
		for _, code := range []string{"\x1b[35m", "\x1b[36m", "\x1b[38;5;5m", "\x1b[38;5;6m"} {
			n += strings.Count(screen, code)
		}
		if !strings.Contains(screen, "P prefill") {
			t.Fatalf("no table:\n%s", screen)
		}
		return n
	}
	// CLICOLOR_FORCE turns colour on whatever the environment (CI turns
	// it off); NO_COLOR must win even so.
	if n := colours("NO_COLOR=1 CLICOLOR_FORCE=1"); n != 0 {
		t.Fatalf("%d colour codes with NO_COLOR", n)
	}
	if n := colours("CLICOLOR_FORCE=1"); n == 0 {
		t.Fatal("no colour without NO_COLOR: the check above proves nothing")
	}
}

// evolve top at 80x24 in tmux, started after the cluster's past: the
// events view shows that past from the orchestrator's record, at its real
// times (item 3); the selection stays on its node as a sort moves its row
// (item 2); and the confirmation of a switch shows its key first and the
// whole question (item 1).
func TestTopAt80ColumnsInTmux(t *testing.T) {
	requireTmux(t)
	c := upCluster(t, "--engines", "4", "--prefill", "1", "--profile", "tiny")
	// Before top starts: a role switch, which it must not leave out.
	if out, code := runBinOut(t, c.env, "role", "set", "engine-2", "prefill"); code != 0 {
		t.Fatalf("role set: %d %s", code, out)
	}
	var node struct {
		History []struct {
			Time time.Time `json:"time"`
			To   string    `json:"to"`
		} `json:"history"`
	}
	out, _ := runBinOut(t, c.env, "nodes", "-o", "json")
	var nodes []json.RawMessage
	json.Unmarshal([]byte(out), &nodes)
	for _, n := range nodes {
		if strings.Contains(string(n), `"id": "engine-2"`) || strings.Contains(string(n), `"id":"engine-2"`) {
			json.Unmarshal(n, &node)
		}
	}
	if len(node.History) == 0 || node.History[len(node.History)-1].To != "prefill" {
		t.Fatalf("engine-2's history: %s", out)
	}
	switched := node.History[len(node.History)-1].Time.Local().Format("15:04:05")
	time.Sleep(1100 * time.Millisecond) // top's start is a later second than the switch
	started := time.Now()

	term := openTerminal(t, 80, 24, "env "+strings.Join(c.env, " ")+" "+evolveBin+" top")
	waitFor := func(what string, cond func(string) bool) string {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for {
			s := term.screen(false)
			if cond(s) {
				return s
			}
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s; screen:\n%s", what, s)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	waitFor("the nodes table", func(s string) bool { return strings.Contains(s, "live") && strings.Contains(s, "engine-3") })

	// Item 3: the past, at its times.
	term.keys("4")
	s := waitFor("the events view", func(s string) bool { return strings.Contains(s, "events, newest first") })
	if !strings.Contains(s, switched+"  switch  engine-2 is now prefill") {
		t.Fatalf("the switch before top started is not shown at %s:\n%s", switched, s)
	}
	joinedAt := ""
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, "engine-0 joined as prefill") {
			joinedAt = strings.Fields(l)[0]
		}
	}
	if joinedAt == "" || joinedAt >= started.Format("15:04:05") {
		t.Fatalf("engine-0's join is at %q, not before top started (%s):\n%s", joinedAt, started.Format("15:04:05"), s)
	}
	if !strings.Contains(s, "from the orchestrator's record") {
		t.Fatalf("the view does not say where its history comes from:\n%s", s)
	}

	// Item 2: the selection stays on engine-1 as the role sort moves its
	// row from the second to the third (prefill first: engine-0, engine-2).
	term.keys("1")
	moved := false
	for i := 0; i < 20 && !moved; i++ {
		term.keys("j")
		time.Sleep(250 * time.Millisecond)
		moved = strings.Contains(term.screen(false), "› engine-1")
	}
	if !moved {
		t.Fatalf("the selection never reached engine-1:\n%s", term.screen(false))
	}
	term.keys("s")
	s = waitFor("the role sort", func(s string) bool { return strings.Contains(s, "ROLE▼") })
	var order []string
	for _, l := range strings.Split(s, "\n") {
		if f := strings.Fields(strings.TrimPrefix(l, "›")); len(f) > 1 && strings.HasPrefix(f[0], "engine-") {
			order = append(order, f[0])
		}
	}
	if strings.Join(order, " ") != "engine-0 engine-2 engine-1 engine-3" || !strings.Contains(s, "› engine-1") {
		t.Fatalf("rows %v; the selection must stay on engine-1:\n%s", order, s)
	}

	// Item 1: p asks about engine-1, its key first, the whole question.
	term.keys("p")
	s = waitFor("the confirmation", func(s string) bool { return strings.Contains(s, "[y/N]") })
	flat := strings.Join(strings.Fields(s), " ")
	if !strings.Contains(s, "\n[y/N] Switch engine-1 from decode to prefill and pin it?") || !strings.Contains(flat, "the planner leaves it.") {
		t.Fatalf("the confirmation at 80 columns:\n%s", s)
	}
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, "…") {
			t.Fatalf("a line is cut at 80 columns:\n%s", s)
		}
	}
	term.keys("n")
	waitFor("the cancel", func(s string) bool { return strings.Contains(s, "cancelled") })
	if n := c.node("engine-1"); n["role"] != "decode" {
		t.Fatalf("engine-1 after a cancel: %v", n)
	}
	term.keys("q")
	waitFor("evolve top to quit", func(string) bool { return !term.running() })
}
