package planner

import (
	"math"
	"time"
)

// The planner checks its predictions against what followed: every step
// it notes what it predicted for the split it serves (the uncorrected
// model), every finished request what its client measured, both decayed
// over the same horizon. Their ratio is the model's error, shown to
// operators (Status.Accuracy), and the correction its next predictions
// take (calibration): the prefill queue's wait by how much longer the
// measured waits were (agents send in bursts, and the queueing formula
// assumes steady arrivals), the decode steps by how much slower the
// measured tokens came. Without it a move away from a prefill node looks
// free when its queue is really long, and has to be undone.

// Accuracy is the planner's predictions for the split it served against
// what the requests that finished over the same time measured. JSON names
// are stable.
type Accuracy struct {
	HorizonSec float64 `json:"horizon_s"`
	// Requests is the measured requests' effective count (decayed).
	Requests      float64 `json:"requests"`
	PredictedTTFT float64 `json:"predicted_ttft_s"`
	MeasuredTTFT  float64 `json:"measured_ttft_s"`
	PredictedWait float64 `json:"predicted_prefill_wait_s"`
	MeasuredWait  float64 `json:"measured_prefill_wait_s"`
	PredictedITL  float64 `json:"predicted_itl_s"`
	MeasuredITL   float64 `json:"measured_itl_s"`
	PredictedE2E  float64 `json:"predicted_e2e_s"`
	MeasuredE2E   float64 `json:"measured_e2e_s"`
	// TTFTError, ITLError and E2EError are measured / predicted - 1 (0.5:
	// the measured was 50% longer).
	TTFTError float64 `json:"ttft_error"`
	ITLError  float64 `json:"itl_error"`
	E2EError  float64 `json:"e2e_error"`
	// WaitFactor and ITLFactor are the corrections the predictions take
	// (1: none).
	WaitFactor float64 `json:"wait_factor"`
	ITLFactor  float64 `json:"itl_factor"`
}

// accuracy holds the decayed sums of predictions and measurements.
type accuracy struct {
	tau  float64
	last time.Time
	// Predictions, weighted by the requests arriving while they held.
	pw, pTTFT, pWait, pOwn, pITL, pE2E float64
	// Measurements: requests, their TTFT and E2E; decode time and output
	// tokens after the first.
	mn, mTTFT, mE2E, mDecode, mTokens float64
	cal                               calibration
}

// Bounds of the corrections: the model is never trusted less than this.
const (
	maxWaitFactor = 20
	minWaitFactor = 0.5
	maxITLFactor  = 4
	minITLFactor  = 0.5
	// minMeasured is the effective measured requests a correction needs.
	minMeasured = 20
)

func (a *accuracy) age(now time.Time) {
	if a.last.IsZero() {
		a.last = now
		return
	}
	dt := now.Sub(a.last).Seconds()
	if dt <= 0 {
		return
	}
	a.last = now
	f := math.Exp(-dt / a.tau)
	for _, v := range []*float64{&a.pw, &a.pTTFT, &a.pWait, &a.pOwn, &a.pITL, &a.pE2E, &a.mn, &a.mTTFT, &a.mE2E, &a.mDecode, &a.mTokens} {
		*v *= f
	}
}

// predicted notes the uncorrected prediction for the split served, held
// for dt seconds at rate requests a second.
func (a *accuracy) predicted(now time.Time, pr Prediction, dm Demand, rate, dt float64) {
	if pr.Saturated || rate <= 0 {
		return
	}
	a.age(now)
	w := rate * dt
	wait := dm.DisaggShare * pr.PrefillWait
	a.pw += w
	a.pTTFT += w * pr.TTFT
	a.pWait += w * wait
	a.pOwn += w * (pr.TTFT - wait)
	a.pITL += w * pr.ITL
	a.pE2E += w * pr.E2E
}

// measured notes a finished request.
func (a *accuracy) measured(now time.Time, ttft, e2e float64, output int) {
	if ttft < 0 || e2e < ttft {
		return
	}
	a.age(now)
	a.mn++
	a.mTTFT += ttft
	a.mE2E += e2e
	if output > 1 {
		a.mDecode += e2e - ttft
		a.mTokens += float64(output - 1)
	}
}

// update recomputes the corrections from the sums: only once enough has
// been both predicted and measured, and the wait only where the model
// predicts one worth correcting (a share of the TTFT).
func (a *accuracy) update() {
	if a.mn < minMeasured || a.pw <= 0 {
		return
	}
	pWait, pOwn := a.pWait/a.pw, a.pOwn/a.pw
	mTTFT := a.mTTFT / a.mn
	if pWait > max(1e-3, 0.02*(pWait+pOwn)) {
		a.cal.Wait = min(max((mTTFT-pOwn)/pWait, minWaitFactor), maxWaitFactor)
	}
	if pITL := a.pITL / a.pw; pITL > 0 && a.mTokens > 0 {
		a.cal.ITL = min(max(a.mDecode/a.mTokens/pITL, minITLFactor), maxITLFactor)
	}
}

// status reports the sums as operators see them.
func (a *accuracy) status() Accuracy {
	st := Accuracy{HorizonSec: a.tau, Requests: a.mn, WaitFactor: a.cal.wait(), ITLFactor: a.cal.itl()}
	if a.pw > 0 {
		st.PredictedTTFT, st.PredictedWait, st.PredictedITL, st.PredictedE2E = a.pTTFT/a.pw, a.pWait/a.pw, a.pITL/a.pw, a.pE2E/a.pw
	}
	if a.mn > 0 {
		st.MeasuredTTFT, st.MeasuredE2E = a.mTTFT/a.mn, a.mE2E/a.mn
		st.MeasuredWait = max(0, st.MeasuredTTFT-(st.PredictedTTFT-st.PredictedWait))
	}
	if a.mTokens > 0 {
		st.MeasuredITL = a.mDecode / a.mTokens
	}
	rel := func(m, p float64) float64 {
		if p <= 0 || m <= 0 {
			return 0
		}
		return m/p - 1
	}
	st.TTFTError, st.ITLError, st.E2EError = rel(st.MeasuredTTFT, st.PredictedTTFT), rel(st.MeasuredITL, st.PredictedITL), rel(st.MeasuredE2E, st.PredictedE2E)
	return st
}
