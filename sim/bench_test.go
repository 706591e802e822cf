package sim

import (
	"testing"
	"time"

	enginesim "github.com/evolvellm/evolve/engine/sim"
)

// BenchmarkSimClaudeCode runs the claude-code-126x36 cluster (9 engines,
// 126 coding agents) for 10 modelled minutes per iteration with one policy.
// x-realtime is modelled cluster-seconds per wall-second; the full preset
// (30 min warm-up + 1 h) takes 90 min / x-realtime.
func BenchmarkSimClaudeCode(b *testing.B) {
	p, err := enginesim.LoadProfile("gb300-kimi-k2")
	if err != nil {
		b.Fatal(err)
	}
	sc := Scenario{Profile: p, Engines: 9, Workload: "coding", Agents: 126, Warmup: 0, Duration: 10 * time.Minute, Seed: 1}
	pol, _ := ParsePolicy("static:3:6", 9)
	for b.Loop() {
		if _, err := Run(sc, pol); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(sc.Duration.Seconds()*float64(b.N)/b.Elapsed().Seconds(), "x-realtime")
}
