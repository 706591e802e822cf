package sim

import (
	"sync"
	"testing"
	"time"

	"github.com/evolvellm/evolve/engine/stepmodel"
	"github.com/evolvellm/evolve/workload"
)

// Mean E2E counts every request that arrived in the scored window: one
// still running at its end counts its age then. On a math fleet scored
// for a few minutes (answers of thousands of tokens) many are still
// running; completed and unfinished together are every scored arrival,
// and the unfinished ones' mean age lies within the scored window, so
// the corrected mean sits above the finished-only one by exactly their
// share.
func TestMeanE2ECountsUnfinishedRequests(t *testing.T) {
	p, err := stepmodel.BuiltinProfile("gb300-kimi-k2")
	if err != nil {
		t.Fatal(err)
	}
	sc := Scenario{Profile: p, Engines: 2, Workload: "math", Agents: 12, Warmup: 2 * time.Minute, Duration: 4 * time.Minute, Seed: 1}
	var mu sync.Mutex
	arrived := 0
	res, err := Compare(sc, []string{"static:1:1"}, &Hooks{Call: func(_ string, at time.Duration, _ workload.Call) {
		mu.Lock()
		defer mu.Unlock()
		if at >= sc.Warmup && at <= sc.Warmup+sc.Duration {
			arrived++
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	r := res[0]
	if r.RequestsUnfinished == 0 || r.Requests == 0 {
		t.Fatalf("%d completed, %d unfinished: the scenario should leave some running", r.Requests, r.RequestsUnfinished)
	}
	if r.Requests+r.RequestsUnfinished != arrived {
		t.Fatalf("%d completed + %d unfinished, %d arrived in the scored window", r.Requests, r.RequestsUnfinished, arrived)
	}
	n := float64(r.Requests + r.RequestsUnfinished)
	ageSum := r.MeanE2E*n - r.MeanE2EFinished*float64(r.Requests)
	if meanAge := ageSum / float64(r.RequestsUnfinished); meanAge <= 0 || meanAge > sc.Duration.Seconds() {
		t.Fatalf("unfinished requests' mean age %.1f s, want within the %v scored", meanAge, sc.Duration)
	}
	if r.MeanE2E == r.MeanE2EFinished {
		t.Fatalf("mean E2E %.2f s is the finished-only mean: the unfinished are not counted", r.MeanE2E)
	}
}
