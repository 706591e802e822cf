package orchestrator

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/evolvellm/evolve/kv"
	"github.com/evolvellm/evolve/orchestrator/routing"
	"github.com/evolvellm/evolve/planner"
	"github.com/evolvellm/evolve/protocol"
	"github.com/evolvellm/evolve/roles"
	"github.com/nats-io/nats.go"
)

// Planner modes.
const (
	PlannerAuto      = "auto"      // learn, recommend and move auto nodes
	PlannerRecommend = "recommend" // learn and recommend; never move
	PlannerOff       = "off"
)

// planning is the orchestrator's planner and what it needs from the
// cluster; mu guards p (the planner is not safe for concurrent use).
type planning struct {
	mu      sync.Mutex
	p       *planner.Planner
	limited bool // limits taken from the first registration
	// prefillSec is the learned prefill cost per token in wall seconds
	// (0 until trusted), for the router; read without mu.
	prefillSec atomic.Uint64
}

func newPlanning(cfg Config) *planning {
	pc := cfg.Planner
	pc.Disabled = cfg.PlannerMode == PlannerRecommend
	return &planning{p: planner.New(pc)}
}

// planLimits takes the engines' limits from a registration (all engines
// of a cluster serve the same model with the same block size).
func (o *Orchestrator) planLimits(reg protocol.Registration) {
	if o.plan == nil {
		return
	}
	o.plan.mu.Lock()
	defer o.plan.mu.Unlock()
	if o.plan.limited || reg.GPUBlocks <= 0 {
		return
	}
	o.plan.limited = true
	// The profile's copy times are modelled; the planner prices in wall
	// time, as it learns pass costs (onStats).
	speedup := 1.0
	if reg.Speedup > 0 {
		speedup = reg.Speedup
	}
	hostSec, netSec := 0.0, 0.0
	if reg.HostGBps > 0 {
		hostSec = float64(reg.BlockSize*reg.KVBytesPerToken) / (reg.HostGBps * 1e9) / speedup
	}
	if reg.NetworkGBps > 0 {
		netSec = float64(reg.BlockSize*reg.KVBytesPerToken) / (reg.NetworkGBps * 1e9) / speedup
	}
	// An engine that does not say its pass budget (a vLLM started without
	// --max-num-batched-tokens) is taken at the planner's default.
	o.plan.p.SetLimits(planner.Limits{MaxBatchedTokens: reg.MaxNumBatchedTokens, MaxSeqs: reg.MaxNumSeqs,
		GPUKVTokens: reg.GPUBlocks * reg.BlockSize}, hostSec, netSec)
	// Simulated engines model time faster than the wall clock: the
	// planner's windows follow their time.
	o.plan.p.SetSpeedup(reg.Speedup)
}

// statsBatch is the part of a protocol.StatsBatch that onStats uses.
// Decoding only these fields skips the rest (the pass's start time above
// all, which costs a time parse per pass): the stats are the most frequent
// message an orchestrator decodes, a batch per engine every flush.
type statsBatch struct {
	Engine string `json:"engine"`
	Passes []struct {
		DurationSec     float64 `json:"duration_s"`
		PrefillTokens   int     `json:"prefill_tokens"`
		PrefillAttended float64 `json:"prefill_attended"`
		DecodeSeqs      int     `json:"decode_seqs"`
		DecodeContext   int     `json:"decode_context"`
		HostLoadBlocks  int     `json:"host_load_blocks"`
		OffloadBlocks   int     `json:"offload_blocks"`
	} `json:"passes"`
}

// onStats feeds the engines' pass records to the planner's cost models.
// Modelled durations of simulated engines are divided by their speedup:
// the planner works in wall time, as its demand does.
func (o *Orchestrator) onStats(m *nats.Msg) {
	var b statsBatch
	if json.Unmarshal(m.Data, &b) != nil {
		return
	}
	now := time.Now()
	tokens := 0
	for _, ps := range b.Passes {
		tokens += ps.PrefillTokens + ps.DecodeSeqs
	}
	o.c.mu.Lock()
	speedup, prefill := 1.0, false
	if n := o.c.nodes[b.Engine]; n != nil {
		prefill = n.role == roles.Prefill
		n.noteTokens(now, tokens)
		n.passes += uint64(len(b.Passes))
		if n.reg.Speedup > 0 {
			speedup = n.reg.Speedup
		}
	}
	o.c.mu.Unlock()
	if o.plan == nil {
		return
	}
	o.plan.mu.Lock()
	defer o.plan.mu.Unlock()
	for _, ps := range b.Passes {
		o.plan.p.ObservePass(now, planner.Pass{Seconds: ps.DurationSec / speedup, PrefillTokens: ps.PrefillTokens,
			PrefillAttended: ps.PrefillAttended, DecodeSeqs: ps.DecodeSeqs, DecodeContext: ps.DecodeContext,
			CopyBlocks: ps.HostLoadBlocks + ps.OffloadBlocks, OnPrefillNode: prefill})
	}
}

