package sim

import (
	"math"
	"sort"
	"time"

	"github.com/evolvellm/evolve/engine/stepmodel"
	"github.com/evolvellm/evolve/roles"
)

// Dynamo's older SLA planner, the dynamo-sla baseline
// (docs/baselines.md): every 180 s it predicts the
// next interval's request rate, input and output lengths (the last
// interval's, Dynamo's constant predictor), and sizes each pool from the
// throughput one engine reaches under the TTFT and ITL targets, as
// Dynamo's profiler measures it offline; here the profile is read from the
// engine cost model, the same one the engines run. Pools change all at
// once, within the cluster's budget, by adding cold workers and removing
// others (5 s of grace, then their requests abort and are sent again).
const (
	slaInterval = 180 * time.Second
	// The SLA targets the profile is taken under (Dynamo's examples use
	// TTFT in hundreds of milliseconds and ITL in tens).
	slaTTFT = 500 * time.Millisecond
	slaITL  = 50 * time.Millisecond
)

// slaWindow is what the SLA planner observes over an interval.
type slaWindow struct {
	arrivals      int
	isl, osl      int64
	intervalStart time.Time
}

func (r *run) slaObserve(prompt, output int) {
	r.sla.arrivals++
	r.sla.isl += int64(prompt)
	r.sla.osl += int64(output)
}

// slaPlan sizes the pools for the next interval.
func (r *run) slaPlan() {
	r.push(&event{at: r.now.Add(slaInterval), kind: evSLA})
	w := r.sla
	r.sla = slaWindow{intervalStart: r.now}
	if w.arrivals == 0 {
		return
	}
	rate := float64(w.arrivals) / slaInterval.Seconds()
	isl := float64(w.isl) / float64(w.arrivals)
	osl := float64(w.osl) / float64(w.arrivals)
	p, d := r.slaReplicas(rate, isl, osl)
	r.slaWant = [2]int{p, d}
	r.shrink(roles.Prefill, p)
	r.shrink(roles.Decode, d)
	r.slaFill()
}

// slaFill adds cold workers to pools below their target while the budget
// has free slots (removed workers free theirs after their grace).
func (r *run) slaFill() {
	for k, role := range []roles.Role{roles.Prefill, roles.Decode} {
		have := 0
		for _, e := range r.engines {
			if e.role == role && (e.state == engActive || e.state == engStarting) {
				have++
			}
		}
		for ; have < r.slaWant[k] && r.freeSlot(); have++ {
			r.addWorker(role)
		}
	}
}

func (r *run) freeSlot() bool {
	for _, e := range r.engines {
		if e.state == engOff {
			return true
		}
	}
	return false
}

// slaReplicas is Dynamo's formula for this run's cluster (see
// dynamoReplicas).
func (r *run) slaReplicas(rate, isl, osl float64) (p, d int) {
	return dynamoReplicas(r.sc.Profile, r.engines[0].model.Config(), len(r.engines), rate, isl, osl)
}

// dynamoReplicas is Dynamo's formula: replicas = demand / per-engine
// throughput under the SLA, rounded up, then fitted into a budget of total
// engines configured as cfg.
func dynamoReplicas(pr *stepmodel.Profile, cfg stepmodel.Config, total int, rate, isl, osl float64) (p, d int) {
	// Prefill: full passes of the token budget over prompts of length isl
	// (the profiler runs without prefix caching).
	b := float64(cfg.MaxNumBatchedTokens)
	all, topK := pr.PrefillPairs(0, int(isl))
	perTok := pr.PrefillTokenSec(1) + pr.PrefillAttentionSec(all, topK)/max(isl, 1)
	prefillTput := b / (pr.Prefill.BaseMs*1e-3 + b*perTok)
	// A prompt must also meet the TTFT target alone; longer ones cannot,
	// and the profiler's throughput is what it is.
	p = int(math.Ceil(rate * isl / prefillTput))
	// Decode: the largest batch whose step stays under the ITL target at
	// the mean context, within max_num_seqs and the KV capacity (the step
	// grows with the batch, not always in a straight line: search it).
	ctx := isl + osl/2
	limit := min(cfg.MaxNumSeqs, int(float64(cfg.GPUBlocks*pr.BlockSize)/ctx))
	batch := max(sort.Search(limit, func(b int) bool { return pr.DecodeStepSec(b+1, ctx) > slaITL.Seconds() }), 1)
	itl := pr.DecodeStepSec(batch, ctx)
	decodeTput := float64(batch) / itl
	d = int(math.Ceil(rate * osl / decodeTput))
	p, d = max(p, 1), max(d, 1)
	if p+d > total {
		// Over budget: scale both down in proportion, at least one each.
		p = scaleSplit(p, d, total)
		d = total - p
	}
	return p, d
}

// shrink removes the least loaded serving workers of a pool above want.
func (r *run) shrink(role roles.Role, want int) {
	var active []int
	have := 0
	for i, e := range r.engines {
		if e.role != role {
			continue
		}
		switch e.state {
		case engActive:
			active = append(active, i)
			have++
		case engStarting:
			have++
		}
	}
	for ; have > want && len(active) > 1; have-- {
		k := r.leastLoaded(active)
		r.removeWorker(active[k])
		active = append(active[:k], active[k+1:]...)
	}
}
