package orchestrator

import (
	"github.com/prometheus/client_golang/prometheus"
)

// clusterCollector gives the cluster's state at each scrape: nodes by role
// and state (alerts on nodes down, or on no prefill node serving), the KV
// directory and the agents' branches, and the totals of lost KV reuse and
// bytes moved, so that Prometheus keeps what 'evolve nodes' and 'evolve
// kv' show now.
type clusterCollector struct{ o *Orchestrator }

var (
	nodesDesc = prometheus.NewDesc("evolve_nodes",
		"Nodes by role and state (serving, switching, draining, down, rejected), as the router sees them.", []string{"role", "state"}, nil)
	kvBlocksDesc = prometheus.NewDesc("evolve_kv_directory_blocks",
		"Distinct KV blocks the cluster-wide directory knows a copy of.", nil, nil)
	kvReplicasDesc = prometheus.NewDesc("evolve_kv_directory_copies",
		"KV block copies the directory knows, on every node and tier.", nil, nil)
	kvReferencedDesc = prometheus.NewDesc("evolve_kv_referenced_blocks",
		"KV blocks a live agent branch references.", nil, nil)
	kvCapacityDesc = prometheus.NewDesc("evolve_kv_pool_capacity_blocks",
		"KV capacity of the serving nodes, per tier (gpu, host), in blocks.", []string{"tier"}, nil)
	kvCachedDesc = prometheus.NewDesc("evolve_kv_pool_cached_blocks",
		"KV block copies cached on the serving nodes, per tier.", []string{"tier"}, nil)
	branchesDesc = prometheus.NewDesc("evolve_branches_live",
		"Agent branches alive (active, or waiting on a tool).", nil, nil)
	lostReuseDesc = prometheus.NewDesc("evolve_kv_lost_reuse_tokens_total",
		"Prompt tokens recomputed that some engine had computed before (the research system's lost KV reuse).", nil, nil)
	bytesMovedDesc = prometheus.NewDesc("evolve_kv_moved_bytes_total",
		"KV bytes moved between nodes: fetched blocks and prefill-to-decode transfers.", nil, nil)
	orchestratorsDesc = prometheus.NewDesc("evolve_orchestrators",
		"Orchestrators sharing the event plane as this one sees them, itself included, by state (up; silent: not heard for 3 s).", []string{"state"}, nil)
	leadersDesc = prometheus.NewDesc("evolve_planner_leaders",
		"Orchestrators that lead the planner now, as this one sees them: 1; 0 while the lease moves after a leader's loss, or while none can hold it.", nil, nil)
	leftOutDesc = prometheus.NewDesc("evolve_node_kv_blocks_left_out_total",
		"KV blocks a node's engine could not report to the router's directory (vLLM's blocks of adapters, with extra keys, or whose parent was never stored): the router cannot route to them. The engine's log says why.", []string{"node"}, nil)
)

// nodeStates are the states every role reports, at 0 when no node has
// them, so that a graph or an alert never sees a series vanish.
var nodeStates = []string{StateServing, StateSwitching, StateDraining, StateDown, StateRejected}

func (c clusterCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{nodesDesc, kvBlocksDesc, kvReplicasDesc, kvReferencedDesc, kvCapacityDesc, kvCachedDesc,
		branchesDesc, lostReuseDesc, bytesMovedDesc, leftOutDesc, orchestratorsDesc, leadersDesc} {
		ch <- d
	}
}

func (c clusterCollector) Collect(ch chan<- prometheus.Metric) {
	kv := c.o.KV()
	counts := map[[2]string]int{}
	for _, role := range []string{"prefill", "decode", "both"} {
		for _, st := range nodeStates {
			counts[[2]string{role, st}] = 0
		}
	}
	for _, n := range kv.Nodes {
		counts[[2]string{n.Role, n.State}]++
	}
	for k, n := range counts {
		ch <- prometheus.MustNewConstMetric(nodesDesc, prometheus.GaugeValue, float64(n), k[0], k[1])
	}
	gauge := func(d *prometheus.Desc, v int, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v), labels...)
	}
	gauge(kvBlocksDesc, kv.Blocks)
	gauge(kvReplicasDesc, kv.Replicas)
	gauge(kvReferencedDesc, kv.ReferencedBlocks)
	gauge(branchesDesc, kv.LiveBranches)
	gauge(kvCapacityDesc, kv.Pool.GPUCapacity, "gpu")
	gauge(kvCapacityDesc, kv.Pool.HostCapacity, "host")
	gauge(kvCachedDesc, kv.Pool.GPUCached, "gpu")
	gauge(kvCachedDesc, kv.Pool.HostCached, "host")
	ch <- prometheus.MustNewConstMetric(lostReuseDesc, prometheus.CounterValue, float64(kv.LostKVReuse))
	ch <- prometheus.MustNewConstMetric(bytesMovedDesc, prometheus.CounterValue, float64(kv.BytesMoved))
	states, leaders := map[string]int{"up": 0, "silent": 0}, 0
	for _, o := range c.o.Orchestrators() {
		states[o.State]++
		if o.Leader {
			leaders++
		}
	}
	for st, n := range states {
		gauge(orchestratorsDesc, n, st)
	}
	gauge(leadersDesc, leaders)
	for _, n := range c.o.Nodes() {
		ch <- prometheus.MustNewConstMetric(leftOutDesc, prometheus.CounterValue, float64(n.KVBlocksLeftOut), n.ID)
	}
}
