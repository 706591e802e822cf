package sim

import (
	"fmt"
	"testing"
	"time"

	enginesim "github.com/evolvellm/evolve/engine/sim"
)

// BenchmarkSimClaudeCode runs the claude-code-126x36 cluster (9 engines,
// 126 coding agents) for 10 modelled minutes per iteration with one policy,
// with KV in the profile's 64-token blocks and in 256-token ones (evolve sim
// --kv-block-tokens 256). x-realtime is modelled cluster-seconds per
// wall-second; the full preset (30 min warm-up + 1 h) takes 90 min /
// x-realtime.
func BenchmarkSimClaudeCode(b *testing.B) {
	p, err := enginesim.LoadProfile("gb300-kimi-k2")
	if err != nil {
		b.Fatal(err)
	}
	for _, tokens := range []int{p.BlockSize, 256} {
		b.Run(fmt.Sprintf("block=%d", tokens), func(b *testing.B) {
			bp, err := p.WithBlockSize(tokens)
			if err != nil {
				b.Fatal(err)
			}
			sc := Scenario{Profile: bp, Engines: 9, Workload: "coding", Agents: 126, Warmup: 0, Duration: 10 * time.Minute, Seed: 1}
			pol, _ := ParsePolicy("static:3:6", 9)
			for b.Loop() {
				if _, err := Run(sc, pol); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(sc.Duration.Seconds()*float64(b.N)/b.Elapsed().Seconds(), "x-realtime")
		})
	}
}
