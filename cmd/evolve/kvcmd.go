package main

import (
	"fmt"
	"net/url"
	"text/tabwriter"
	"time"

	"github.com/evolvellm/evolve/orchestrator"
	"github.com/evolvellm/evolve/tui"
	"github.com/spf13/cobra"
)

func newBranchesCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "branches",
		Short: "Show the agent sessions and branches, their state and where their KV lives",
		Long: `Show the agent branches the orchestrator tracks: the session tree (a
branch forked from or rewriting its parent is listed under it), each
branch's state (active: a request in flight; waiting: on a tool call, it
will be back; ended, with why), the blocks of its context and where they
live, per node and tier.

Agents name their session and branch with the headers X-Evolve-Session,
X-Evolve-Branch and X-Evolve-Parent-Branch (X-Evolve-Rewrite: true when the
branch replaces its parent, as a compaction does), or the same fields in
the body's metadata (session, branch, parent_branch, rewrite); without a
branch, it is inferred from the session's context. Ending a session
(DELETE /v1/sessions/S on the router) or a branch lets its KV go first.

WHERE names the node holding most of the branch's blocks (G: GPU copies,
H: host copies) and how many more nodes hold some; -o wide lists every
node, and why ended branches ended.`,
		Example: `  evolve branches
  evolve branches --session a7-s3
  evolve branches -o json | jq '.[] | select(.state=="waiting") | .blocks'`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			path := "/api/v1/branches"
			none := "no agent branches (requests that name their session, by X-Evolve-Session or metadata.session, make them)"
			if s, _ := cmd.Flags().GetString("session"); s != "" {
				path += "?session=" + url.QueryEscape(s)
				none = fmt.Sprintf("no branches of session %q (a session's branches go when it ends or idles out)", s)
			}
			var bs []orchestrator.BranchStatus
			if err := newControlClient(cmd).do(cmd.Context(), "GET", path, nil, &bs); err != nil {
				return err
			}
			return output(cmd, bs, func(w *tabwriter.Writer, wide bool) {
				if len(bs) == 0 {
					fmt.Fprintln(w, none)
					return
				}
				printBranches(w, bs, wide)
			})
		},
	}
	cmd.Flags().String("session", "", "only this session")
	addClientFlags(cmd)
	addOutputFlag(cmd, "table, wide, json or yaml")
	return cmd
}

// printBranches prints each session as a tree: branches under the branch
// they forked from (evolve top's order).
func printBranches(w *tabwriter.Writer, raw []orchestrator.BranchStatus, wide bool) {
	fmt.Fprint(w, "SESSION / BRANCH\tSTATE\tBLOCKS\tTURNS\tIDLE\tWHERE")
	if wide {
		fmt.Fprint(w, "\tWHY ENDED")
	}
	fmt.Fprintln(w)
	bs := make([]tui.Branch, len(raw))
	why := map[string]string{}
	for i, b := range raw {
		bs[i] = tui.Branch{Session: b.Session, Branch: b.Branch, Parent: b.Parent, State: b.State, Blocks: b.Blocks,
			Turns: b.Turns, LastUsed: b.LastUsed}
		for _, r := range b.Residency {
			bs[i].Residency = append(bs[i].Residency, tui.Residency{Node: r.Node, GPU: r.GPU, Host: r.Host})
		}
		why[b.Session+"/"+b.Branch] = b.EndReason
	}
	tree, depth := tui.Tree(bs, "")
	// The session's line is the root of its branches' tree: ├ for a
	// branch with a sibling below it, └ for the last.
	newSession := func(i int) bool { return depth[i] == 0 && (i == 0 || tree[i-1].Session != tree[i].Session) }
	var levels []int
	for i := range tree {
		if newSession(i) {
			levels = append(levels, 0)
		}
		levels = append(levels, depth[i]+1)
	}
	drawn, k := tui.TreePrefix(levels), 0
	for i, b := range tree {
		if newSession(i) {
			fmt.Fprintf(w, "%s\t\t\t\t\t\n", b.Session)
			k++
		}
		prefix := drawn[k]
		k++
		idle := "-"
		if b.State != "active" {
			idle = time.Since(b.LastUsed).Round(time.Second).String()
		}
		where := tui.Where(b)
		if !wide {
			where = tui.WhereShort(b)
		}
		fmt.Fprintf(w, "%s%s\t%s\t%d\t%d\t%s\t%s", prefix, b.Branch, b.State, b.Blocks, b.Turns, idle, where)
		if wide {
			fmt.Fprintf(w, "\t%s", why[b.Session+"/"+b.Branch])
		}
		fmt.Fprintln(w)
	}
}

func newKVCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "kv",
		Short: "Summarise the cluster's KV: capacity, use, references, hit rates, lost reuse",
		Long: `Summarise the cluster's KV cache: per node, capacity and use of the GPU and
host tiers, the copies the directory knows and how many of them live agent
branches reference; for the cluster, prompt tokens by where their KV came
from (GPU hit, own host tier, fetched from a peer, recomputed), lost KV reuse
(tokens recomputed that some engine had computed before) and bytes moved
between nodes.

Per tier, as shares of its capacity: USE is what running sequences hold,
CACHED the copies the directory knows there (in use or not), REF those of
them that a live agent branch references. The cluster row is the serving
nodes together. Counts below the table are rounded (17.2K); -o wide prints
the per-node counts exact with each tier's capacity in BLOCKS, and adds the
referenced copies each node evicted from each tier and how many of them
were the cluster's last copy (that context must be recomputed).`,
		Example: `  evolve kv
  evolve kv -o wide
  evolve kv -o json | jq .lost_kv_reuse_tokens`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var st orchestrator.KVStatus
			if err := newControlClient(cmd).do(cmd.Context(), "GET", "/api/v1/kv", nil, &st); err != nil {
				return err
			}
			return output(cmd, st, func(w *tabwriter.Writer, wide bool) { printKV(w, st, wide) })
		},
	}
	addClientFlags(cmd)
	addOutputFlag(cmd, "table (shares of capacity, to fit 80 columns), wide (exact counts, and the referenced copies each node evicted), json or yaml")
	return cmd
}

