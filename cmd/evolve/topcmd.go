package main

import (
	"context"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	tea "github.com/charmbracelet/bubbletea"
	"github.com/evolvellm/evolve/tui"
	"github.com/spf13/cobra"
)

// topSnapshot is what evolve top --once -o json prints. Names are stable.
type topSnapshot struct {
	Cluster  tui.Cluster  `json:"cluster"`
	Nodes    []tui.Node   `json:"nodes"`
	Planner  *tui.Planner `json:"planner,omitempty"`
	KV       *tui.KV      `json:"kv,omitempty"`
	Branches []tui.Branch `json:"branches"`
}

func newTopCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "top",
		Short: "Watch the cluster live in the terminal and switch nodes by hand",
		Long: `A live monitor of the cluster, fed by the control API's watch stream.

Views (keys 1-4): nodes (roles, modes, states, queues, KV use, referenced
share, load on one scale for every row, recent events below), planner
(learned costs, demand, current and recommended split, its decisions),
branches (the agent session tree and where each branch's KV lives; enter
lists every node holding the selected one, f follows it), events (nodes
joining, going down and back, switches, planner moves, evictions of blocks
live agent branches reference, errors): the orchestrator keeps a record of
them and sends it to each new watcher, so a top started later shows the
past at its times; from a server without one it says so.

The selection is a node, not a row: it stays on its node as rows re-sort.
p / d switch the selected node to prefill / decode and pin it, a hands it
back to the planner, each after a confirmation whose key comes first
([y/N]); --readonly refuses them. j/k move or scroll, / filters (shown on
screen; esc clears), s sorts (the column is marked), Z pauses, ? helps, q
quits.

It also watches simulations: evolve sim --live serves each simulated
policy's cluster at its own address, and --beside shows a second one next
to the first, keys moving both.

It needs a terminal of at least 80x24 and uses what more it has (with
--beside: 155x24 side by side, or 80x49 one above the other); for
scripts, --once prints one snapshot (-o json for the data).`,
		Example: `  evolve top
  evolve top --server http://10.0.0.5:8001 --token $TOKEN --readonly
  evolve top --once -o json | jq '.nodes[] | {id, role, state}'
  evolve top --readonly --server http://127.0.0.1:7070/evolve --beside http://127.0.0.1:7070/dynamo`,
		Args: noArgs,
		RunE: runTop,
	}
	cmd.Flags().Bool("readonly", false, "watch only: refuse to switch nodes")
	cmd.Flags().Bool("once", false, "print one snapshot and exit (no terminal needed)")
	cmd.Flags().String("beside", "", "show a second control API beside the first (for two policies of evolve sim --live); read-only, needs a terminal 155 columns wide, or 49 rows tall to show them one above the other")
	addClientFlags(cmd)
	addOutputFlag(cmd, "with --once: table or json")
	return cmd
}

func runTop(cmd *cobra.Command, _ []string) error {
	c := newControlClient(cmd)
	if c.err != nil {
		return c.err
	}
	src := tui.NewHTTPSource(c.base, c.token)
	once, _ := cmd.Flags().GetBool("once")
	readonly, _ := cmd.Flags().GetBool("readonly")
	if once {
		return topOnce(cmd, c, src)
	}
	if fi, err := os.Stdout.Stat(); err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		return usageError{cmd: cmd.CommandPath(), err: fmt.Errorf("evolve top needs a terminal; for scripts use evolve top --once -o json")}
	}
	// Fail early and clearly when nothing answers.
	ctx, cancel := context.WithTimeout(cmd.Context(), 5*time.Second)
	defer cancel()
	if _, err := src.Cluster(ctx); err != nil {
		return &plainError{msg: fmt.Sprintf("no orchestrator at %s: %s (start one with 'evolve up', or pass --server)", c.base, reachCause(err)), err: err}
	}
	var m tea.Model = tui.New(src, tui.Options{ReadOnly: readonly})
	if beside, _ := cmd.Flags().GetString("beside"); beside != "" {
		other := tui.NewHTTPSource(beside, c.token)
		if _, err := other.Cluster(ctx); err != nil {
			return &plainError{msg: fmt.Sprintf("--beside: nothing answers at %s: %s", beside, reachCause(err)), err: err}
		}
		m = tui.NewSplit(tui.New(src, tui.Options{ReadOnly: true}), tui.New(other, tui.Options{ReadOnly: true}))
	}
	_, err := tea.NewProgram(m, tea.WithAltScreen()).Run()
	return err
}

func topOnce(cmd *cobra.Command, c *controlClient, src *tui.HTTPSource) error {
	ctx := cmd.Context()
	var snap topSnapshot
	var err error
	if snap.Cluster, err = src.Cluster(ctx); err != nil {
		return &plainError{msg: fmt.Sprintf("no orchestrator at %s: %s (start one with 'evolve up', or pass --server)", c.base, reachCause(err)), err: err}
	}
	if err := c.do(ctx, "GET", "/api/v1/nodes", nil, &snap.Nodes); err != nil {
		return err
	}
	if p, err := src.Planner(ctx); err == nil {
		snap.Planner = &p
	}
	if k, err := src.KV(ctx); err == nil {
		snap.KV = &k
	}
	if snap.Branches, err = src.Branches(ctx); err != nil {
		return err
	}
	return output(cmd, snap, func(w *tabwriter.Writer, _ bool) {
		fmt.Fprint(w, tui.Render(snap.Cluster, snap.Nodes, snap.Planner, snap.KV, snap.Branches, c.base, 120, 40))
	})
}
