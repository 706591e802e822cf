package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/evolvellm/evolve/controlapi"
	"github.com/evolvellm/evolve/orchestrator"
	"github.com/spf13/cobra"
)

// statusOutput is what `evolve status -o json` prints. Names are stable.
type statusOutput struct {
	orchestrator.ClusterStatus
	Nodes []controlapi.Node `json:"nodes"`
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
				switch {
				case s.TLSNotAfter != nil && time.Until(*s.TLSNotAfter) <= 0:
					fmt.Fprintf(w, "tls\tcertificate EXPIRED %s\n", s.TLSNotAfter.Local().Format("2006-01-02 15:04"))
				case s.TLSNotAfter != nil:
					fmt.Fprintf(w, "tls\tcertificate ends %s (in %s)\n", s.TLSNotAfter.Local().Format("2006-01-02 15:04"), roundDays(time.Until(*s.TLSNotAfter)))
				}
				if s.APIKeys > 0 {
					fmt.Fprintf(w, "api keys\t%d\n", s.APIKeys)
					for _, l := range s.KeyLimits {
						waiting := ""
						if l.Waiting > 0 {
							waiting = fmt.Sprintf(", %d waiting", l.Waiting)
						}
						fmt.Fprintf(w, "  %s\t%d of %d in flight%s\n", l.Name, l.InFlight, l.MaxConcurrency, waiting)
					}
				} else {
					fmt.Fprintf(w, "api keys\tnone: open to whoever reaches the router\n")
				}
				fmt.Fprintf(w, "control\t%s\n", s.ControlURL)
				fmt.Fprintf(w, "policy\t%s\n", s.Policy)
				fmt.Fprintf(w, "model\t%s\n", s.Model)
				fmt.Fprintf(w, "nodes\t%d: %d prefill, %d decode serving; %d switching, %d down\n", s.NodeCount,
					s.ByRole["prefill"], s.ByRole["decode"], s.ByState[orchestrator.StateSwitching], s.ByState[orchestrator.StateDown])
				fmt.Fprintf(w, "kv directory\t%d blocks, %d copies\n", s.KVBlocks, s.KVReplicas)
				printOrchestrators(w, s)
			})
		},
	}
	addClientFlags(cmd)
	cmd.Flags().StringP("file", "f", "", "a cluster brought up with evolve up -f: its orchestrator and what each host runs (over SSH)")
	addSSHFlags(cmd.Flags())
	addOutputFlag(cmd, "table, json or yaml")
	return cmd
}

// printOrchestrators lists the orchestrators sharing the event plane,
// when there are several.
func printOrchestrators(w *tabwriter.Writer, s orchestrator.ClusterStatus) {
	if len(s.Orchestrators) < 2 {
		return
	}
	leader := s.Leader
	if leader == "" {
		leader = "none now (the lease moves within 5 s)"
	}
	fmt.Fprintf(w, "planner leader\t%s\n", leader)
	fmt.Fprintf(w, "orchestrators\t%d\n", len(s.Orchestrators))
	for _, o := range s.Orchestrators {
		var notes []string
		if o.Leader {
			notes = append(notes, fmt.Sprintf("leader, term %d", o.Term))
		}
		switch {
		case o.State != "up":
			notes = append(notes, fmt.Sprintf("%s for %.0f s", o.State, o.HeardAgo))
		case o.NATSPeers >= 0:
			notes = append(notes, fmt.Sprintf("NATS routes to %d other servers", o.NATSPeers))
		}
		if o.Self {
			notes = append(notes, "answering")
		}
		fmt.Fprintf(w, "  %s\t%s  %s\n", o.Name, o.RouterURL, strings.Join(notes, ", "))
	}
}

func newNodesCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "nodes",
		Short: "List the engines with role, mode, state and load",
		Long: `List the engines. Columns: ROLE (P prefill, D decode), MODE (auto: the
planner may move it; pinned: only an operator), STATE (serving; switching;
draining: its engine is stopping and gets no new requests; down), queue and
running requests, GPU and host KV use. -o wide adds LEFT-OUT: KV blocks the
engine could not report to the router (kv_blocks_left_out and, for the
last, kv_left_out_why in -o json), which it then cannot route to; the
engine's log says why. -o json adds, for a node that failed,
the answers it was writing (answers_interrupted) and those no other node
could continue (answers_lost: a stream that ended with an error; a whole
answer no node could continue is sent again from its start instead).`,
		Example: `  evolve nodes
  evolve nodes -o wide
  evolve nodes --watch                 # then a row per change of role, mode or state
  evolve nodes -w -o json | jq -c 'select(.state=="down")'
  evolve nodes -o json | jq -r '.[] | select(.role=="decode") | .id'`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if w, _ := cmd.Flags().GetBool("watch"); w {
				return watchNodes(cmd)
			}
			var nodes []controlapi.Node
			if err := newControlClient(cmd).do(cmd.Context(), "GET", "/api/v1/nodes", nil, &nodes); err != nil {
				return err
			}
			return output(cmd, nodes, func(w *tabwriter.Writer, wide bool) {
				fmt.Fprintln(w, nodeHeader(wide))
				for _, n := range nodes {
					fmt.Fprintln(w, nodeRow(n, wide))
				}
			})
		},
	}
	addClientFlags(cmd)
	addOutputFlag(cmd, "table, wide, json or yaml")
	cmd.Flags().BoolP("watch", "w", false, "after the table, print a node's row again whenever its role, mode or state changes (-o json: a node, one JSON object per line, whenever anything but its last_seen changes) until Ctrl-C")
	return cmd
}

func nodeHeader(wide bool) string {
	h := "ID\tROLE\tMODE\tSTATE\tQUEUE\tRUNNING\tGPU-KV\tHOST-KV"
	if wide {
		h += "\tIN-FLIGHT\tGPU-BLOCKS\tHOST-BLOCKS\tLEFT-OUT\tPASSES\tLAST-SEEN\tTOKEN\tADDRESS"
	}
	return h
}

// nodeState is a node's state, with the switch it is in.
func nodeState(n controlapi.Node) string {
	if n.Switch != nil {
		return fmt.Sprintf("%s->%s (%s)", n.State, n.Switch.To, n.Switch.Phase)
	}
	return n.State
}

func nodeRow(n controlapi.Node, wide bool) string {
	role := n.Role
	if role != "" {
		role = strings.ToUpper(role[:1]) + " " + role
	}
	row := fmt.Sprintf("%s\t%s\t%s\t%s\t%d\t%d\t%.0f%%\t%.0f%%", n.ID, role, n.Mode, nodeState(n),
		n.Waiting, n.Running, 100*n.GPUKVUsage, 100*n.HostKVUsage)
	if wide {
		token := "open"
		if n.TokenRequired {
			token = "required"
		}
		row += fmt.Sprintf("\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%s", n.InFlight, n.GPUBlocks, n.HostBlocks, n.KVBlocksLeftOut, n.Passes, ago(n.LastSeen), token, n.Address)
	}
	return row
}

// columns lays a tab-separated row out in the watch's fixed columns (a
// wider cell pushes the rest of its row along).
func columns(row string) string {
	widths := []int{12, 10, 7, 34, 6, 8, 7, 8, 10, 11, 12, 9, 9, 12, 10}
	cells := strings.Split(row, "\t")
	var b strings.Builder
	for i, c := range cells {
		if i < len(widths) && i < len(cells)-1 {
			fmt.Fprintf(&b, "%-*s", widths[i], c)
			if len(c) >= widths[i] {
				b.WriteString(" ")
			}
			continue
		}
		b.WriteString(c)
	}
	return b.String()
}

