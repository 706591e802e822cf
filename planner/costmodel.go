package planner

import (
	"fmt"
	"math"
	"time"
)

// Pass is one forward pass of an engine as its statistics report it.
type Pass struct {
	Seconds         float64 // how long the pass took
	PrefillTokens   int     // new tokens computed
	PrefillAttended float64 // sum over new tokens of the context each attends to
	DecodeSeqs      int     // sequences that got a decode token
	DecodeContext   int     // their total context, tokens
	CopyBlocks      int     // KV blocks copied between GPU and host in the pass
	OnPrefillNode   bool    // the engine serves the prefill role
}

// Coefficient is one learned cost with its uncertainty.
type Coefficient struct {
	Name   string  `json:"name"`
	Unit   string  `json:"unit"`
	Value  float64 `json:"value"`
	StdErr float64 `json:"stderr"`
}

// FitStatus is one of the two learned models as operators see it.
type FitStatus struct {
	Ready   bool          `json:"ready"`
	Samples int           `json:"samples"`           // passes ever seen
	Weight  float64       `json:"effective_samples"` // after forgetting
	Coefs   []Coefficient `json:"coefficients"`
	// RelErr is the relative standard error of the predicted pass time at
	// the typical pass (the weighted mean of the samples).
	RelErr float64 `json:"relative_error"`
	Note   string  `json:"note,omitempty"`
}

// CostModel learns pass times online from the engines' pass statistics:
//
//	prefill pass = base_p + per_token * new + per_token_context * attended + per_block * copied
//	decode pass  = base_d + per_seq * batch + per_context * context + per_block * copied
//
// the forms of vLLM's cost (weights read once per pass; attention reads
// every cached token). Pure prefill passes fit the first, pure decode
// passes the second. A mixed pass (a decode node prefilling a short
// prompt among its decodes) teaches the prefill part once the decode part
// is trusted: its decode share is predicted and taken off, and the fixed
// cost, shared by both, lands in the prefill intercept. So a cluster whose
// prefill happens mostly on decode nodes still learns its prefill cost.
// Features are scaled so that the normal equations stay well conditioned.
type CostModel struct {
	prefill, decode *regression
	minSamples      int
	maxRelErr       float64
}

// Feature scales: coefficients are in seconds per scaled unit.
const (
	scaleTokens   = 1e3 // prefill tokens
	scaleAttended = 1e9 // token x context
	scaleSeqs     = 1e2 // decode batch
	scaleContext  = 1e6 // decode context tokens
	scaleBlocks   = 1e2 // copied blocks
)

// NewCostModel returns an empty model; tau is the forgetting time
// constant, minSamples the effective passes each part needs before it is
// trusted, maxRelErr the relative error it must reach.
func NewCostModel(tau time.Duration, minSamples int, maxRelErr float64) *CostModel {
	return &CostModel{prefill: newRegression(4, tau), decode: newRegression(4, tau), minSamples: minSamples, maxRelErr: maxRelErr}
}

func prefillX(p Pass) []float64 {
	return []float64{1, float64(p.PrefillTokens) / scaleTokens, p.PrefillAttended / scaleAttended, float64(p.CopyBlocks) / scaleBlocks}
}

func decodeX(p Pass) []float64 {
	return []float64{1, float64(p.DecodeSeqs) / scaleSeqs, float64(p.DecodeContext) / scaleContext, float64(p.CopyBlocks) / scaleBlocks}
}

// Observe learns from one pass at now.
func (c *CostModel) Observe(now time.Time, p Pass) {
	switch {
	case p.Seconds <= 0:
	case p.PrefillTokens > 0 && p.DecodeSeqs == 0:
		c.prefill.add(now, prefillX(p), p.Seconds)
	case p.DecodeSeqs > 0 && p.PrefillTokens == 0:
		c.decode.add(now, decodeX(p), p.Seconds)
	default:
		if dc, ok := c.DecodeModel(); ok {
			rest := p.Seconds - dc.PerSeq*float64(p.DecodeSeqs) - dc.PerContext*float64(p.DecodeContext)
			c.prefill.add(now, prefillX(p), rest)
		}
	}
}

// PrefillCost is the learned prefill cost.
type PrefillCost struct{ BaseSec, PerToken, PerTokenContext, PerBlock float64 }

// DecodeCost is the learned decode cost.
type DecodeCost struct{ BaseSec, PerSeq, PerContext, PerBlock float64 }

// PrefillModel returns the prefill model, and whether it is trusted.
func (c *CostModel) PrefillModel() (PrefillCost, bool) {
	if !c.prefill.solve() {
		return PrefillCost{}, false
	}
	t := c.prefill.theta
	return PrefillCost{t[0], t[1] / scaleTokens, t[2] / scaleAttended, t[3] / scaleBlocks}, c.trusted(c.prefill)
}

// DecodeModel returns the decode model, and whether it is trusted.
func (c *CostModel) DecodeModel() (DecodeCost, bool) {
	if !c.decode.solve() {
		return DecodeCost{}, false
	}
	t := c.decode.theta
	return DecodeCost{t[0], t[1] / scaleSeqs, t[2] / scaleContext, t[3] / scaleBlocks}, c.trusted(c.decode)
}

func (c *CostModel) trusted(r *regression) bool {
	return r.w >= float64(c.minSamples) && relErr(r) <= c.maxRelErr
}

func relErr(r *regression) float64 {
	y, se := r.predict(r.meanX())
	if y <= 0 {
		return 1e9 // no prediction: never trusted
	}
	return se / y
}

// Status reports both parts.
func (c *CostModel) Status() (prefill, decode FitStatus) {
	return c.fitStatus(c.prefill, []string{"base_ms", "per_token_us", "per_token_context_ns", "per_block_us"},
			[]float64{1e3, 1e3, 1, 1e4}),
		c.fitStatus(c.decode, []string{"base_ms", "per_seq_us", "per_context_token_ns", "per_block_us"},
			[]float64{1e3, 1e4, 1e3, 1e4})
}

// fitStatus converts coefficients (seconds per scaled unit) to the units
// named: mult is the conversion of each.
func (c *CostModel) fitStatus(r *regression, names []string, mult []float64) FitStatus {
	st := FitStatus{Samples: r.n, Weight: r.w}
	if !r.solve() {
		st.Note = c.fewPasses(r)
		return st
	}
	st.RelErr = relErr(r)
	for i, n := range names {
		v, se := r.coef(i)
		st.Coefs = append(st.Coefs, Coefficient{Name: n, Unit: unitOf(n), Value: v * mult[i], StdErr: se * mult[i]})
	}
	st.Ready = c.trusted(r)
	switch {
	case r.w < float64(c.minSamples):
		st.Note = c.fewPasses(r)
	case !st.Ready:
		st.Note = fmt.Sprintf("learning: error ±%.0f%%, wants ±%.0f%%", st.RelErr*100, c.maxRelErr*100)
	}
	return st
}

// fewPasses says how far a model is from the passes it needs. They are
// effective passes, which forgetting ages, so a model whose passes come
// too seldom to ever reach the count shows it standing still.
func (c *CostModel) fewPasses(r *regression) string {
	return fmt.Sprintf("learning: %d of %d recent passes", min(int(math.Round(r.w)), c.minSamples-1), c.minSamples)
}

func unitOf(name string) string {
	for _, u := range []string{"ms", "us", "ns"} {
		if len(name) > len(u) && name[len(name)-len(u):] == u {
			return u
		}
	}
	return ""
}
