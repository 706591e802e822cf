package main

import (
	"fmt"
	"os"
	"os/signal"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/evolvellm/evolve/orchestrator"
	"github.com/spf13/cobra"
)

// statusOutput is what `evolve status -o json` prints. Names are stable.
type statusOutput struct {
	orchestrator.ClusterStatus
	Nodes []orchestrator.NodeStatus `json:"nodes"`
}

func newStatusCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the cluster: URLs, policy, nodes by role and state",
		Example: `  evolve status
  evolve status -o json | jq .router_url`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if file := config.GetString("status.file"); file != "" {
				return statusFromFile(cmd, file)
			}
			c := newControlClient(cmd)
			var out statusOutput
			ctx := cmd.Context()
			if err := c.do(ctx, "GET", "/api/v1/cluster", nil, &out.ClusterStatus); err != nil {
				return err
			}
			if err := c.do(ctx, "GET", "/api/v1/nodes", nil, &out.Nodes); err != nil {
				return err
			}
			return output(cmd, out, func(w *tabwriter.Writer, wide bool) {
				s := out.ClusterStatus
				fmt.Fprintf(w, "router\t%s\n", s.RouterURL)
				fmt.Fprintf(w, "control\t%s\n", s.ControlURL)
				fmt.Fprintf(w, "policy\t%s\n", s.Policy)
				fmt.Fprintf(w, "model\t%s\n", s.Model)
				fmt.Fprintf(w, "nodes\t%d: %d prefill, %d decode serving; %d switching, %d down\n", s.NodeCount,
					s.ByRole["prefill"], s.ByRole["decode"], s.ByState[orchestrator.StateSwitching], s.ByState[orchestrator.StateDown])
				fmt.Fprintf(w, "kv directory\t%d blocks, %d copies\n", s.KVBlocks, s.KVReplicas)
			})
		},
	}
	addClientFlags(cmd)
	cmd.Flags().StringP("file", "f", "", "a cluster brought up with evolve up -f: its orchestrator and what each host runs (over SSH)")
	addSSHFlags(cmd.Flags())
	addOutputFlag(cmd, "table, json or yaml")
	return cmd
}

func newNodesCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "nodes",
		Short: "List the engines with role, mode, state and load",
		Long: `List the engines. Columns: ROLE (P prefill, D decode), MODE (auto: the
planner may move it; pinned: only an operator), STATE (serving, switching,
down), queue and running requests, GPU and host KV use.`,
		Example: `  evolve nodes
  evolve nodes -o wide
  evolve nodes -o json | jq -r '.[] | select(.role=="decode") | .id'`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var nodes []orchestrator.NodeStatus
			if err := newControlClient(cmd).do(cmd.Context(), "GET", "/api/v1/nodes", nil, &nodes); err != nil {
				return err
			}
			return output(cmd, nodes, func(w *tabwriter.Writer, wide bool) {
				fmt.Fprint(w, "ID\tROLE\tMODE\tSTATE\tQUEUE\tRUNNING\tGPU-KV\tHOST-KV")
				if wide {
					fmt.Fprint(w, "\tIN-FLIGHT\tGPU-BLOCKS\tHOST-BLOCKS\tLAST-SEEN\tADDRESS")
				}
				fmt.Fprintln(w)
				for _, n := range nodes {
					state := n.State
					if n.Switch != nil {
						state = fmt.Sprintf("%s->%s (%s)", n.State, n.Switch.To, n.Switch.Phase)
					}
					fmt.Fprintf(w, "%s\t%s %s\t%s\t%s\t%d\t%d\t%.0f%%\t%.0f%%", n.ID, strings.ToUpper(n.Role[:1]), n.Role, n.Mode, state,
						n.Waiting, n.Running, 100*n.GPUKVUsage, 100*n.HostKVUsage)
					if wide {
						fmt.Fprintf(w, "\t%d\t%d\t%d\t%s\t%s", n.InFlight, n.GPUBlocks, n.HostBlocks, ago(n.LastSeen), n.Address)
					}
					fmt.Fprintln(w)
				}
			})
		},
	}
	addClientFlags(cmd)
	addOutputFlag(cmd, "table, wide, json or yaml")
	return cmd
}

func ago(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return time.Since(t).Round(100*time.Millisecond).String() + " ago"
}

func newRoleCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "role",
		Short: "Switch nodes between prefill and decode",
	}
	set := &cobra.Command{
		Use:   "set NODE prefill|decode",
		Short: "Switch a node's role, and watch the switch until it is done",
		Long: `Switch a node's role. The orchestrator stops routing new work of the old
role to it, lets its requests in flight finish, offloads its GPU KV to its
host pool (the context stays reachable), flips the engine and resumes; no
request is dropped. The command watches until the switch is done; --detach
returns at once, and Ctrl-C stops watching, not the switch. --pin keeps the
planner from moving the node again ('evolve role auto NODE' undoes it).`,
		Example: `  evolve role set engine-2 decode --pin
  evolve role set engine-2 prefill --detach`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 2 || (args[1] != "prefill" && args[1] != "decode") {
				return usageError{cmd: cmd.CommandPath(), err: fmt.Errorf("want NODE and a role, prefill or decode")}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			c := newControlClient(cmd)
			id, role := args[0], args[1]
			pin := config.GetBool(cfgKey(cmd) + ".pin")
			var st orchestrator.NodeStatus
			if err := c.do(cmd.Context(), "POST", "/api/v1/nodes/"+id+"/role", map[string]any{"role": role, "pin": pin}, &st); err != nil {
				return err
			}
			if config.GetBool(cfgKey(cmd)+".detach") || (st.Role == role && st.Switch == nil) {
				return output(cmd, st, func(w *tabwriter.Writer, _ bool) {
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", st.ID, st.Role, st.Mode, st.State)
				})
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt)
			defer stop()
			last := ""
			for {
				if st.Switch == nil && st.State != orchestrator.StateSwitching {
					break
				}
				if st.Switch != nil && st.Switch.Phase != last {
					last = st.Switch.Phase
					fmt.Fprintf(cmd.ErrOrStderr(), "%s: %s -> %s: %s (in flight %d)\n", id, st.Role, role, last, st.InFlight)
				}
				select {
				case <-ctx.Done():
					fmt.Fprintln(cmd.ErrOrStderr(), "stopped watching; the switch goes on")
					return nil
				case <-time.After(100 * time.Millisecond):
				}
				st = orchestrator.NodeStatus{} // omitted fields (switch) must not linger
				if err := c.do(ctx, "GET", "/api/v1/nodes/"+id, nil, &st); err != nil {
					return err
				}
			}
			if st.Role != role {
				return fmt.Errorf("switch of %s to %s failed; it stays %s (see its history: evolve nodes -o json)", id, role, st.Role)
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "%s: now %s (%s)\n", id, st.Role, st.Mode)
			return output(cmd, st, func(w *tabwriter.Writer, _ bool) {
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", st.ID, st.Role, st.Mode, st.State)
			})
		},
	}
	set.ValidArgsFunction = func(cmd *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
		if len(args) == 1 {
			return []string{"prefill", "decode"}, cobra.ShellCompDirectiveNoFileComp
		}
		return completeNodes(cmd, args, "")
	}
	set.Flags().Bool("pin", false, "pin the node: the planner will not move it")
	set.Flags().Bool("detach", false, "return at once instead of watching the switch")
	addClientFlags(set)
	addOutputFlag(set, "table, json or yaml")
	auto := &cobra.Command{
		Use:     "auto NODE",
		Short:   "Unpin a node: the planner may move it again",
		Example: `  evolve role auto engine-2`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageError{cmd: cmd.CommandPath(), err: fmt.Errorf("want one NODE")}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			var st orchestrator.NodeStatus
			if err := newControlClient(cmd).do(cmd.Context(), "DELETE", "/api/v1/nodes/"+args[0]+"/pin", nil, &st); err != nil {
				return err
			}
			return output(cmd, st, func(w *tabwriter.Writer, _ bool) {
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", st.ID, st.Role, st.Mode, st.State)
			})
		},
	}
	auto.ValidArgsFunction = completeNodes
	addClientFlags(auto)
	addOutputFlag(auto, "table, json or yaml")
	cmd.AddCommand(set, auto)
	return cmd
}

// completeNodes offers the node ids of the cluster for shell completion.
func completeNodes(cmd *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	if err := loadConfig(cmd); err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var nodes []orchestrator.NodeStatus
	if newControlClient(cmd).do(cmd.Context(), "GET", "/api/v1/nodes", nil, &nodes) != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	ids := make([]string, len(nodes))
	for i, n := range nodes {
		ids[i] = n.ID + "\t" + n.Role + ", " + n.State
	}
	return ids, cobra.ShellCompDirectiveNoFileComp
}
