package sim

import (
	"time"

	"github.com/evolvellm/evolve/workload"
)

// oracleOf builds the upper limit named "oracle" in Compare: every fixed
// split runs the whole scenario, and for each minute the oracle takes the
// split that served that minute best (lowest mean end-to-end latency of the
// requests arriving in it), as if
// it had known the future and switched for free. Gluing minutes from
// different runs ignores that the state a minute starts from depends on
// the split before it, so the oracle is optimistic: a limit, not a policy.
func oracleOf(sc Scenario, runs []Result) Result {
	out := Result{Policy: "oracle", Split: "per minute"}
	var e2e, ttft []float64
	var tokens int64
	prev := -1
	for wi := range runs[0].Timeline {
		start := runs[0].Timeline[wi].Start
		if start < sc.Warmup || start >= sc.Warmup+sc.Duration {
			continue
		}
		best := 0
		bestMean := -1.0
		for k, r := range runs {
			if wi >= len(r.Timeline) || r.Timeline[wi].Requests == 0 {
				continue
			}
			m := workload.Summarize(append([]float64(nil), r.Timeline[wi].e2e...)).Mean
			if bestMean < 0 || m < bestMean {
				best, bestMean = k, m
			}
		}
		if prev >= 0 && best != prev {
			out.RoleSwitches++
		}
		prev = best
		w := runs[best].Timeline[wi]
		w.Start = start
		out.Timeline = append(out.Timeline, w)
		e2e = append(e2e, w.e2e...)
		ttft = append(ttft, w.ttft...)
		out.Requests += w.Requests
		out.Sessions += w.Sessions
		tokens += w.OutputTokens
		out.PromptTokens += w.PromptTokens
		out.GPUHitTokens += w.GPUHit
		out.HostHitTokens += w.HostHit
		out.ComputedTokens += w.Computed
		out.LostKVReuse += w.LostReuse
	}
	d, t := workload.Summarize(e2e), workload.Summarize(ttft)
	out.MeanE2E, out.P50E2E, out.P99E2E = d.Mean, d.P50, d.P99
	out.MeanTTFT, out.P50TTFT, out.P95TTFT, out.P99TTFT = t.Mean, t.P50, t.P95, t.P99
	secs := float64(len(out.Timeline)) * time.Minute.Seconds()
	if secs > 0 {
		out.Throughput = float64(tokens) / secs
		out.SessionsPerHour = float64(out.Sessions) / secs * 3600
	}
	out.VirtualSec = runs[0].VirtualSec
	return out
}
