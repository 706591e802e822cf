package planner

import (
	"math"
	"time"
)

// Arrival is what the router knows of a request when it places it.
type Arrival struct {
	Tokens        int  // prompt tokens
	ComputeTokens int  // tokens it expects to compute (after cache hits and fetches)
	Disaggregated bool // prefilled on a prefill node, decoded on another
}

// decayed holds exponentially decayed sums of the demand's quantities
// over one horizon: a sum is an average rate times tau.
type decayed struct {
	tau   float64 // seconds
	since time.Time
	last  time.Time
	v     [nQty]float64
}

// Quantities summed over arrivals and completions.
const (
	qArrivals     = iota // requests arriving
	qDisagg              // of them, disaggregated
	qDisaggTok           // tokens those compute on prefill nodes
	qDisaggTok2          // squares, for the spread of the service time
	qDisaggAtt           // token x context they attend to
	qLocalTok            // tokens prefilled on decode nodes
	qLocalAtt            // and their attention
	qFinished            // requests finishing
	qOutput              // output tokens of finished requests
	qFinPrompt           // prompt tokens of finished requests
	qFinDecodeCtx        // output x (prompt + output/2): context-weighted decode work
	qServedTok           // tokens prefill nodes computed
	qServedAtt           // and their attention
	nQty
)

func (d *decayed) age(now time.Time) {
	if d.last.IsZero() {
		d.since, d.last = now, now
		return
	}
	dt := now.Sub(d.last).Seconds()
	if dt <= 0 {
		return
	}
	f := math.Exp(-dt / d.tau)
	for i := range d.v {
		d.v[i] *= f
	}
	d.last = now
}

// rate is quantity q per second, corrected for a window not yet full.
func (d *decayed) rate(now time.Time, q int) float64 {
	if d.last.IsZero() {
		return 0
	}
	d.age(now)
	full := 1 - math.Exp(-now.Sub(d.since).Seconds()/d.tau)
	if full <= 1e-9 {
		return 0
	}
	return d.v[q] / (d.tau * full)
}

// ratio is the mean of a over b.
func (d *decayed) ratio(a, b int) float64 {
	if d.v[b] <= 1e-12 {
		return 0
	}
	return d.v[a] / d.v[b]
}

// Demand is the work arriving, as averaged over one horizon.
type Demand struct {
	Horizon        time.Duration `json:"-"`
	HorizonSec     float64       `json:"horizon_s"`
	RequestsPerSec float64       `json:"requests_per_s"`
	// Prefill-node work: the share of requests prefilled remotely, the
	// tokens each computes (mean and squared coefficient of variation) and
	// the mean context each new token attends to.
	DisaggShare      float64 `json:"disaggregated_share"`
	PrefillTokens    float64 `json:"prefill_tokens_per_request"`
	PrefillCV2       float64 `json:"prefill_tokens_cv2"`
	PrefillContext   float64 `json:"prefill_context_tokens"`
	PrefillTokPerSec float64 `json:"prefill_tokens_per_s"`
	// PrefillQueue is the number of requests waiting on prefill nodes
	// (smoothed); HiddenTokPerSec the prefill tokens per second that
	// PrefillTokPerSec counts beyond the arrivals: what prefill nodes
	// computed above them, and the queue beyond what the queueing model
	// expects (demand the closed loop of agents holds back).
	PrefillQueue float64 `json:"prefill_queue"`
	// ServedTokPerSec is what prefill nodes computed per second, measured
	// from their passes, and ServedContext the mean context those tokens
	// attended to.
	ServedTokPerSec float64 `json:"prefill_served_tokens_per_s"`
	ServedContext   float64 `json:"prefill_served_context_tokens"`
	HiddenTokPerSec float64 `json:"hidden_prefill_tokens_per_s"`
	// Prefill done on decode nodes (short uncached parts).
	LocalTokPerSec  float64 `json:"local_prefill_tokens_per_s"`
	LocalContext    float64 `json:"local_prefill_context_tokens"`
	OutputTokens    float64 `json:"output_tokens_per_request"`
	OutputTokPerSec float64 `json:"output_tokens_per_s"`
	// DecodeContext is the mean context a decode step attends to,
	// weighted by output tokens.
	DecodeContext float64 `json:"decode_context_tokens"`
	// DecodeSeqs is the number of sequences on decode nodes, running or
	// queued (smoothed over the short horizon): agents wait for their
	// answers, so this many stay in the system whatever the split.
	DecodeSeqs float64 `json:"decode_sequences"`
}

func (d *decayed) demand(now time.Time) Demand {
	d.age(now)
	out := Demand{Horizon: time.Duration(d.tau * float64(time.Second)), HorizonSec: d.tau,
		RequestsPerSec:   d.rate(now, qArrivals),
		DisaggShare:      d.ratio(qDisagg, qArrivals),
		PrefillTokens:    d.ratio(qDisaggTok, qDisagg),
		PrefillTokPerSec: d.rate(now, qDisaggTok),
		LocalTokPerSec:   d.rate(now, qLocalTok),
		LocalContext:     d.ratio(qLocalAtt, qLocalTok),
		PrefillContext:   d.ratio(qDisaggAtt, qDisaggTok),
		OutputTokens:     d.ratio(qOutput, qFinished),
		DecodeContext:    d.ratio(qFinDecodeCtx, qOutput),
		ServedTokPerSec:  d.rate(now, qServedTok),
		ServedContext:    d.ratio(qServedAtt, qServedTok),
	}
	if m := out.PrefillTokens; m > 0 {
		out.PrefillCV2 = max(0, d.ratio(qDisaggTok2, qDisagg)/(m*m)-1)
	}
	out.OutputTokPerSec = out.RequestsPerSec * out.OutputTokens
	return out
}

// demandTracker keeps the short, the burst and the long horizon.
type demandTracker struct{ short, mid, long decayed }

func (t *demandTracker) add(now time.Time, q int, v float64) {
	for _, d := range []*decayed{&t.short, &t.mid, &t.long} {
		d.age(now)
		d.v[q] += v
	}
}

func (t *demandTracker) arrive(now time.Time, a Arrival) {
	n := float64(max(a.ComputeTokens, 0))
	// Each new token attends to the cached prefix and the new tokens before it.
	att := n * (float64(a.Tokens) - n/2)
	t.add(now, qArrivals, 1)
	if a.Disaggregated {
		t.add(now, qDisagg, 1)
		t.add(now, qDisaggTok, n)
		t.add(now, qDisaggTok2, n*n)
		t.add(now, qDisaggAtt, att)
	} else {
		t.add(now, qLocalTok, n)
		t.add(now, qLocalAtt, att)
	}
}

// served records a pass of a prefill node.
func (t *demandTracker) served(now time.Time, tokens int, attended float64) {
	t.add(now, qServedTok, float64(tokens))
	t.add(now, qServedAtt, attended)
}

func (t *demandTracker) finish(now time.Time, prompt, output int) {
	o := float64(output)
	t.add(now, qFinished, 1)
	t.add(now, qOutput, o)
	t.add(now, qFinPrompt, float64(prompt))
	t.add(now, qFinDecodeCtx, o*(float64(prompt)+o/2))
}
