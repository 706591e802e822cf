package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"text/tabwriter"

	"github.com/evolvellm/evolve/planner"
	"github.com/evolvellm/evolve/tui"
	"github.com/spf13/cobra"
	"golang.org/x/term"
)

func newPlannerCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "planner",
		Short: "Show what the online planner has learned, recommends and did",
		Long: `Show the online planner: the prefill and decode pass costs it learned from
live measurements (with their standard errors and the passes behind them),
the demand over its short and long horizons, the current split and the one
it recommends with their predicted latencies, the predicted gain of moving
against the cost of the switch, how long the recommendation has held and
when it will act, and its last decisions with their reasons.

The planner moves only nodes in auto mode; 'evolve role set NODE ROLE --pin'
always wins, and 'evolve role auto NODE' hands a node back.`,
		Example: `  evolve planner
  evolve planner -o json | jq '.decode_cost.coefficients'
  evolve planner -o json | jq -r '.decisions[] | .reason'`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var raw json.RawMessage
			if err := newControlClient(cmd).do(cmd.Context(), "GET", "/api/v1/planner", nil, &raw); err != nil {
				return err
			}
			var st planner.Status
			var view tui.Planner
			if err := json.Unmarshal(raw, &st); err != nil {
				return err
			}
			json.Unmarshal(raw, &view)
			// The table is evolve top's planner view.
			return output(cmd, st, func(w *tabwriter.Writer, wide bool) {
				width := textWidth(cmd.OutOrStdout())
				if wide {
					width = math.MaxInt32 // a line per item, however long
				}
				fmt.Fprint(w, tui.RenderPlanner(view, width))
			})
		},
	}
	addClientFlags(cmd)
	addOutputFlag(cmd, "table, wide, json or yaml")
	return cmd
}

// textWidth is the width to fit a text report to: the terminal's when w is
// one, else 80 columns.
func textWidth(w io.Writer) int {
	if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		if cols, _, err := term.GetSize(int(f.Fd())); err == nil && cols >= 40 {
			return cols
		}
	}
	return 80
}
