package sim

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/evolvellm/evolve/engine/stepmodel"
)

// The evolve policy's planner follows a shift from output-heavy math to
// prompt-heavy computer use: more prefill nodes once computer use
// dominates than during math, reached within minutes, with every decode on
// a node that leaves decode handed over rather than waited for.
func TestEvolvePlannerFollowsAShift(t *testing.T) {
	p, err := stepmodel.BuiltinProfile("gb300-kimi-k2")
	if err != nil {
		t.Fatal(err)
	}
	// Coarse KV blocks, as evolve sim --kv-block-tokens, for a test that
	// runs in a minute under -race on a 2-core machine: the logic tested
	// is the same at any block size.
	if p, err = p.WithBlockSize(512); err != nil {
		t.Fatal(err)
	}
	sc := Scenario{Profile: p, Engines: 6, Workload: "shift:math>computer-use:12m:1m:30m", Agents: 110,
		Warmup: 0, Duration: 30 * time.Minute, Seed: 2}
	pol, _ := ParsePolicy("evolve", 6)
	res, err := Run(sc, pol)
	if err != nil {
		t.Fatal(err)
	}
	tl := res.Timeline
	for _, w := range tl {
		t.Logf("minute %2.0f: %d:%d, %d requests, mean TTFT %.2fs (predicted %.2fs, recommends %d prefill)", w.Start.Minutes(), w.Prefill, w.Decode, w.Requests, mean(w.ttft), w.PredictedTTFT, w.Recommended)
	}
	math, cu := tl[11], tl[len(tl)-1]
	if cu.Prefill <= math.Prefill {
		t.Fatalf("prefill nodes: %d during math, %d during computer use; want more for computer use", math.Prefill, cu.Prefill)
	}
	if res.RoleSwitches == 0 || res.Retried != 0 {
		t.Fatalf("switches %d, retried %d", res.RoleSwitches, res.Retried)
	}
	// The planner's queueing model is calibrated: over the last minutes
	// its predicted TTFT is within 30% of the measured one.
	var pred, got float64
	for _, w := range tl[len(tl)-3:] {
		pred += w.PredictedTTFT
		got += mean(w.ttft)
	}
	if pred < 0.7*got || pred > 1.3*got {
		t.Fatalf("predicted TTFT %.3fs, measured %.3fs (sums over 3 minutes)", pred, got)
	}
	// Its switches, replayed from its first split with no planner (as the
	// oracle's search starts from them), give the same run: the planner
	// acts on the cluster only by its switches.
	again, _ := ParsePolicy(fmt.Sprintf("static:%d:%d", res.Initial, 6-res.Initial), 6)
	again.Replay = res.Moves
	b, err := Run(sc, again)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Moves, b.Moves) || res.MeanE2E != b.MeanE2E || res.Throughput != b.Throughput || res.Requests != b.Requests {
		t.Fatalf("replayed: moves %v against %v, mean E2E %.4f s against %.4f s, %.1f tok/s against %.1f, %d requests against %d",
			b.Moves, res.Moves, b.MeanE2E, res.MeanE2E, b.Throughput, res.Throughput, b.Requests, res.Requests)
	}
}

// A stationary workload with noisy arrivals: after the planner has fitted
// the split, at most one switch per 10 minutes.
func TestEvolvePlannerHoldsOnAStationaryWorkload(t *testing.T) {
	p, err := stepmodel.BuiltinProfile("gb300-kimi-k2")
	if err != nil {
		t.Fatal(err)
	}
	sc := Scenario{Profile: p, Engines: 6, Workload: "coding", Agents: 60, Warmup: 10 * time.Minute, Duration: 30 * time.Minute, Seed: 4}
	pol, _ := ParsePolicy("evolve", 6)
	res, err := Run(sc, pol)
	if err != nil {
		t.Fatal(err)
	}
	if res.RoleSwitches > 3 {
		for _, w := range res.Timeline {
			t.Logf("minute %2.0f: %d:%d, recommends %d", w.Start.Minutes(), w.Prefill, w.Decode, w.Recommended)
		}
		t.Fatalf("%d switches in 30 stationary minutes; want at most 3", res.RoleSwitches)
	}
	// Not holding for want of a model: the planner had fitted a split.
	if last := res.Timeline[len(res.Timeline)-1]; res.Requests == 0 || last.Recommended < 0 {
		t.Fatalf("%d requests; planner recommendation %d (-1: still learning)", res.Requests, last.Recommended)
	}
	t.Logf("%d switches", res.RoleSwitches)
}

func mean(x []float64) float64 {
	s := 0.0
	for _, v := range x {
		s += v
	}
	return s / float64(max(1, len(x)))
}

// A decode node that evolve's planner moves to prefill hands its decodes
// over to peers, as the live orchestrator does with evolve's engines;
// with DrainSwitches it finishes them first, as a node running vLLM
// does, and hands nothing over.
func TestDrainSwitchesHandsNothingOver(t *testing.T) {
	p, err := stepmodel.BuiltinProfile("gb300-kimi-k2")
	if err != nil {
		t.Fatal(err)
	}
	pol, _ := ParsePolicy("evolve", 3)
	var handed [2]int
	for i, drain := range []bool{false, true} {
		// Computer use on a 1:2 split: the planner moves a decode node
		// to prefill within minutes.
		sc := Scenario{Profile: p, Engines: 3, Workload: "computer-use", Agents: 30,
			Warmup: time.Minute, Duration: 3 * time.Minute, Seed: 1, DrainSwitches: drain}
		res, err := Run(sc, pol)
		if err != nil {
			t.Fatal(err)
		}
		if res.RoleSwitches == 0 {
			t.Fatalf("drain %v: the planner moved no node", drain)
		}
		handed[i] = res.HandedOver
	}
	if handed[0] == 0 || handed[1] != 0 {
		t.Fatalf("decodes handed over: %d by default, %d when switches drain", handed[0], handed[1])
	}
}
