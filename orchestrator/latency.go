package orchestrator

import (
	"math"
	"sort"
	"sync"
	"time"

	"github.com/evolvellm/evolve/controlapi"
)

// RecentWindow is how far back the control API's recent latencies look.
const RecentWindow = time.Minute

// maxRecent bounds the samples a window keeps (the oldest go first).
const maxRecent = 1 << 17

// Recent is what requests measured at the router over the last window:
// the control API's answer to "how is it going now", where Prometheus
// histograms answer "since the start".
type Recent = controlapi.Recent

// latencyWindow keeps the TTFT and end-to-end latency of recent requests.
// Safe for concurrent use.
type latencyWindow struct {
	mu        sync.Mutex
	ttft, e2e []sample
}

type sample struct {
	at time.Time
	v  float64
}

func (w *latencyWindow) addTTFT(now time.Time, sec float64) { w.add(&w.ttft, now, sec) }
func (w *latencyWindow) addE2E(now time.Time, sec float64)  { w.add(&w.e2e, now, sec) }

// add records a sample. Samples older than the window are dropped here
// too (at most once a window, when the oldest is two windows old), not
// only when someone asks for the window: a router nobody asks keeps one
// to two minutes of samples, not the maxRecent its traffic reaches
// between two status calls.
func (w *latencyWindow) add(s *[]sample, now time.Time, v float64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	*s = append(*s, sample{now, v})
	if len(*s) > maxRecent {
		*s = append((*s)[:0], (*s)[len(*s)-maxRecent/2:]...)
	}
	if old := (*s)[0].at; now.Sub(old) > 2*RecentWindow {
		drop(s, now.Add(-RecentWindow))
	}
}

// recent summarises the window ending at now, dropping older samples. A
// window is no longer than the time since started, when the router began
// to serve: a rate over its first seconds is not divided by a minute.
func (w *latencyWindow) recent(now, started time.Time) Recent {
	w.mu.Lock()
	ttft := prune(&w.ttft, now.Add(-RecentWindow))
	e2e := prune(&w.e2e, now.Add(-RecentWindow))
	w.mu.Unlock()
	window := min(RecentWindow, now.Sub(started)).Round(time.Second)
	if window < time.Second {
		window = time.Second
	}
	r := Recent{WindowSec: window.Seconds(), Requests: len(e2e), RequestsSec: float64(len(e2e)) / window.Seconds()}
	r.TTFTP50, r.TTFTP95 = quantile(ttft, 0.5), quantile(ttft, 0.95)
	r.E2EP50, r.E2EP95 = quantile(e2e, 0.5), quantile(e2e, 0.95)
	return r
}

// prune drops the samples before from and returns a sorted copy of the
// values of the rest. Call with mu held.
func prune(s *[]sample, from time.Time) []float64 {
	drop(s, from)
	out := make([]float64, len(*s))
	for i, x := range *s {
		out[i] = x.v
	}
	sort.Float64s(out)
	return out
}

// drop removes the samples before from. Call with mu held.
func drop(s *[]sample, from time.Time) {
	k := sort.Search(len(*s), func(i int) bool { return !(*s)[i].at.Before(from) })
	*s = append((*s)[:0], (*s)[k:]...)
}

// quantile of sorted values, nearest rank; 0 when empty.
func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}
