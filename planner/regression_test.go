package planner

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// unconstrained is the plain ridge fit of r, for comparison.
func unconstrained(r *regression) []float64 {
	_, _, theta, _ := r.plainFit()
	return theta
}

// checkKKT fails unless t minimises 1/2 t'At - b't over t >= 0: every
// coefficient is non-negative, the gradient At - b vanishes on the free
// ones and is non-negative on those held at zero.
func checkKKT(t *testing.T, r *regression, theta []float64) {
	t.Helper()
	k := r.k
	scale := 0.0
	for _, v := range r.xty {
		scale = max(scale, math.Abs(v))
	}
	a, _, _, _ := r.plainFit()
	for i := 0; i < k; i++ {
		g := -r.xty[i]
		for j := 0; j < k; j++ {
			g += a[i*k+j] * theta[j]
		}
		switch {
		case theta[i] < 0:
			t.Errorf("coefficient %d = %g, negative", i, theta[i])
		case theta[i] > 0 && math.Abs(g) > 1e-9*scale:
			t.Errorf("coefficient %d = %g is free but the gradient there is %g, not 0", i, theta[i], g)
		case theta[i] == 0 && g < -1e-9*scale:
			t.Errorf("coefficient %d is held at 0 but the gradient there is %g: raising it would fit better", i, g)
		}
	}
}

func TestRegressionHoldsCoefficientsNonNegative(t *testing.T) {
	// y falls as x2 rises with x1 held: the plain fit gives x2 a negative
	// cost, which no pass can have.
	r := newRegression(3, time.Hour)
	rng := rand.New(rand.NewPCG(3, 4))
	now := t0
	for i := 0; i < 200; i++ {
		x1, x2 := rng.Float64(), rng.Float64()
		r.add(now, []float64{1, x1, x2}, 1+2*x1-0.3*x2)
	}
	if u := unconstrained(r); u[2] > -0.25 {
		t.Fatalf("the data should pull x2's plain fit to about -0.3, got %v", u)
	}
	if !r.solve() {
		t.Fatal("no fit from 200 samples")
	}
	if v, _ := r.coef(2); v != 0 {
		t.Errorf("x2's coefficient = %g, want 0", v)
	}
	checkKKT(t, r, r.theta)
	// With x2 held at 0, x1 and the intercept take what x2 explained
	// (its mean, 0.15): the least-squares line through 1 - 0.15 + 2 x1.
	within(t, "intercept", r.theta[0], 0.85, 0.05)
	within(t, "x1", r.theta[1], 2, 0.05)

	// Where the plain fit is non-negative, it is the answer.
	p := newRegression(3, time.Hour)
	for i := 0; i < 200; i++ {
		x1, x2 := rng.Float64(), rng.Float64()
		p.add(now, []float64{1, x1, x2}, 1+2*x1+0.3*x2)
	}
	p.solve()
	for i, u := range unconstrained(p) {
		if p.theta[i] != u {
			t.Errorf("coefficient %d = %g, the plain fit's is %g", i, p.theta[i], u)
		}
	}
}

func TestNonNegativeFitIsTheConstrainedOptimum(t *testing.T) {
	// Random problems, several coefficients pulled negative at once: the
	// answer must meet the optimality conditions every time.
	rng := rand.New(rand.NewPCG(5, 6))
	for trial := 0; trial < 200; trial++ {
		r := newRegression(4, time.Hour)
		truth := []float64{rng.NormFloat64(), rng.NormFloat64(), rng.NormFloat64(), rng.NormFloat64()}
		for i := 0; i < 30; i++ {
			x := []float64{1, rng.Float64(), rng.Float64(), rng.Float64() * rng.Float64()}
			y := rng.NormFloat64() * 0.1
			for j := range x {
				y += truth[j] * x[j]
			}
			r.add(t0, x, y)
		}
		if !r.solve() {
			t.Fatalf("trial %d: no fit", trial)
		}
		checkKKT(t, r, r.theta)
	}
}

func TestCostModelNeverLearnsANegativeCost(t *testing.T) {
	// An engine whose KV copies cost nothing in a prefill pass, and whose
	// passes seldom copy: noise alone pulls the plain fit's per-block cost
	// below zero in some runs. The learned cost must stay at or above it.
	free := gb300
	free.pc.PerBlock = 0
	negative := 0
	for seed := uint64(1); seed <= 16; seed++ {
		rng := rand.New(rand.NewPCG(seed, 7))
		cm := NewCostModel(10*time.Minute, 50, 0.1)
		now := t0
		for i := 0; i < 400; i++ {
			now = now.Add(20 * time.Millisecond)
			p := randomPass(rng, true)
			if rng.IntN(20) != 0 {
				p.CopyBlocks = 0
			}
			cm.Observe(now, free.pass(rng, p))
		}
		if u := unconstrained(cm.prefill); u[3] < 0 {
			negative++
		}
		pc, _ := cm.PrefillModel()
		if pc.PerBlock < 0 || pc.BaseSec < 0 || pc.PerToken < 0 || pc.PerTokenContext < 0 {
			t.Errorf("seed %d: learned a negative cost: %+v", seed, pc)
		}
		within(t, "prefill per token", pc.PerToken, free.pc.PerToken, 0.05)
		st, _ := cm.Status()
		for _, c := range st.Coefs {
			if c.Value < 0 {
				t.Errorf("seed %d: status shows %s = %g", seed, c.Name, c.Value)
			}
		}
	}
	if negative == 0 {
		t.Fatal("no run pulled the plain fit negative: the test no longer exercises the constraint")
	}
	t.Logf("%d of 16 runs' plain fits had a negative per-block cost", negative)
}
