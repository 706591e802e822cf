package workload

import (
	"math"
	"math/rand/v2"
	"time"
)

// LogNormal is a distribution given by its median and 95th percentile, as
// the public agent statistics are quoted.
type LogNormal struct {
	Median, P95 float64
}

// Sample draws a value.
func (d LogNormal) Sample(r *rand.Rand) float64 {
	if d.P95 <= d.Median || d.Median <= 0 {
		return d.Median
	}
	sigma := math.Log(d.P95/d.Median) / 1.6448536269514722
	return d.Median * math.Exp(sigma*r.NormFloat64())
}

// Int draws a value rounded to an integer of at least lo.
func (d LogNormal) Int(r *rand.Rand, lo int) int {
	return max(lo, int(math.Round(d.Sample(r))))
}

// Duration draws a value in seconds as a duration.
func (d LogNormal) Duration(r *rand.Rand) time.Duration {
	return time.Duration(d.Sample(r) * float64(time.Second))
}

// uniformInt draws an integer in [lo, hi].
func uniformInt(r *rand.Rand, lo, hi int) int {
	if hi <= lo {
		return lo
	}
	return lo + r.IntN(hi-lo+1)
}
