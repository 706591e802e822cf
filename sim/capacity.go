package sim

import (
	"fmt"
	"math"
	"sort"
	"time"
)

// Capacity is what a cluster can serve of a workload, as the grid sizes
// its load levels: the request rate the best fixed split sustains with
// every engine at the throughput it reaches under Dynamo's SLA targets
// (a prefill engine in full passes of its token budget over the prompt
// tokens the probe saw computed, at their context; a decode engine at
// the largest batch whose step stays under the ITL target at the mean
// decode context, within max_num_seqs and its GPU KV), the formula of
// Dynamo's SLA planner and profiler (dynamoReplicas) with prefix caching
// counted. An agent's request rate is measured unloaded, by a probe of
// a few agents on the same cluster, so Agents(f) is how many agents
// offer f times that capacity.
type Capacity struct {
	ProbeAgents      int     `json:"probe_agents"`
	RequestsPerAgent float64 `json:"requests_per_agent_s"` // unloaded
	ComputedTokens   float64 `json:"computed_tokens_per_request"`
	PromptTokens     float64 `json:"prompt_tokens_per_request"`
	OutputTokens     float64 `json:"output_tokens_per_request"`
	PrefillTokPerSec float64 `json:"prefill_tok_s_per_engine"`
	DecodeTokPerSec  float64 `json:"decode_tok_s_per_engine"`
	DecodeBatch      int     `json:"decode_batch"`
	BestPrefill      int     `json:"best_prefill"`    // the split that sustains the most
	RequestsPerSec   float64 `json:"requests_per_s"`  // the cluster's capacity
	CapacityAgents   float64 `json:"capacity_agents"` // agents that offer it
}

// Agents is the number of agents that offer share f of the capacity (at
// least one).
func (c Capacity) Agents(f float64) int { return max(1, int(math.Round(f*c.CapacityAgents))) }

// EstimateCapacity probes sc's cluster with probeAgents agents at evolve's
// recipe split (1:2, no planner), over sc's warm-up and scored time, and
// returns what it can serve (see Capacity). cancelled, when set, stops
// the probe (an *InterruptedError).
func EstimateCapacity(sc Scenario, probeAgents int, cancelled func() bool) (Capacity, error) {
	probe := sc
	probe.Agents, probe.Trace = probeAgents, nil
	if err := probe.Validate(); err != nil {
		return Capacity{}, err
	}
	recipe := max(1, sc.Engines/3)
	pol, err := ParsePolicy(fmt.Sprintf("static:%d:%d", recipe, sc.Engines-recipe), sc.Engines)
	if err != nil {
		return Capacity{}, err
	}
	var rh runHooks
	if cancelled != nil {
		rh.progress = func(_, _ time.Duration) bool { return cancelled() }
	}
	res, err := runWith(probe, pol, rh)
	if err != nil {
		return Capacity{}, err
	}
	if res.Requests == 0 {
		return Capacity{}, fmt.Errorf("capacity probe: %d %s agents finished no request in %v", probeAgents, sc.Workload, sc.Duration)
	}
	n := float64(res.Requests)
	c := Capacity{ProbeAgents: probeAgents,
		RequestsPerAgent: n / sc.Duration.Seconds() / float64(probeAgents),
		ComputedTokens:   float64(res.ComputedTokens) / n, PromptTokens: float64(res.PromptTokens) / n,
		OutputTokens: res.Throughput * sc.Duration.Seconds() / n}
	pr, cfg := sc.Profile, pol.engineConfig().WithDefaults(sc.Profile)
	// Prefill: full passes over the computed tokens, attending to the
	// cached part before them.
	comp := max(c.ComputedTokens, 1)
	all, topK := pr.PrefillPairs(int(c.PromptTokens-comp), int(comp))
	perTok := pr.PrefillTokenSec(1) + pr.PrefillAttentionSec(all, topK)/comp
	b := float64(cfg.MaxNumBatchedTokens)
	c.PrefillTokPerSec = b / (pr.Prefill.BaseMs*1e-3 + b*perTok)
	// Decode: the largest batch under the ITL target.
	ctx := c.PromptTokens + c.OutputTokens/2
	limit := max(1, min(cfg.MaxNumSeqs, int(float64(cfg.GPUBlocks*pr.BlockSize)/max(ctx, 1))))
	c.DecodeBatch = max(sort.Search(limit, func(k int) bool { return pr.DecodeStepSec(k+1, ctx) > slaITL.Seconds() }), 1)
	c.DecodeTokPerSec = float64(c.DecodeBatch) / pr.DecodeStepSec(c.DecodeBatch, ctx)
	for p := 1; p < sc.Engines; p++ {
		rate := math.Inf(1)
		if c.ComputedTokens > 0 {
			rate = float64(p) * c.PrefillTokPerSec / c.ComputedTokens
		}
		if c.OutputTokens > 0 {
			rate = min(rate, float64(sc.Engines-p)*c.DecodeTokPerSec/c.OutputTokens)
		}
		if rate > c.RequestsPerSec {
			c.RequestsPerSec, c.BestPrefill = rate, p
		}
	}
	c.CapacityAgents = c.RequestsPerSec / c.RequestsPerAgent
	return c, nil
}
