package sim

import (
	"fmt"
	"testing"
	"time"

	"github.com/evolvellm/evolve/engine/stepmodel"
)

// benchScenario is the claude-code-126x36 preset (evolve sim --preset
// claude-code-126x36): 36 GB300 GPUs of gb300-glm5 (9 engines), 126
// coding agents, seed 1, with the warm-up and scored time given, and KV
// in blocks of the given tokens.
func benchScenario(b *testing.B, warmup, scored time.Duration, blockTokens int) Scenario {
	p, err := stepmodel.BuiltinProfile("gb300-glm5")
	if err != nil {
		b.Fatal(err)
	}
	if p, err = p.WithBlockSize(blockTokens); err != nil {
		b.Fatal(err)
	}
	return Scenario{Profile: p, Engines: 9, Workload: "coding", Agents: 126, Warmup: warmup, Duration: scored, Seed: 1}
}

// benchBlocks are the KV block sizes the benchmarks run: the profile's
// (64 tokens) and evolve sim --kv-block-tokens 256.
var benchBlocks = []int{64, 256}

// runBench runs sc with one policy per iteration and reports x-realtime,
// modelled cluster-seconds per wall-second, and the run's mean end-to-end
// latency (the same as evolve sim's for the same scenario).
func runBench(b *testing.B, sc Scenario, policy string) {
	pol, err := ParsePolicy(policy, sc.Engines)
	if err != nil {
		b.Fatal(err)
	}
	var res Result
	for b.Loop() {
		if res, err = Run(sc, pol); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric((sc.Warmup+sc.Duration).Seconds()*float64(b.N)/b.Elapsed().Seconds(), "x-realtime")
	b.ReportMetric(res.MeanE2E, "mean-e2e-s")
}

// BenchmarkSimClaudeCode126x36 is the speed target of the simulator: the
// whole claude-code-126x36 preset (30 min warm-up + 1 h scored) for the
// evolve policy, as evolve sim --preset claude-code-126x36 --policies
// evolve runs it, with the profile's 64-token KV blocks and with 256-token
// ones (--kv-block-tokens 256). One iteration is one whole run, most of a
// minute on a 2-core machine: run it with -benchtime 1x.
func BenchmarkSimClaudeCode126x36(b *testing.B) {
	for _, tokens := range benchBlocks {
		b.Run(fmt.Sprintf("block=%d", tokens), func(b *testing.B) {
			runBench(b, benchScenario(b, 30*time.Minute, time.Hour, tokens), "evolve")
		})
	}
}

// BenchmarkSimClaudeCode is a quicker look at the same cluster: its first
// 10 modelled minutes from cold (short contexts, so it runs several times
// faster than the preset per modelled second), with a fixed split.
func BenchmarkSimClaudeCode(b *testing.B) {
	for _, tokens := range benchBlocks {
		b.Run(fmt.Sprintf("block=%d", tokens), func(b *testing.B) {
			runBench(b, benchScenario(b, 0, 10*time.Minute, tokens), "static:3:6")
		})
	}
}