// printKV prints the KV summary: a row per node and one for the serving
// nodes together, then the cluster's figures. The table gives each tier's
// use, cached copies and referenced copies as shares of its capacity, so
// that it fits 80 columns at any scale, and rounds the counts below it
// (17.2K); wide gives the counts exact, per node, with each tier's
// capacity, and the referenced copies the node evicted and how many of
// those were the cluster's last copy.
func printKV(w *tabwriter.Writer, st orchestrator.KVStatus, wide bool) {
	n := func(v int64) string { return count(v, wide) }
	i := func(v int) string { return count(int64(v), wide) }
	p := st.Pool
	if wide {
		fmt.Fprintln(w, "\t\t\tGPU\t\t\t\tHOST\t\t\t\tEVICTED")
		fmt.Fprintln(w, "NODE\tROLE\tSTATE\tBLOCKS\tUSE\tCACHED\tREF\tBLOCKS\tUSE\tCACHED\tREF\tREF GPU\tREF HOST\tLAST COPY")
		for _, k := range st.Nodes {
			fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\t%d\t%d\t%d\t%s\t%d\t%d\t%d\t%d\t%d\n", k.ID, k.Role, k.State,
				k.GPUCapacity, share(k.GPUUsage), k.GPUCached, k.GPUReferenced,
				k.HostCapacity, share(k.HostUsage), k.HostCached, k.HostReferenced, k.RefEvictedGPU, k.RefEvictedHost, k.RefLost)
		}
		fmt.Fprintf(w, "cluster\t\tserving\t%d\t\t%d\t%d\t%d\t\t%d\t%d\n", p.GPUCapacity, p.GPUCached, p.GPUReferenced,
			p.HostCapacity, p.HostCached, p.HostReferenced)
	} else {
		// of is v as a share of capacity c.
		of := func(v float64, c int) string {
			if c <= 0 {
				return "-"
			}
			return share(v / float64(c))
		}
		ofi := func(v, c int) string { return of(float64(v), c) }
		fmt.Fprintln(w, "\t\t\tGPU\t\t\tHOST")
		fmt.Fprintln(w, "NODE\tROLE\tSTATE\tUSE\tCACHED\tREF\tUSE\tCACHED\tREF")
		var gpuUse, hostUse float64
		for _, k := range st.Nodes {
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", k.ID, k.Role, k.State,
				share(k.GPUUsage), ofi(k.GPUCached, k.GPUCapacity), ofi(k.GPUReferenced, k.GPUCapacity),
				share(k.HostUsage), ofi(k.HostCached, k.HostCapacity), ofi(k.HostReferenced, k.HostCapacity))
			if k.State == orchestrator.StateServing {
				gpuUse += k.GPUUsage * float64(k.GPUCapacity)
				hostUse += k.HostUsage * float64(k.HostCapacity)
			}
		}
		fmt.Fprintf(w, "cluster\t\tserving\t%s\t%s\t%s\t%s\t%s\t%s\n",
			of(gpuUse, p.GPUCapacity), ofi(p.GPUCached, p.GPUCapacity), ofi(p.GPUReferenced, p.GPUCapacity),
			of(hostUse, p.HostCapacity), ofi(p.HostCached, p.HostCapacity), ofi(p.HostReferenced, p.HostCapacity))
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "pool\tGPU %s of %s blocks free, host %s of %s free\n", i(p.GPUFree), i(p.GPUCapacity), i(p.HostFree), i(p.HostCapacity))
	fmt.Fprintf(w, "directory\t%s blocks in %s copies\n", i(st.Blocks), i(st.Replicas))
	fmt.Fprintf(w, "referenced\t%s blocks by %s branches: %s GPU and %s host copies\n",
		i(st.ReferencedBlocks), i(st.LiveBranches), i(p.GPUReferenced), i(p.HostReferenced))
	ofPrompt := func(v int64) string {
		if st.PromptTokens == 0 {
			return "0%"
		}
		return fmt.Sprintf("%.1f%%", float64(v)*100/float64(st.PromptTokens))
	}
	fmt.Fprintf(w, "prompt tokens\t%s: %s GPU hit, %s host hit, %s recomputed\n", n(st.PromptTokens),
		ofPrompt(st.GPUHitTokens), ofPrompt(st.LocalHostTokens+st.RemoteHostTokens), ofPrompt(st.RecomputedTokens))
	fmt.Fprintf(w, "host hits\t%s from the node's own host tier, %s fetched from peers\n", n(st.LocalHostTokens), n(st.RemoteHostTokens))
	fmt.Fprintf(w, "lost KV reuse\t%s tokens recomputed that had been computed before\n", n(st.LostKVReuse))
	fmt.Fprintf(w, "moved\t%s between nodes\n", bytesIEC(st.BytesMoved))
}

// share shows a fraction as a percentage in at most five characters, with
// a decimal under 10% so that a little is not shown as none: 0%, <0.1%,
// 0.3%, 42%.
func share(f float64) string {
	switch {
	case f <= 0:
		return "0%"
	case f < 0.0005:
		return "<0.1%"
	case f < 0.0995:
		return fmt.Sprintf("%.1f%%", f*100)
	default:
		return fmt.Sprintf("%.0f%%", f*100)
	}
}

// count shows a count exactly when wide or under 10,000, and otherwise in
// at most six characters: 17.2K, 231.5M.
func count(v int64, wide bool) string {
	a := v
	if a < 0 {
		a = -a
	}
	switch {
	case wide || a < 10_000:
		return fmt.Sprint(v)
	case a < 999_950:
		return fmt.Sprintf("%.1fK", float64(v)/1e3)
	case a < 999_950_000:
		return fmt.Sprintf("%.1fM", float64(v)/1e6)
	default:
		return fmt.Sprintf("%.1fG", float64(v)/1e9)
	}
}

// bytesIEC shows a byte count in binary units: 512 B, 3.2 MiB, 165.9 GiB.
func bytesIEC(b int64) string {
	const unit = 1024
	if b < unit {
		return fmt.Sprintf("%d B", b)
	}
	v, k := float64(b)/unit, 0
	for v >= unit && k < 5 {
		v /= unit
		k++
	}
	return fmt.Sprintf("%.1f %ciB", v, "KMGTPE"[k])
}
