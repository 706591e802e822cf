package main

import (
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/evolvellm/evolve/planner"
	"github.com/spf13/cobra"
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
			var st planner.Status
			if err := newControlClient(cmd).do(cmd.Context(), "GET", "/api/v1/planner", nil, &st); err != nil {
				return err
			}
			return output(cmd, st, func(w *tabwriter.Writer, wide bool) { printPlanner(w, st, wide) })
		},
	}
	addClientFlags(cmd)
	addOutputFlag(cmd, "table, wide, json or yaml")
	return cmd
}

func printPlanner(w *tabwriter.Writer, st planner.Status, wide bool) {
	mode := "moves auto nodes"
	if !st.Enabled {
		mode = "recommends only"
	}
	fmt.Fprintf(w, "state\t%s (%s)\n", st.State, mode)
	fmt.Fprintf(w, "why\t%s\n", st.Reason)
	for _, f := range []struct {
		name string
		fit  planner.FitStatus
	}{{"prefill cost", st.PrefillFit}, {"decode cost", st.DecodeFit}} {
		var parts []string
		for _, c := range f.fit.Coefs {
			parts = append(parts, fmt.Sprintf("%s %.3g±%.2g", c.Name, c.Value, c.StdErr))
		}
		ready := "trusted"
		if !f.fit.Ready {
			ready = f.fit.Note
		}
		fmt.Fprintf(w, "%s\t%s; %d passes, ±%.1f%% (%s)\n", f.name, strings.Join(parts, ", "), f.fit.Samples, f.fit.RelErr*100, ready)
	}
	for _, d := range []planner.Demand{st.Short, st.Long} {
		fmt.Fprintf(w, "demand %.0fs\t%.2f req/s, %.0f prefill tok/s (%.0f%% remote), %.0f output tok/s\n",
			d.HorizonSec, d.RequestsPerSec, d.PrefillTokPerSec+d.LocalTokPerSec, d.DisaggShare*100, d.OutputTokPerSec)
	}
	fmt.Fprintf(w, "split\t%d prefill : %d decode (%d switching)\n", st.Prefill, st.Decode, st.Switching)
	pr := func(p planner.Prediction) string {
		if p.Saturated {
			return fmt.Sprintf("%d:%d overloaded (prefill load %.2f, decode load %.2f)", p.Prefill, p.Decode, p.PrefillLoad, p.DecodeLoad)
		}
		return fmt.Sprintf("%d:%d TTFT %.3fs, ITL %.1fms, E2E %.2fs", p.Prefill, p.Decode, p.TTFT, p.ITL*1e3, p.E2E)
	}
	if st.Current.Prefill+st.Current.Decode > 0 {
		fmt.Fprintf(w, "predicted now\t%s\n", pr(st.Current))
		fmt.Fprintf(w, "predicted best\t%s\n", pr(st.Best))
	}
	if st.Recommended >= 0 && st.Recommended != st.Prefill {
		fmt.Fprintf(w, "recommended\t%d:%d, held %.0fs, acts in %.0fs; gain %.0f request-s vs switch cost %.0f\n",
			st.Recommended, st.Prefill+st.Decode-st.Recommended, st.HeldSec, st.ActsInSec, st.GainSec, st.CostSec)
	}
	n := 3
	if wide {
		n = len(st.Decisions)
	}
	for i := len(st.Decisions) - 1; i >= 0 && i >= len(st.Decisions)-n; i-- {
		d := st.Decisions[i]
		var nodes []string
		for _, m := range d.Moves {
			nodes = append(nodes, m.Node+"->"+m.To)
		}
		fmt.Fprintf(w, "decision %s\t%s %s: %s\n", d.Time.Local().Format("15:04:05"), d.Action, strings.Join(nodes, ","), d.Reason)
	}
}
