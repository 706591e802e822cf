package planner

import (
	"math"
	"testing"
	"time"
)

// runMeasured is cluster.run with every request also measured: its TTFT
// is what the planner's model predicted for the split served, as it
// stands uncorrected, with the prefill wait waitX times longer (agents'
// bursts), and its decode itlX times slower.
func (c *cluster) runMeasured(dur time.Duration, rate float64, prompt, output int, waitX, itlX float64) {
	end := c.now.Add(dur)
	for c.now.Before(end) {
		step := min(end.Sub(c.now), 2*time.Second)
		c.run(step, rate, prompt, output)
		st := c.p.Status()
		a := st.Accuracy
		if a.PredictedTTFT <= 0 {
			continue // nothing predicted yet
		}
		own := a.PredictedTTFT - a.PredictedWait
		ttft := own + waitX*a.PredictedWait
		e2e := ttft + float64(output-1)*itlX*a.PredictedITL
		for i := 0; i < int(math.Ceil(rate*step.Seconds())); i++ {
			c.p.Measured(c.now, ttft, e2e, output)
		}
	}
}

// The planner checks its predictions against what followed: when the
// requests' prefill waits run 4x and their decode 1.5x what its model
// says, its status shows the error and the corrections it takes, and its
// next predictions carry them: on prompt-heavy work it keeps more prefill
// nodes than a planner whose measurements agree with its model, and more
// than one told not to correct (which still shows the error).
func TestPredictionsAreCheckedAgainstMeasurements(t *testing.T) {
	demand := func(c *cluster, waitX, itlX float64) { c.runMeasured(15*time.Minute, 5, 6000, 300, waitX, itlX) }
	exact := newCluster(9, 3, Config{TTFTWeight: 1})
	demand(exact, 1, 1)
	bursty := newCluster(9, 3, Config{TTFTWeight: 1})
	demand(bursty, 4, 1.5)
	blind := newCluster(9, 3, Config{TTFTWeight: 1, Uncalibrated: true})
	demand(blind, 4, 1.5)

	ea, ba := exact.p.Status().Accuracy, bursty.p.Status().Accuracy
	if math.Abs(ea.WaitFactor-1) > 0.05 || math.Abs(ea.ITLFactor-1) > 0.05 || math.Abs(ea.TTFTError) > 0.05 {
		t.Errorf("measured as predicted: wait x%.2f, ITL x%.2f, TTFT error %+.0f%%", ea.WaitFactor, ea.ITLFactor, 100*ea.TTFTError)
	}
	if ba.WaitFactor < 3 || ba.WaitFactor > 5 || ba.ITLFactor < 1.3 || ba.ITLFactor > 1.7 || ba.TTFTError <= 0.05 || ba.ITLError < 0.4 || ba.Requests < minMeasured {
		t.Errorf("measured 4x the wait and 1.5x the ITL: %+v", ba)
	}
	// The corrections are in the predictions: the current split's wait
	// is the formula's times the factor.
	bs := bursty.p.Status()
	if bs.Current.PrefillWait < 2*ba.PredictedWait && ba.PredictedWait > 0 {
		t.Errorf("corrected wait %.3fs against the formula's %.3fs", bs.Current.PrefillWait, ba.PredictedWait)
	}
	pe, _ := exact.split()
	pb, _ := bursty.split()
	pn, _ := blind.split()
	if pb <= pe || pb <= pn {
		t.Fatalf("prefill nodes: %d where waits are 4x the model's, %d where they agree, %d not correcting", pb, pe, pn)
	}
	if bl := blind.p.Status(); bl.Accuracy.TTFTError <= 0.05 || bl.Current.PrefillWait > 1.5*bl.Accuracy.PredictedWait+1e-9 {
		t.Errorf("uncalibrated: error %+.0f%%, wait %.3fs against the formula's %.3fs", 100*bl.Accuracy.TTFTError, bl.Current.PrefillWait, bl.Accuracy.PredictedWait)
	}
}

// A TTFT SLO is a constraint: splits predicted past it rank after every
// split that meets it, so the planner keeps the prefill nodes that meet it
// even where the mean-E2E objective alone would give one to decode.
func TestTTFTSLOIsAConstraint(t *testing.T) {
	free := newCluster(9, 3, Config{TTFTWeight: 1})
	free.run(12*time.Minute, 4, 1000, 4000) // math-like: few prefill nodes
	pf, _ := free.split()
	ttft := free.p.Status().Current.TTFT
	const slo = 0.9
	bound := newCluster(9, 3, Config{TTFTWeight: 1, TTFTSLO: ttft * slo})
	bound.run(12*time.Minute, 4, 1000, 4000)
	pb, _ := bound.split()
	st := bound.p.Status()
	if pb <= pf || st.Current.MissesSLO || st.Current.TTFT > ttft*slo {
		t.Fatalf("with a TTFT SLO of %.3fs (%.3fs without): %d prefill nodes against %d, predicted TTFT %.3fs, misses %v",
			ttft*slo, ttft, pb, pf, st.Current.TTFT, st.Current.MissesSLO)
	}
}