func (o *Orchestrator) planArrival(tokens, computed int, dec routing.Decision) {
	if o.plan == nil {
		return
	}
	o.plan.mu.Lock()
	o.plan.p.Arrive(time.Now(), planner.Arrival{Tokens: tokens, ComputeTokens: computed, Disaggregated: dec.Disaggregated})
	o.plan.mu.Unlock()
}

func (o *Orchestrator) planFinish(prompt, output int) {
	if o.plan == nil {
		return
	}
	o.plan.mu.Lock()
	o.plan.p.Finish(time.Now(), prompt, output)
	o.plan.mu.Unlock()
}

// runPlanner steps the planner every interval and starts the switches it
// asks for, through the same role protocol an operator's switch uses.
func (o *Orchestrator) runPlanner(ctx context.Context) {
	if o.plan == nil {
		return
	}
	// Tick often; the planner says when a step is due (its interval
	// follows the engines' speedup, known only once they register).
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			o.planStep(now)
		}
	}
}

func (o *Orchestrator) planStep(now time.Time) {
	o.plan.mu.Lock()
	due := o.plan.limited && o.plan.p.Due(now)
	o.plan.mu.Unlock()
	if !due {
		return
	}
	if !o.leading() {
		// Only the leader moves nodes; the others' planners learn from
		// what they see (their routers price prefill by it), to lead well
		// should the leader go.
		o.plan.mu.Lock()
		sec, ok := o.plan.p.PrefillSecPerToken(now)
		o.plan.mu.Unlock()
		if ok {
			o.plan.prefillSec.Store(math.Float64bits(sec))
		}
		return
	}
	o.c.mu.Lock()
	refShare := o.referencedShareLocked()
	nodes := make([]planner.NodeInfo, 0, len(o.c.nodes))
	for id, n := range o.c.nodes {
		if n.state != StateServing && n.state != StateSwitching {
			continue
		}
		role := n.role
		if n.sw != nil {
			role, _ = parseRole(n.sw.To)
		}
		nodes = append(nodes, planner.NodeInfo{ID: id, Role: role, Auto: n.mode == ModeAuto,
			Serving: n.state == StateServing, Switching: n.state == StateSwitching,
			Waiting: n.hb.Waiting, Running: n.hb.Running + n.inFlight,
			GPUBlocksUsed:   int(n.hb.GPUKVUsage * float64(n.reg.GPUBlocks)),
			ReferencedShare: refShare[n.dir], CanHandOver: n.reg.CanHandOver})
	}
	o.c.mu.Unlock()
	o.plan.mu.Lock()
	moves := o.plan.p.Step(now, nodes)
	st := o.plan.p.Status()
	sec, ok := o.plan.p.PrefillSecPerToken(now)
	o.plan.mu.Unlock()
	if ok {
		o.plan.prefillSec.Store(math.Float64bits(sec))
	}
	o.met.planner(st)
	for _, m := range moves {
		if _, err := o.setRole(m.Node, m.To.String(), false, "planner: "+m.Reason, false); err != nil {
			o.log.Warn("planner move failed", "id", m.Node, "to", m.To, "err", err)
			continue
		}
		o.log.Info("planner moves a node", "id", m.Node, "from", m.From, "to", m.To, "reason", m.Reason)
	}
}

// learnedPrefillSec is the planner's learned prefill cost per token in
// the engines' modelled seconds (wall seconds times their speedup), or 0.
func (o *Orchestrator) learnedPrefillSec(speedup float64) float64 {
	if o.plan == nil {
		return 0
	}
	return math.Float64frombits(o.plan.prefillSec.Load()) * max(speedup, 1)
}

