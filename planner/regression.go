package planner

import (
	"math"
	"slices"
	"time"
)

// regression is exponentially weighted least squares with a small ridge,
// its coefficients held non-negative:
// the batch form of recursive least squares with forgetting. Old samples
// lose weight as exp(-age/tau), so a model change (a new engine build, a
// new profile) is followed within a few tau; the ridge keeps directions the
// data does not excite near zero instead of letting them wind up, the
// usual failure of textbook RLS with forgetting on a workload that stops
// exercising a feature. Every coefficient is a cost (seconds of a pass,
// per pass, token, sequence or block), so none may be negative: where the
// unconstrained fit puts one below zero (a feature the data hardly
// excites, or two that move together), it is the non-negative least
// squares fit instead. Adding a sample is O(k^2); solving is O(k^3), or
// O(2^k k^3) when a coefficient would go negative, and done only when
// asked, with k = 4.
type regression struct {
	k     int
	tau   float64 // seconds
	ridge float64
	xtx   []float64 // k x k, row major
	xty   []float64
	yy    float64
	w     float64 // sum of weights: the effective number of samples
	n     int     // samples ever added
	last  time.Time

	solved bool
	theta  []float64
	cov    []float64 // (X'WX + ridge I)^-1, k x k
	sigma2 float64   // residual variance per sample
}

func newRegression(k int, tau time.Duration) *regression {
	return &regression{k: k, tau: tau.Seconds(), ridge: 1e-6, xtx: make([]float64, k*k), xty: make([]float64, k)}
}

// decay ages the sums to now.
func (r *regression) decay(now time.Time) {
	if r.last.IsZero() {
		r.last = now
		return
	}
	dt := now.Sub(r.last).Seconds()
	if dt <= 0 {
		return
	}
	r.last = now
	f := math.Exp(-dt / r.tau)
	for i := range r.xtx {
		r.xtx[i] *= f
	}
	for i := range r.xty {
		r.xty[i] *= f
	}
	r.yy *= f
	r.w *= f
	r.solved = false
}

// add records one sample at now.
func (r *regression) add(now time.Time, x []float64, y float64) {
	r.decay(now)
	k := r.k
	for i := 0; i < k; i++ {
		xi := x[i]
		if xi == 0 {
			continue
		}
		row := r.xtx[i*k : i*k+k]
		for j := 0; j < k; j++ {
			row[j] += xi * x[j]
		}
		r.xty[i] += xi * y
	}
	r.yy += y * y
	r.w++
	r.n++
	r.solved = false
}

// solve fits the coefficients; ok is false until there are more effective
// samples than coefficients.
func (r *regression) solve() (ok bool) {
	if r.solved {
		return r.w > float64(r.k)
	}
	k := r.k
	a, inv, theta, good := r.plainFit()
	if !good {
		return false
	}
	if slices.ContainsFunc(theta, func(v float64) bool { return v < 0 }) {
		theta = nonNegative(a, r.xty, k)
	}
	// Weighted residual sum of squares: y'y - 2 t'X'y + t'X'X t.
	rss := r.yy
	for i := 0; i < k; i++ {
		rss -= 2 * theta[i] * r.xty[i]
		for j := 0; j < k; j++ {
			rss += theta[i] * r.xtx[i*k+j] * theta[j]
		}
	}
	dof := r.w - float64(k)
	r.sigma2 = 0
	if dof > 0 {
		r.sigma2 = max(rss, 0) / dof
	}
	r.theta, r.cov, r.solved = theta, inv, true
	return r.w > float64(k)
}

// plainFit is the unconstrained ridge fit: the normal equations' matrix a
// (X'WX plus the ridge), its inverse and the coefficients.
func (r *regression) plainFit() (a, inv, theta []float64, ok bool) {
	k := r.k
	a = make([]float64, k*k)
	copy(a, r.xtx)
	for i := 0; i < k; i++ {
		a[i*k+i] += r.ridge * max(1, r.w)
	}
	if inv, ok = invertSPD(a, k); !ok {
		return nil, nil, nil, false
	}
	theta = make([]float64, k)
	for i := 0; i < k; i++ {
		for j := 0; j < k; j++ {
			theta[i] += inv[i*k+j] * r.xty[j]
		}
	}
	return a, inv, theta, true
}

