package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"text/tabwriter"
	"time"

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

Below them: its predictions for the split it served over the last two
minutes against what the requests that finished measured (TTFT, the
prefill queue's wait, ITL and end-to-end latency, with the error), and
the corrections its predictions take from that. Agents send in bursts, so
measured waits run longer than a queueing formula for steady arrivals
says; the planner scales its predicted waits (and decode steps) by what
it measured rather than trusting the formula.

The planner moves only nodes in auto mode; 'evolve role set NODE ROLE --pin'
always wins, and 'evolve role auto NODE' hands a node back.`,
		Example: `  evolve planner
  evolve planner -o json | jq '.decode_cost.coefficients'
  evolve planner -o json | jq -r '.decisions[] | .reason'
  evolve planner -o json | jq '.accuracy'`,
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
				fmt.Fprint(w, plannerAccuracy(st.Accuracy))
			})
		},
	}
	addClientFlags(cmd)
	addOutputFlag(cmd, "table, wide, json or yaml")
	return cmd
}

// plannerAccuracy says how the planner's predictions for the split it
// served compare with what the requests that finished measured, and the
// corrections it takes from that; nothing before any was measured.
func plannerAccuracy(a planner.Accuracy) string {
	if a.Requests < 1 || a.PredictedTTFT <= 0 {
		return ""
	}
	errPct := func(e float64) string { return fmt.Sprintf("%+.0f%%", 100*e) }
	var b strings.Builder
	fmt.Fprintf(&b, "\npredicted against measured (last %s, %.0f requests):\n", shortDuration(time.Duration(a.HorizonSec*float64(time.Second))), a.Requests)
	fmt.Fprintf(&b, "  TTFT  %.3fs predicted, %.3fs measured (%s); prefill wait %.3fs, %.3fs\n", a.PredictedTTFT, a.MeasuredTTFT, errPct(a.TTFTError), a.PredictedWait, a.MeasuredWait)
	fmt.Fprintf(&b, "  ITL   %.1fms predicted, %.1fms measured (%s)\n", a.PredictedITL*1e3, a.MeasuredITL*1e3, errPct(a.ITLError))
	fmt.Fprintf(&b, "  E2E   %.2fs predicted, %.2fs measured (%s)\n", a.PredictedE2E, a.MeasuredE2E, errPct(a.E2EError))
	fmt.Fprintf(&b, "  corrections taken: prefill wait x%.2f, ITL x%.2f\n", a.WaitFactor, a.ITLFactor)
	return b.String()
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