// PlannerStatus reports the planner as of its last step.
func (o *Orchestrator) PlannerStatus() (planner.Status, bool) {
	if o.plan == nil {
		return planner.Status{}, false
	}
	o.plan.mu.Lock()
	st := o.plan.p.Status()
	o.plan.mu.Unlock()
	if !o.leading() {
		st.State = "following"
		st.Reason = "another orchestrator leads the planner; this one's learns but does not act: ask the leader ('evolve status' names it)"
		for _, x := range o.Orchestrators() {
			if x.Leader {
				st.Reason = fmt.Sprintf("%s leads the planner; this orchestrator's learns but does not act: evolve planner --server %s", x.Name, x.ControlURL)
			}
		}
		return st, true
	}
	if st.State == "learning" {
		o.c.mu.Lock()
		serving, silent := 0, 0
		for _, n := range o.c.nodes {
			if n.state == StateServing {
				serving++
				if n.passes == 0 && time.Since(n.reg.StartedAt) > time.Minute {
					silent++
				}
			}
		}
		o.c.mu.Unlock()
		if serving > 0 && silent == serving {
			// Not "too few passes": none will come.
			st.Reason = "no engine publishes per-pass statistics (a vLLM engine does with vLLM's forward-pass metrics: evolve engine --pass-metrics-port, or a cluster file's engine.passMetricsPort): " +
				"the planner cannot learn pass costs and keeps the split; switch nodes by hand (evolve role)"
		}
	}
	return st, true
}

// parseRole reads a role name: prefill or decode.
func parseRole(s string) (roles.Role, bool) {
	switch s {
	case "prefill":
		return roles.Prefill, true
	case "decode":
		return roles.Decode, true
	}
	return roles.Decode, false
}

// usage is the part of an answer's usage the orchestrator reads.
type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	Details          *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

// countUsage reads the output tokens from a whole answer's usage, and for
// a request served on one node what its prefill computed.
func (a *attempt) countUsage(b []byte) {
	var out struct {
		Usage *usage `json:"usage"`
	}
	if json.Unmarshal(b, &out) == nil && out.Usage != nil {
		a.outTokens = out.Usage.CompletionTokens
		if !a.dec.Disaggregated {
			a.countComputed(out.Usage)
		}
	}
}

// countComputed adds the request's lost KV reuse once its prefill's
// usage says what the engine found cached (kv.PlacedReuse.Lost): blocks
// the cluster had computed that the engine computed again. Engines that
// do not report cached tokens are counted as placed when the answer ends.
func (a *attempt) countComputed(u *usage) {
	if a.reuse == nil || !a.reuse.Noted() || u.Details == nil || u.PromptTokens <= 0 {
		return
	}
	lost := a.reuse.Lost(len(a.chain), u.PromptTokens, u.Details.CachedTokens, u.PromptTokens-u.Details.CachedTokens, a.bs)
	*a.reuse = kv.PlacedReuse{}
	a.o.kvc.lostReuse.Add(lost)
}

// countChunk counts a streamed chunk: its usage when it has one (the
// last chunk with include_usage), else one token per chunk with content.
func (a *attempt) countChunk(b []byte) {
	if bytes.Contains(b, []byte(`"usage":{`)) {
		before := a.outTokens
		a.countUsage(b)
		if a.outTokens != before {
			return
		}
	}
	if bytes.Contains(b, []byte(`"text":`)) || bytes.Contains(b, []byte(`"content":`)) {
		a.outTokens++
	}
}

// planner publishes a planner status as metrics.
func (m *metrics) planner(st planner.Status) {
	m.planSplit.WithLabelValues("prefill", "current").Set(float64(st.Prefill))
	m.planSplit.WithLabelValues("decode", "current").Set(float64(st.Decode))
	if st.Recommended >= 0 {
		m.planSplit.WithLabelValues("prefill", "recommended").Set(float64(st.Recommended))
		m.planSplit.WithLabelValues("decode", "recommended").Set(float64(st.Prefill + st.Decode - st.Recommended))
	}
	for model, fit := range map[string]planner.FitStatus{"prefill": st.PrefillFit, "decode": st.DecodeFit} {
		for _, c := range fit.Coefs {
			m.planCost.WithLabelValues(model, c.Name).Set(c.Value)
		}
	}
	for name, pr := range map[string]planner.Prediction{"current": st.Current, "best": st.Best} {
		if pr.Prefill+pr.Decode == 0 {
			continue
		}
		m.planPredicted.WithLabelValues(name, "ttft").Set(pr.TTFT)
		m.planPredicted.WithLabelValues(name, "itl").Set(pr.ITL)
		m.planPredicted.WithLabelValues(name, "e2e").Set(pr.E2E)
	}
	m.planGain.Set(st.GainSec)
	if st.State == "moving" && len(st.Decisions) > 0 {
		m.planMoves.Add(float64(len(st.Decisions[len(st.Decisions)-1].Moves)))
	}
}