// watchNodes follows the control API's watch stream: the table, then a
// row whenever a node's role, mode or state changes (JSON: a node's line
// whenever more than its last_seen changed). A broken stream is reopened; its snapshot prints only
// what changed meanwhile. Ctrl-C ends it.
func watchNodes(cmd *cobra.Command) error {
	format, _ := cmd.Flags().GetString("output")
	switch format {
	case "table", "wide", "json":
	default:
		return usageError{cmd: cmd.CommandPath(), err: fmt.Errorf("--watch prints table, wide or json (one object per line), not %q", format)}
	}
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	c := newControlClient(cmd)
	// Unreachable or refused at the start: say so at once, as the list
	// does, rather than retry a cluster that is not there.
	var nodes []controlapi.Node
	if err := c.do(ctx, "GET", "/api/v1/nodes", nil, &nodes); err != nil {
		return err
	}
	api := &controlapi.Client{Base: c.base, Token: c.token}
	out := cmd.OutOrStdout()
	wide := format == "wide"
	shown := map[string]string{} // what was last printed of each node: role, mode, state; in JSON, all but last_seen
	headed := false
	enc := json.NewEncoder(out)
	enc.SetEscapeHTML(false)
	show := func(n controlapi.Node) {
		if format == "json" {
			// A heartbeat moves last_seen every second: a node is
			// printed again when anything else changed.
			same := n
			same.LastSeen = time.Time{}
			b, _ := json.Marshal(same)
			if shown[n.ID] == string(b) {
				return
			}
			shown[n.ID] = string(b)
			enc.Encode(n)
			return
		}
		key := n.Role + "\t" + n.Mode + "\t" + nodeState(n)
		if shown[n.ID] == key {
			return
		}
		shown[n.ID] = key
		// Rows come one at a time: fixed columns keep them aligned.
		if !headed {
			fmt.Fprintln(out, columns(nodeHeader(wide)))
			headed = true
		}
		fmt.Fprintln(out, columns(nodeRow(n, wide)))
	}
	for attempt := 0; ; attempt++ {
		events := make(chan controlapi.WatchEvent, 64)
		errc := make(chan error, 1)
		go func() { errc <- api.Watch(ctx, "/api/v1/watch", events) }()
	read:
		for {
			select {
			case ev := <-events:
				attempt = 0
				for _, n := range ev.Nodes {
					show(n)
				}
				if ev.Node != nil {
					show(*ev.Node)
				}
			case err := <-errc:
				if ctx.Err() != nil {
					return nil
				}
				if attempt >= 5 {
					return &plainError{msg: fmt.Sprintf("watch %s: %s", c.base, netCause(err)), err: err}
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "watch: %s; reconnecting\n", netCause(err))
				break read
			case <-ctx.Done():
				return nil
			}
		}
		if !sleepCtx(ctx, time.Duration(attempt+1)*time.Second) {
			return nil
		}
	}
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
role to it and lets its requests in flight end: a decode node running
evolve's engine hands its running answers over to a peer decode node, which
pulls their KV and writes the rest of each answer into the same stream, as
the client would have read it anyway (vLLM's engines finish theirs where
they are). It then offloads the node's GPU KV to its host pool (the context
stays reachable), flips the engine and resumes; no request is dropped.

The command watches until the switch is done and says how many answers
moved; --detach returns at once, and Ctrl-C stops watching, not the switch.
--pin keeps the planner from moving the node again ('evolve role auto NODE'
undoes it).`,
		Example: `  evolve role set engine-2 decode --pin
  evolve role set engine-2 prefill --detach`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 2 && args[1] != "prefill" && args[1] != "decode" {
				return usageError{cmd: cmd.CommandPath(), err: fmt.Errorf("unknown role %q: want prefill or decode", args[1])}
			}
			if len(args) != 2 {
				return usageError{cmd: cmd.CommandPath(), err: fmt.Errorf("want NODE and a role, prefill or decode")}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			c := newControlClient(cmd)
			id, role := args[0], args[1]
			pin := config.GetBool(cfgKey(cmd) + ".pin")
			var st controlapi.Node
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
				st = controlapi.Node{} // omitted fields (switch) must not linger
				if err := c.do(ctx, "GET", "/api/v1/nodes/"+id, nil, &st); err != nil {
					return err
				}
			}
			if st.Role != role {
				return fmt.Errorf("switch of %s to %s failed; it stays %s (see its history: evolve nodes -o json)", id, role, st.Role)
			}
			handed := ""
			if h := st.History; len(h) > 0 && h[len(h)-1].HandedOver > 0 {
				handed = fmt.Sprintf("; %s handed over to peer decode nodes on the way", counted(h[len(h)-1].HandedOver, "answer"))
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "%s: now %s (%s)%s\n", id, st.Role, st.Mode, handed)
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
			var st controlapi.Node
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
	return commandGroup(cmd)
}

// completeNodes offers the node ids of the cluster for shell completion.
func completeNodes(cmd *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	if err := loadConfig(cmd); err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var nodes []controlapi.Node
	if newControlClient(cmd).do(cmd.Context(), "GET", "/api/v1/nodes", nil, &nodes) != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	ids := make([]string, len(nodes))
	for i, n := range nodes {
		ids[i] = n.ID + "\t" + n.Role + ", " + n.State
	}
	return ids, cobra.ShellCompDirectiveNoFileComp
}

// roundDays writes a duration as days when it is that long, else hours
// and minutes.
func roundDays(d time.Duration) string {
	if d >= 48*time.Hour {
		return fmt.Sprintf("%d days", int(d.Hours()/24))
	}
	return d.Round(time.Minute).String()
}
