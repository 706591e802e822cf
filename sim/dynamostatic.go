package sim

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/evolvellm/evolve/workload"
)

// dynamoStaticSplit is the prefill engines of dynamo-static, Dynamo without
// a planner (docs/baselines.md): the split
// its profiler's throughput formulas (those of the SLA planner) give for
// the scenario's first workload phase, scaled to use every engine. The
// demand (request rate, mean input and output lengths) is what an operator
// would measure on the running deployment: it is observed over the second
// half of the scenario's warm-up (at least the SLA planner's 180 s
// interval), served by Dynamo at its recipe ratio. The observation runs
// the same code as the run itself, so the split is the same for the same
// seed. It also returns the modelled time it measured for. hooks' progress
// hears the measurement as the first part of the run named name (which
// then follows it), and can stop it, as part of that run.
func dynamoStaticSplit(sc Scenario, name string, hooks runHooks) (prefill int, probed time.Duration, err error) {
	recipe := max(1, sc.Engines/3)
	probe := sc
	probe.Warmup, probe.Duration = 0, max(sc.Warmup, 2*slaInterval)
	from := probe.Duration / 2
	var calls int
	var isl, osl int64
	ph := runHooks{call: func(at time.Duration, c workload.Call) {
		if at >= from {
			calls++
			isl += int64(len(c.Tokens))
			osl += int64(c.MaxTokens)
		}
	}}
	if hooks.progress != nil {
		total := probe.Duration + sc.Warmup + sc.Duration
		ph.progress = func(elapsed, _ time.Duration) bool { return hooks.progress(elapsed, total) }
	}
	pol, err := ParsePolicy(fmt.Sprintf("dynamo-static:%d:%d", recipe, sc.Engines-recipe), sc.Engines)
	if err != nil {
		return 0, 0, err
	}
	var ie *InterruptedError
	if _, err := runWith(probe, pol, ph); errors.As(err, &ie) && len(ie.Unfinished) == 1 {
		u := ie.Unfinished[0]
		return 0, 0, &InterruptedError{Unfinished: []Unfinished{{Policy: name, Elapsed: u.Elapsed, Total: probe.Duration + sc.Warmup + sc.Duration}}}
	} else if err != nil {
		return 0, 0, err
	}
	if calls == 0 {
		return recipe, probe.Duration, nil // no demand to size for
	}
	cfg := pol.engineConfig().WithDefaults(sc.Profile)
	n := float64(calls)
	p, d := dynamoReplicas(sc.Profile, cfg, sc.Engines, n/(probe.Duration-from).Seconds(), float64(isl)/n, float64(osl)/n)
	return scaleSplit(p, d, sc.Engines), probe.Duration, nil
}

// scaleSplit scales a p:d split to total engines in proportion, at least
// one engine in each role.
func scaleSplit(p, d, total int) int {
	return max(1, min(total-1, int(math.Round(float64(total)*float64(p)/float64(p+d)))))
}
