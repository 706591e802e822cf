package workload

import (
	"math"
	"sort"
)

// Dist summarises a set of latencies, in seconds.
type Dist struct {
	N    int     `json:"n"`
	Mean float64 `json:"mean_s"`
	P50  float64 `json:"p50_s"`
	P95  float64 `json:"p95_s"`
	P99  float64 `json:"p99_s"`
}

// Summarize computes a Dist; xs is sorted in place.
func Summarize(xs []float64) Dist {
	if len(xs) == 0 {
		return Dist{}
	}
	sort.Float64s(xs)
	sum := 0.0
	for _, x := range xs {
		sum += x
	}
	q := func(p float64) float64 {
		i := int(math.Ceil(p*float64(len(xs)))) - 1
		return xs[min(max(i, 0), len(xs)-1)]
	}
	return Dist{N: len(xs), Mean: sum / float64(len(xs)), P50: q(0.50), P95: q(0.95), P99: q(0.99)}
}
