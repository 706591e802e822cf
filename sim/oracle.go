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
	// course: how many of the schedule's first changes are a course
	// replayed from another run (Dynamo's), not the search's.
	course int
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
	for i, ch := range pl.schedule {
		if ch.At < at {
			out.schedule = append(out.schedule, ch)
			if i < pl.course {
				out.course++
			}
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

// oracleStart is a schedule a walk starts from: its plan, its run, and
// where it comes from.
type oracleStart struct {
	from string
	plan oraclePlan
	res  Result
}

// dynamoSchedule is Dynamo's own course as a schedule of splits of every
// engine: at the end of each minute of its run, its serving prefill share
// of the engines it serves, held by all of them (Dynamo's load planner
// also leaves engines idle, which a split of all of them does not).
func dynamoSchedule(dyn Result, n int) oraclePlan {
	pl := oraclePlan{start: dyn.Initial}
	if pl.start < 1 || pl.start >= n {
		pl.start = max(1, n/3)
	}
	cur := pl.start
	for _, w := range dyn.Timeline {
		if w.Prefill+w.Decode == 0 {
			continue
		}
		p := int(float64(n)*float64(w.Prefill)/float64(w.Prefill+w.Decode) + 0.5)
		p = min(max(p, 1), n-1)
		if p != cur {
			pl.schedule = append(pl.schedule, SplitChange{At: w.Start + time.Minute, Prefill: p})
			pl.course++
			cur = p
		}
	}
	return pl
}

// oracleSearch runs the search for the policy called name, judging runs
// with wins (better or moreThroughput); static holds the static runs by
// prefill engines, static[p-1] for p:n-p, evolve evolve's run (its Moves
// are replayed; a zero Result when it has none) and dynamo Dynamo's (its
// course is replayed as splits, dynamoSchedule; a zero Result when there
// is none). It walks from each of the three starts (the best static
// split, evolve's course, Dynamo's course) and keeps the best walk's end.
// progress, when set, hears how many of the boundaries are done;
// cancelled, when set, stops the search and the runs it has under way at
// their next modelled minute.
func oracleSearch(sc Scenario, name string, static []Result, evolve, dynamo Result, wins func(a, b Result) bool, progress func(done, total int), cancelled func() bool) (Result, error) {
	st := oracleStart{from: "static", res: static[0], plan: oraclePlan{start: 1}}
	for i, r := range static[1:] {
		if wins(r, st.res) {
			st.res, st.plan = r, oraclePlan{start: i + 2}
		}
	}
	starts := []oracleStart{st}
	if len(evolve.Moves) > 0 {
		// Replayed without its planner, evolve's switches run as evolve
		// ran: its result is the replay's.
		starts = append(starts, oracleStart{from: "evolve", res: evolve, plan: oraclePlan{start: evolve.Initial, replay: evolve.Moves}})
	}
	if dynamo.Requests > 0 {
		if pl := dynamoSchedule(dynamo, sc.Engines); len(pl.schedule) > 0 {
			res, err := runPlans(sc, []oraclePlan{pl}, cancelled)
			if errors.Is(err, ErrInterrupted) {
				return Result{}, &InterruptedError{Unfinished: []Unfinished{{Policy: name, Total: sc.Warmup + sc.Duration}}}
			}
			if err != nil {
				return Result{}, err
			}
			starts = append(starts, oracleStart{from: "dynamo", res: res[0], plan: pl})
		}
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
	// The walks go side by side, a boundary at a time: each boundary's
	// candidates of every walk run together.
	for k, at := range bounds {
		if progress != nil {
			progress(k, len(bounds))
		}
		var cands []oraclePlan
		var walk []int
		for w, st := range starts {
			cur := st.plan.splitAt(at)
			for p := max(1, cur-OracleReach); p <= min(sc.Engines-1, cur+OracleReach); p++ {
				if p != cur || st.plan.changesAfter(at) {
					cands = append(cands, st.plan.holding(at, p))
					walk = append(walk, w)
				}
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
			if st := &starts[walk[i]]; wins(r, st.res) {
				st.res, st.plan = r, cands[i]
			}
		}
	}
	if progress != nil {
		progress(len(bounds), len(bounds))
	}
	best := starts[0]
	for _, st := range starts[1:] {
		if wins(st.res, best.res) {
			best = st
		}
	}
	res := best.res
	res.Policy, res.Split = name, best.plan.describe(sc.Engines)
	return res, nil
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
// 40m, 3:6 at 1h10m", "1:8, evolve's 5 switches to 1h20m, 6:3 at 1h20m",
// or "3:6, Dynamo's 12 changes to 40m, 4:5 at 40m" (its course replayed
// as splits, dynamoSchedule).
func (pl oraclePlan) describe(n int) string {
	parts := []string{fmt.Sprintf("%d:%d", pl.start, n-pl.start)}
	sched := pl.schedule
	var course string
	switch {
	case len(pl.replay) > 0:
		course = fmt.Sprintf("evolve's %d switches", len(pl.replay))
	case pl.course > 0:
		course = fmt.Sprintf("Dynamo's %d changes", pl.course)
		sched = sched[pl.course:]
	}
	if course != "" {
		if len(sched) > 0 {
			course += " to " + shortAt(sched[0].At)
		}
		parts = append(parts, course)
	}
	for _, ch := range sched {
		parts = append(parts, fmt.Sprintf("%d:%d at %s", ch.Prefill, n-ch.Prefill, shortAt(ch.At)))
	}
	return strings.Join(parts, ", ")
}

// shortAt writes a time into the run as 40m or 1h10m.
func shortAt(d time.Duration) string { return strings.TrimSuffix(d.String(), "0s") }
