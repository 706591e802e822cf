package sim

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/evolvellm/evolve/roles"
)

// The oracle is the best schedule of splits the search finds with the
// future known: evolve's router and KV handling, switches by evolve's
// protocol (hand-over, drain, host copy) at set times, and no planner.
// Forking the simulator is replaying it: a run is a pure function of its
// scenario and policy, so a schedule's runs share their past exactly.
//
// The search starts from the best of the static splits (every static run,
// already made for static:best) and of evolve's own run: its planner's
// switches replayed at their times, with no planner, run exactly as
// evolve ran (TestEvolvePlannerFollowsAShift holds it), so whatever
// evolve did is a schedule the oracle has. It then walks the run's
// boundaries, one every OracleSegment from its start: at each it tries
// holding a split within OracleReach engines of the schedule's from there
// on, runs each candidate to the end, and keeps the best by the metric
// being reported, or none if none beats the schedule so far. Each kept
// schedule is at least as good as the one before it, so the oracle is
// never below static:best nor evolve on its metric; it is a greedy
// search, so a schedule it does not try may still do better.
const (
	DefaultOracleSegment = 10 * time.Minute
	OracleReach          = 2
)

// oraclePlan is a schedule the search runs: a static split to start
// from, recorded switches replayed, then split changes.
type oraclePlan struct {
	start    int
	replay   []Move
	schedule []SplitChange
}

// splitAt is the plan's split (prefill engines) once its changes and
// switches before at have begun.
func (pl oraclePlan) splitAt(at time.Duration) int {
	p := pl.start
	for _, m := range pl.replay {
		if m.At < at {
			if m.To == roles.Prefill {
				p++
			} else {
				p--
			}
		}
	}
	for _, ch := range pl.schedule {
		if ch.At < at {
			p = ch.Prefill
		}
	}
	return p
}

// holding is the plan until at, then the split p held from at on.
func (pl oraclePlan) holding(at time.Duration, p int) oraclePlan {
	out := oraclePlan{start: pl.start}
	for _, m := range pl.replay {
		if m.At < at {
			out.replay = append(out.replay, m)
		}
	}
	for _, ch := range pl.schedule {
		if ch.At < at {
			out.schedule = append(out.schedule, ch)
		}
	}
	out.schedule = append(out.schedule, SplitChange{At: at, Prefill: p})
	return out
}

// changesAfter reports whether the plan changes the split at or after at.
func (pl oraclePlan) changesAfter(at time.Duration) bool {
	return slices.ContainsFunc(pl.replay, func(m Move) bool { return m.At >= at }) ||
		slices.ContainsFunc(pl.schedule, func(ch SplitChange) bool { return ch.At >= at })
}

// oracleSearch runs the search for the policy called name, judging runs
// with wins (better or moreThroughput); static holds the static runs by
// prefill engines, static[p-1] for p:n-p, and evolve evolve's run (its
// Moves are replayed; a zero Result when it has none). progress, when
// set, hears how many of the boundaries are done; cancelled, when set,
// stops the search and the runs it has under way at their next modelled
// minute.
func oracleSearch(sc Scenario, name string, static []Result, evolve Result, wins func(a, b Result) bool, progress func(done, total int), cancelled func() bool) (Result, error) {
	best, plan := static[0], oraclePlan{start: 1}
	for i, r := range static[1:] {
		if wins(r, best) {
			best, plan = r, oraclePlan{start: i + 2}
		}
	}
	if len(evolve.Moves) > 0 && wins(evolve, best) {
		// Replayed without its planner, evolve's switches run as evolve
		// ran: its result is the replay's.
		best, plan = evolve, oraclePlan{start: evolve.Initial, replay: evolve.Moves}
	}
	total := sc.Warmup + sc.Duration
	var bounds []time.Duration
	seg := sc.OracleSegment
	if seg <= 0 {
		seg = DefaultOracleSegment
	}
	for at := seg; at < total; at += seg {
		bounds = append(bounds, at)
	}
	for k, at := range bounds {
		if progress != nil {
			progress(k, len(bounds))
		}
		cur := plan.splitAt(at)
		var cands []oraclePlan
		for p := max(1, cur-OracleReach); p <= min(sc.Engines-1, cur+OracleReach); p++ {
			if p != cur || plan.changesAfter(at) {
				cands = append(cands, plan.holding(at, p))
			}
		}
		results, err := runPlans(sc, cands, cancelled)
		if errors.Is(err, ErrInterrupted) {
			return Result{}, &InterruptedError{Unfinished: []Unfinished{{Policy: name, Elapsed: time.Duration(k) * total / time.Duration(len(bounds)), Total: total}}}
		}
		if err != nil {
			return Result{}, err
		}
		for i, r := range results {
			if wins(r, best) {
				best, plan = r, cands[i]
			}
		}
	}
	if progress != nil {
		progress(len(bounds), len(bounds))
	}
	best.Policy, best.Split = name, plan.describe(sc.Engines)
	return best, nil
}

// runPlans runs each plan, a worker per core; cancelled, when set, stops
// every run at its next modelled minute.
func runPlans(sc Scenario, plans []oraclePlan, cancelled func() bool) ([]Result, error) {
	var rh runHooks
	if cancelled != nil {
		rh.progress = func(_, _ time.Duration) bool { return cancelled() }
	}
	out := make([]Result, len(plans))
	errs := make([]error, len(plans))
	var wg sync.WaitGroup
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	for i, pl := range plans {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			pol, err := ParsePolicy(fmt.Sprintf("static:%d:%d", pl.start, sc.Engines-pl.start), sc.Engines)
			if err != nil {
				errs[i] = err
				return
			}
			pol.Replay, pol.Schedule = pl.replay, pl.schedule
			out[i], errs[i] = runWith(sc, pol, rh)
		}()
	}
	wg.Wait()
	return out, errors.Join(errs...)
}

// describe writes a plan as its splits and when they begin: "3:6, 4:5 at
// 40m, 3:6 at 1h10m", or "1:8, evolve's 5 switches to 1h20m, 6:3 at
// 1h20m".
func (pl oraclePlan) describe(n int) string {
	parts := []string{fmt.Sprintf("%d:%d", pl.start, n-pl.start)}
	if len(pl.replay) > 0 {
		parts = append(parts, fmt.Sprintf("evolve's %d switches", len(pl.replay)))
		if len(pl.schedule) > 0 {
			parts[1] += " to " + strings.TrimSuffix(pl.schedule[0].At.String(), "0s")
		}
	}
	for _, ch := range pl.schedule {
		parts = append(parts, fmt.Sprintf("%d:%d at %s", ch.Prefill, n-ch.Prefill, strings.TrimSuffix(ch.At.String(), "0s")))
	}
	return strings.Join(parts, ", ")
}
