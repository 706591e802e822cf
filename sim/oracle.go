package sim

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"
)

// The oracle is the best schedule of splits the search finds with the
// future known: evolve's router and KV handling, switches by evolve's
// protocol (hand-over, drain, host copy) at set times, and no planner.
// Forking the simulator is replaying it: a run is a pure function of its
// scenario and policy, so a schedule's runs share their past exactly.
//
// The search starts from the best static split (every static run, already
// made for static:best) and walks the run's boundaries, one every
// OracleSegment from its start: at each it tries moving the split by up
// to OracleReach engines from there on, runs each candidate to the end,
// and keeps the best by the metric being reported, or none if none
// beats the schedule so far. Each kept schedule is at least as good as
// the one before it, so the oracle is never below static:best; it is a
// greedy search, so a schedule it does not try may still do better.
const (
	DefaultOracleSegment = 10 * time.Minute
	OracleReach          = 2
)

// oracleSearch runs the search for the policy called name, judging runs
// with wins (better or moreThroughput); static holds the static runs by
// prefill engines, static[p-1] for p:n-p. progress, when set, hears how
// many of the boundaries are done; cancelled, when set, stops the search
// and the runs it has under way at their next modelled minute.
func oracleSearch(sc Scenario, name string, static []Result, wins func(a, b Result) bool, progress func(done, total int), cancelled func() bool) (Result, error) {
	best, p0 := static[0], 1
	for i, r := range static[1:] {
		if wins(r, best) {
			best, p0 = r, i+2
		}
	}
	base, err := ParsePolicy(fmt.Sprintf("static:%d:%d", p0, sc.Engines-p0), sc.Engines)
	if err != nil {
		return Result{}, err
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
	var schedule []SplitChange // in time order: its last change is the split now
	for k, at := range bounds {
		if progress != nil {
			progress(k, len(bounds))
		}
		cur := p0
		if len(schedule) > 0 {
			cur = schedule[len(schedule)-1].Prefill
		}
		var cands [][]SplitChange
		for p := max(1, cur-OracleReach); p <= min(sc.Engines-1, cur+OracleReach); p++ {
			if p != cur {
				cands = append(cands, append(slices.Clone(schedule), SplitChange{At: at, Prefill: p}))
			}
		}
		results, err := runSchedules(sc, base, cands, cancelled)
		if errors.Is(err, ErrInterrupted) {
			return Result{}, &InterruptedError{Unfinished: []Unfinished{{Policy: name, Elapsed: time.Duration(k) * total / time.Duration(len(bounds)), Total: total}}}
		}
		if err != nil {
			return Result{}, err
		}
		for i, r := range results {
			if wins(r, best) {
				best, schedule = r, cands[i]
			}
		}
	}
	if progress != nil {
		progress(len(bounds), len(bounds))
	}
	best.Policy, best.Split = name, describeSchedule(p0, schedule, sc.Engines)
	return best, nil
}

// runSchedules runs policy base under each schedule, a worker per core;
// cancelled, when set, stops every run at its next modelled minute.
func runSchedules(sc Scenario, base Policy, schedules [][]SplitChange, cancelled func() bool) ([]Result, error) {
	var rh runHooks
	if cancelled != nil {
		rh.progress = func(_, _ time.Duration) bool { return cancelled() }
	}
	out := make([]Result, len(schedules))
	errs := make([]error, len(schedules))
	var wg sync.WaitGroup
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	for i, s := range schedules {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			pol := base
			pol.Schedule = s
			out[i], errs[i] = runWith(sc, pol, rh)
		}()
	}
	wg.Wait()
	return out, errors.Join(errs...)
}

// describeSchedule writes a schedule as its splits and when they begin:
// "3:6, 4:5 at 40m, 3:6 at 1h10m".
func describeSchedule(p0 int, schedule []SplitChange, n int) string {
	parts := []string{fmt.Sprintf("%d:%d", p0, n-p0)}
	for _, ch := range schedule {
		parts = append(parts, fmt.Sprintf("%d:%d at %s", ch.Prefill, n-ch.Prefill, strings.TrimSuffix(ch.At.String(), "0s")))
	}
	return strings.Join(parts, ", ")
}
