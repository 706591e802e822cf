package planner

import (
	"math"
)

// Prediction is what a split is expected to give under a demand.
type Prediction struct {
	Prefill int     `json:"prefill"`
	Decode  int     `json:"decode"`
	TTFT    float64 `json:"ttft_s"` // mean time to first token
	// PrefillWait is the mean time a disaggregated request queues for a
	// prefill node.
	PrefillWait float64 `json:"prefill_wait_s"`
	ITL         float64 `json:"itl_s"`     // mean time between output tokens
	E2E         float64 `json:"e2e_s"`     // TTFT + output tokens x ITL
	Objective   float64 `json:"objective"` // what the planner minimises, seconds
	// Loads of the two stages: busy share of prefill nodes, and of decode
	// nodes' per-sequence work (1 or more is overload).
	PrefillLoad float64 `json:"prefill_load"`
	DecodeLoad  float64 `json:"decode_load"`
	Saturated   bool    `json:"saturated"`
	// MissesSLO: the predicted TTFT is past Config.TTFTSLO.
	MissesSLO bool `json:"misses_ttft_slo,omitempty"`
}

// Limits are an engine's scheduling limits.
type Limits struct {
	MaxBatchedTokens int `json:"max_batched_tokens"` // token budget per pass
	MaxSeqs          int `json:"max_seqs"`           // sequences per engine; 0: no limit known
	GPUKVTokens      int `json:"gpu_kv_tokens"`      // KV capacity; 0: not known
}

// saturatedObjective ranks overloaded splits after every feasible one,
// less overloaded first.
func saturatedObjective(load float64) float64 { return 1e4 * (1 + load) }

// sloObjective ranks a split predicted over seconds past the TTFT SLO
// after every split that meets it, and before every overloaded one.
func sloObjective(over float64) float64 { return 1e3 + min(over, 8e3) }

// predict estimates mean TTFT and ITL for p prefill and d decode engines.
//
// Prefill nodes are an M/G/c queue of prompts: service at the rate of full
// passes (the token budget amortises the pass's fixed cost), waiting time by
// the Allen-Cunneen approximation with Sakasegawa's M/M/c term, and each
// prompt's own compute on top, then the decode pass that writes the first
// token from the KV handed over. Decode nodes share the output tokens: a node
// that must produce x tokens/s with pass time base + b*k runs a batch
// b = x*base/(1-x*k), and its ITL is that pass's time, stretched by the
// share of time it spends prefilling short prompts locally. ttftWeight
// trades TTFT against decode speed in the objective (1: the predicted
// mean E2E; see Config.TTFTWeight).
func predict(p, d int, dm Demand, pc PrefillCost, dc DecodeCost, lim Limits, ttftWeight float64) Prediction {
	return predictCal(p, d, dm, pc, dc, lim, ttftWeight, calibration{})
}

// calibration corrects the model by what it measured (see accuracy): the
// prefill queue's wait is Wait times the queueing formula's (agents'
// bursts make it longer than steady arrivals'), and every decode step
// ITL times the cost model's; zero values are 1.
type calibration struct{ Wait, ITL float64 }

func (c calibration) wait() float64 { return cmpOr(c.Wait, 1) }
func (c calibration) itl() float64  { return cmpOr(c.ITL, 1) }

func cmpOr(v, def float64) float64 {
	if v <= 0 {
		return def
	}
	return v
}

// predictCal is predict with the model corrected by cal.
func predictCal(p, d int, dm Demand, pc PrefillCost, dc DecodeCost, lim Limits, ttftWeight float64, cal calibration) Prediction {
	pr := Prediction{Prefill: p, Decode: d}
	if d < 1 {
		pr.Saturated, pr.DecodeLoad = true, overload
		pr.Objective = saturatedObjective(1e3)
		return pr
	}
	B := float64(max(lim.MaxBatchedTokens, 1))

	// Local prefill on decode nodes: a share u of their time.
	rLocal := max(pc.PerToken+pc.PerTokenContext*dm.LocalContext, 0)
	u := dm.LocalTokPerSec * rLocal / float64(d)

	// Decode.
	k := max(dc.PerSeq+dc.PerContext*dm.DecodeContext, 0)
	base := max(dc.BaseSec, 1e-4)
	x := dm.OutputTokPerSec / float64(d)
	var b float64
	if u < 1 {
		x /= 1 - u
		pr.DecodeLoad = x * k
	} else {
		pr.DecodeLoad = overload
	}
	if pr.DecodeLoad < 1 {
		// The batch the output rate needs, and at least the sequences
		// already in the system spread over d nodes (closed loop).
		b = max(x*base/(1-pr.DecodeLoad), dm.DecodeSeqs/float64(d))
		// A node runs at most what its KV and max_num_seqs hold; the
		// rest wait their turn, which stretches every token's time.
		fit := b
		if lim.MaxSeqs > 0 {
			fit = min(fit, float64(lim.MaxSeqs))
		}
		if lim.GPUKVTokens > 0 && dm.DecodeContext > 0 {
			fit = min(fit, max(1, float64(lim.GPUKVTokens)/dm.DecodeContext))
		}
		pr.ITL = (base + fit*k) / (1 - u) * (b / max(fit, 1e-9)) * cal.itl()
	}
	if pr.DecodeLoad >= 1 {
		pr.Saturated = true
	}
	localTTFT := pr.ITL
	if n := dm.RequestsPerSec * (1 - dm.DisaggShare); n > 0 {
		localTTFT += dm.LocalTokPerSec / n * rLocal
	}

	// Prefill.
	remoteTTFT := 0.0
	if dm.DisaggShare > 0 && dm.PrefillTokens > 0 {
		if p < 1 {
			pr.PrefillLoad, pr.Saturated = overload, true
		} else {
			r := max(pc.PerToken+pc.PerTokenContext*dm.PrefillContext, 1e-9)
			pbase := max(pc.BaseSec, 0)
			capTok := B / (pbase + B*r) // tokens/s of one node at full passes
			pr.PrefillLoad = dm.PrefillTokPerSec / (float64(p) * capTok)
			if pr.PrefillLoad >= 1 {
				pr.Saturated = true
			} else {
				c := float64(p)
				rho := pr.PrefillLoad
				svc := dm.PrefillTokens / capTok
				wq := svc * (1 + dm.PrefillCV2) / 2 * math.Pow(rho, math.Sqrt(2*(c+1))-1) / (c * (1 - rho)) * cal.wait()
				own := pbase*math.Ceil(dm.PrefillTokens/B) + dm.PrefillTokens*r
				// The first token comes from the decode node's pass
				// that takes the KV in, as a local prompt's does.
				remoteTTFT = wq + own + pr.ITL
				pr.PrefillWait = wq
			}
		}
	}
	if pr.Saturated {
		pr.Objective = saturatedObjective(max(pr.PrefillLoad, pr.DecodeLoad))
		return pr
	}
	pr.TTFT = dm.DisaggShare*remoteTTFT + (1-dm.DisaggShare)*localTTFT
	pr.E2E = pr.TTFT + dm.OutputTokens*pr.ITL
	pr.Objective = ttftWeight*pr.TTFT + dm.OutputTokens*pr.ITL
	return pr
}

// overload stands for a stage with no capacity at all; a finite number,
// so that statuses encode as JSON.
const overload = 1e9
