package sim

import (
	"cmp"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/evolvellm/evolve/workload"
)

// Compare runs every named policy on the scenario, side by side. A name
// ending in ":best" sweeps and reports the run with the lowest mean
// end-to-end latency, named as asked, with its split: static:best and
// dynamo-static:best over every fixed split, dynamo:best over those Dynamo
// splits and the shipped planner. ":best-throughput" sweeps the same runs
// and reports the one with the most output tokens a second: where
// throughput is the claim, the baseline is the best for throughput, which
// need not be the best for latency. "oracle" searches schedules of splits
// from the best static one or evolve's own, by mean end-to-end latency, and
// "oracle-throughput" by output tokens a second (see oracle.go). Independent runs use every core; the
// results do not depend on how many there are. hooks may be nil.
func Compare(sc Scenario, names []string, hooks *Hooks) ([]Result, error) {
	if err := sc.Validate(); err != nil {
		return nil, err
	}
	// Expand every name into the runs it needs.
	type job struct {
		pol Policy
		res Result
		err error
	}
	var jobs []*job
	need := map[string]*job{}
	add := func(name string) error {
		if need[name] != nil {
			return nil
		}
		pol, err := ParsePolicy(name, sc.Engines)
		if err != nil {
			return err
		}
		j := &job{pol: pol}
		need[name] = j
		jobs = append(jobs, j)
		return nil
	}
	splits := func(base string) []string {
		var out []string
		for p := 1; p < sc.Engines; p++ {
			out = append(out, fmt.Sprintf("%s:%d:%d", base, p, sc.Engines-p))
		}
		return out
	}
	members := map[string][]string{}
	for _, name := range names {
		var m []string
		switch sweep, _ := strings.CutSuffix(name, "-throughput"); {
		case sweep == "static:best":
			m = splits("static")
		case sweep == "oracle":
			m = append(splits("static"), "evolve", "dynamo") // its walks start from the best split and from evolve's and Dynamo's courses
		case sweep == "dynamo-static:best":
			m = splits("dynamo-static")
		case sweep == "dynamo:best":
			m = append([]string{"dynamo", "dynamo-sla"}, splits("dynamo-static")...)
		case strings.HasSuffix(sweep, ":best"):
			return nil, fmt.Errorf("policy %q: only static:best, dynamo-static:best and dynamo:best sweep (and their -throughput)", name)
		default:
			m = []string{name}
		}
		for _, n := range m {
			if err := add(n); err != nil {
				return nil, err
			}
		}
		members[name] = m
	}

	// Run them, a worker per core, longest first: the run that starts
	// last should be a short one, or one core idles while the other
	// finishes it. The order changes no result.
	slices.SortStableFunc(jobs, func(a, b *job) int {
		return cmp.Compare(expectedCost(b.pol, sc.Engines), expectedCost(a.pol, sc.Engines))
	})
	var wg sync.WaitGroup
	var mu sync.Mutex
	next := 0
	workers := runtime.GOMAXPROCS(0)
	if hooks != nil && hooks.Watch != nil {
		workers = len(jobs) // watched runs are paced: all at once
	}
	for w := 0; w < min(workers, len(jobs)); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				if next == len(jobs) {
					mu.Unlock()
					return
				}
				j := jobs[next]
				next++
				if hooks != nil && hooks.Cancelled != nil && hooks.Cancelled() {
					// Stopped before it began.
					j.err = &InterruptedError{Unfinished: []Unfinished{{Policy: j.pol.Name, Total: sc.Warmup + sc.Duration}}}
					mu.Unlock()
					continue
				}
				if hooks != nil && hooks.Start != nil {
					hooks.Start(j.pol.Name)
				}
				mu.Unlock()
				var rh runHooks
				if hooks != nil {
					name := j.pol.Name
					rh.watch, rh.every = hooks.Watch, hooks.WatchEvery
					if hooks.Progress != nil || hooks.Cancelled != nil {
						rh.progress = func(elapsed, total time.Duration) bool {
							if hooks.Progress != nil {
								hooks.Progress(name, elapsed, total)
							}
							return hooks.Cancelled != nil && hooks.Cancelled()
						}
					}
					if hooks.Call != nil {
						rh.call = func(at time.Duration, call workload.Call) { hooks.Call(name, at, call) }
					}
				}
				j.res, j.err = runWith(sc, j.pol, rh)
				if hooks != nil && hooks.Done != nil && j.err == nil {
					mu.Lock()
					hooks.Done(j.pol.Name, j.res)
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	cut := &InterruptedError{}
	for _, j := range jobs {
		var ie *InterruptedError
		switch {
		case errors.As(j.err, &ie):
			cut.Unfinished = append(cut.Unfinished, ie.Unfinished...)
		case j.err != nil:
			return nil, j.err
		}
	}

	var out []Result
	for _, name := range names {
		m := members[name]
		if slices.ContainsFunc(m, func(n string) bool { return need[n].err != nil }) {
			cut.Names = append(cut.Names, name) // cut short: no result
			continue
		}
		switch {
		case name == "oracle", name == "oracle-throughput":
			runs := make([]Result, len(m)-2) // the static splits, then evolve and dynamo
			for i, n := range m[:len(m)-2] {
				runs[i] = need[n].res
			}
			evolve, dynamo := need[m[len(m)-2]].res, need[m[len(m)-1]].res
			wins := better
			if name == "oracle-throughput" {
				wins = moreThroughput
			}
			var progress func(done, total int)
			var cancelled func() bool
			if hooks != nil {
				if hooks.Start != nil {
					hooks.Start(name)
				}
				if hooks.Progress != nil {
					span := sc.Warmup + sc.Duration
					progress = func(done, total int) {
						if total > 0 { // a segment as long as the run leaves no boundary
							hooks.Progress(name, time.Duration(done)*span/time.Duration(total), span)
						}
					}
				}
				cancelled = hooks.Cancelled
			}
			res, err := oracleSearch(sc, name, runs, evolve, dynamo, wins, progress, cancelled)
			var ie *InterruptedError
			switch {
			case errors.As(err, &ie):
				cut.Unfinished = append(cut.Unfinished, ie.Unfinished...)
				cut.Names = append(cut.Names, name)
				continue
			case err != nil:
				return nil, err
			}
			if hooks != nil && hooks.Done != nil {
				hooks.Done(name, res)
			}
			out = append(out, res)
		case strings.HasSuffix(name, ":best"), strings.HasSuffix(name, ":best-throughput"):
			wins := better
			if strings.HasSuffix(name, "-throughput") {
				wins = moreThroughput
			}
			best := need[m[0]].res
			for _, n := range m[1:] {
				if r := need[n].res; wins(r, best) {
					best = r
				}
			}
			best.Policy = name
			out = append(out, best)
		default:
			out = append(out, need[name].res)
		}
	}
	if len(cut.Unfinished) > 0 {
		return out, cut
	}
	return out, nil
}

// expectedCost ranks a policy's simulation by how long it is likely to
// take on a scenario of n engines: policies with a planner (evolve's,
// Dynamo's) first, as they carry its work and the KV moves of its
// switches; then fixed splits by how near they are to Dynamo's 1:2
// recipe, where most requests are served and most KV churns (a lopsided
// split bottlenecks on one role, serves less, and costs least).
func expectedCost(pol Policy, n int) int {
	if pol.Planner || pol.DynamoPlanner || pol.SLAPlanner {
		return 2 * n
	}
	d := pol.Prefill - max(1, n/3)
	return n - max(d, -d)
}

// ErrInterrupted is what an *InterruptedError is (errors.Is).
var ErrInterrupted = errors.New("interrupted")

// InterruptedError says that Hooks.Cancelled stopped a comparison: Compare
// then returns the results of the policies whose simulations all ended,
// and this error names the rest.
type InterruptedError struct {
	Names      []string     // the policies without a result
	Unfinished []Unfinished // their simulations, and how far each got
}

// Unfinished is a simulation stopped Elapsed into its Total modelled time
// (0: before it began).
type Unfinished struct {
	Policy         string
	Elapsed, Total time.Duration
}

func (e *InterruptedError) Error() string {
	parts := make([]string, len(e.Unfinished))
	for i, u := range e.Unfinished {
		parts[i] = fmt.Sprintf("%s at %d%%", u.Policy, int(100*u.Elapsed/max(u.Total, 1)))
	}
	return fmt.Sprintf("interrupted: no result for %s (%s)", strings.Join(e.Names, ", "), strings.Join(parts, ", "))
}

func (e *InterruptedError) Is(target error) bool { return target == ErrInterrupted }

// Hooks let a caller follow a comparison: Start is called before each
// simulation (a sweep runs several), Done after it, one at a time. Watch,
// when set, gets every simulation's state every WatchEvery of modelled
// time (see RunWatched), from each simulation's goroutine; all of them
// then run at once.
type Hooks struct {
	Start      func(policy string)
	Done       func(policy string, res Result)
	Watch      func(*State)
	WatchEvery time.Duration
	// Progress, when set, hears every modelled minute of each simulation
	// how much modelled time it has done of its whole span, from that
	// simulation's goroutine (several at once).
	Progress func(policy string, elapsed, total time.Duration)
	// Cancelled, when set, is asked every modelled minute of each
	// simulation, and before each begins: true stops them, and Compare
	// returns what ended with an *InterruptedError.
	Cancelled func() bool
	// Call, when set, hears every call each simulation sends (an agent's,
	// after its output is cut to the model's context, or a trace's), with
	// the modelled time since that simulation's start, from its goroutine
	// (several at once). evolve sim --record writes them as a trace.
	Call func(policy string, at time.Duration, call workload.Call)
}

// better reports whether a beats b on the primary metric: mean end-to-end
// latency, with completed requests breaking ties (a run that served nothing
// never wins).
func better(a, b Result) bool {
	if a.Requests == 0 || b.Requests == 0 {
		return a.Requests > b.Requests
	}
	if a.MeanE2E != b.MeanE2E {
		return a.MeanE2E < b.MeanE2E
	}
	return a.Requests > b.Requests
}

// moreThroughput reports whether a beats b on output tokens a second,
// the lower mean end-to-end latency breaking ties.
func moreThroughput(a, b Result) bool {
	if a.Throughput != b.Throughput {
		return a.Throughput > b.Throughput
	}
	return better(a, b)
}