// predict returns the fitted value at x and its standard error.
func (r *regression) predict(x []float64) (y, se float64) {
	if !r.solve() {
		return 0, math.Inf(1)
	}
	k := r.k
	v := 0.0
	for i := 0; i < k; i++ {
		y += r.theta[i] * x[i]
		for j := 0; j < k; j++ {
			v += x[i] * r.cov[i*k+j] * x[j]
		}
	}
	return y, math.Sqrt(r.sigma2 * v)
}

// coef returns coefficient i and its standard error.
func (r *regression) coef(i int) (v, se float64) {
	if !r.solve() {
		return 0, math.Inf(1)
	}
	return r.theta[i], math.Sqrt(r.sigma2 * r.cov[i*r.k+i])
}

// meanX is the weighted mean of the samples' features (feature 0 is the
// constant 1, so row 0 of X'WX holds the weighted sums).
func (r *regression) meanX() []float64 {
	out := make([]float64, r.k)
	if r.w <= 0 {
		return out
	}
	for j := range out {
		out[j] = r.xtx[j] / r.w
	}
	return out
}

// nonNegative minimises the least-squares objective 1/2 t'At - b't over
// t >= 0, for A symmetric positive definite: the non-negative least
// squares fit from the normal equations. The objective is strictly convex,
// so its minimum over t >= 0 is the unconstrained minimum over some set of
// free coefficients with the rest at zero; with k = 4 there are 16 such
// sets, and the best feasible one is the answer (the empty set, t = 0, is
// always feasible).
func nonNegative(a, b []float64, k int) []float64 {
	best := make([]float64, k)
	bestF := 0.0
	free := make([]int, 0, k)
	for set := 1; set < 1<<k; set++ {
		free = free[:0]
		for i := 0; i < k; i++ {
			if set&(1<<i) != 0 {
				free = append(free, i)
			}
		}
		m := len(free)
		sub := make([]float64, m*m)
		for i, fi := range free {
			for j, fj := range free {
				sub[i*m+j] = a[fi*k+fj]
			}
		}
		inv, ok := invertSPD(sub, m)
		if !ok {
			continue
		}
		t := make([]float64, k)
		feasible := true
		for i, fi := range free {
			for j, fj := range free {
				t[fi] += inv[i*m+j] * b[fj]
			}
			if t[fi] < 0 {
				feasible = false
				break
			}
		}
		if !feasible {
			continue
		}
		// On its free set the fit solves A t = b, so 1/2 t'At - b't = -1/2 b't.
		f := 0.0
		for _, fi := range free {
			f -= 0.5 * b[fi] * t[fi]
		}
		if f < bestF {
			best, bestF = t, f
		}
	}
	return best
}

// invertSPD inverts a symmetric positive definite k x k matrix by
// Cholesky decomposition.
func invertSPD(a []float64, k int) ([]float64, bool) {
	l := make([]float64, k*k)
	for i := 0; i < k; i++ {
		for j := 0; j <= i; j++ {
			s := a[i*k+j]
			for p := 0; p < j; p++ {
				s -= l[i*k+p] * l[j*k+p]
			}
			if i == j {
				if s <= 0 {
					return nil, false
				}
				l[i*k+i] = math.Sqrt(s)
			} else {
				l[i*k+j] = s / l[j*k+j]
			}
		}
	}
	// inv = L^-T L^-1: invert L (lower triangular), then multiply.
	li := make([]float64, k*k)
	for i := 0; i < k; i++ {
		li[i*k+i] = 1 / l[i*k+i]
		for j := 0; j < i; j++ {
			s := 0.0
			for p := j; p < i; p++ {
				s -= l[i*k+p] * li[p*k+j]
			}
			li[i*k+j] = s / l[i*k+i]
		}
	}
	inv := make([]float64, k*k)
	for i := 0; i < k; i++ {
		for j := 0; j <= i; j++ {
			s := 0.0
			for p := i; p < k; p++ {
				s += li[p*k+i] * li[p*k+j]
			}
			inv[i*k+j], inv[j*k+i] = s, s
		}
	}
	return inv, true
}
