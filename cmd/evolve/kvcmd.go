package main

import (
	"fmt"
	"net/url"
	"strings"
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
(DELETE /v1/sessions/S on the router) or a branch lets its KV go first.`,
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
	for i, b := range tree {
		if depth[i] == 0 && (i == 0 || tree[i-1].Session != b.Session) {
			fmt.Fprintf(w, "%s\t\t\t\t\t\n", b.Session)
		}
		idle := "-"
		if b.State != "active" {
			idle = time.Since(b.LastUsed).Round(time.Second).String()
		}
		fmt.Fprintf(w, "%s└ %s\t%s\t%d\t%d\t%s\t%s", strings.Repeat("  ", depth[i]), b.Branch, b.State, b.Blocks, b.Turns, idle, tui.Where(b))
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
between nodes.`,
		Example: `  evolve kv
  evolve kv -o json | jq .lost_kv_reuse_tokens`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var st orchestrator.KVStatus
			if err := newControlClient(cmd).do(cmd.Context(), "GET", "/api/v1/kv", nil, &st); err != nil {
				return err
			}
			return output(cmd, st, func(w *tabwriter.Writer, _ bool) {
				fmt.Fprintln(w, "NODE\tROLE\tSTATE\tGPU USE\tGPU CACHED\tREFERENCED\tHOST USE\tHOST CACHED\tREFERENCED")
				for _, n := range st.Nodes {
					fmt.Fprintf(w, "%s\t%s\t%s\t%.0f%% of %d\t%d\t%d\t%.0f%% of %d\t%d\t%d\n", n.ID, n.Role, n.State,
						n.GPUUsage*100, n.GPUCapacity, n.GPUCached, n.GPUReferenced, n.HostUsage*100, n.HostCapacity, n.HostCached, n.HostReferenced)
				}
				p := st.Pool
				fmt.Fprintf(w, "cluster (serving)\t\t\t%d\t%d\t%d\t%d\t%d\t%d\n", p.GPUCapacity, p.GPUCached, p.GPUReferenced, p.HostCapacity, p.HostCached, p.HostReferenced)
				fmt.Fprintln(w)
				fmt.Fprintf(w, "pool\tGPU %d of %d blocks free, host %d of %d free; %d GPU and %d host copies referenced\n",
					p.GPUFree, p.GPUCapacity, p.HostFree, p.HostCapacity, p.GPUReferenced, p.HostReferenced)
				fmt.Fprintf(w, "directory\t%d blocks, %d copies; %d blocks referenced by %d live branches\n", st.Blocks, st.Replicas, st.ReferencedBlocks, st.LiveBranches)
				fmt.Fprintf(w, "prompt tokens\t%d: %.1f%% GPU hit, %.1f%% host hit (%d own host, %d fetched), %d recomputed\n",
					st.PromptTokens, st.GPUHitRate*100, st.HostHitRate*100, st.LocalHostTokens, st.RemoteHostTokens, st.RecomputedTokens)
				fmt.Fprintf(w, "lost KV reuse\t%d tokens recomputed that had been computed before\n", st.LostKVReuse)
				fmt.Fprintf(w, "moved\t%.1f MiB between nodes\n", float64(st.BytesMoved)/(1<<20))
			})
		},
	}
	addClientFlags(cmd)
	addOutputFlag(cmd, "table, json or yaml")
	return cmd
}
