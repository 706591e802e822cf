package sim

import (
	"fmt"
	"strings"
)

// Compare runs every named policy on the scenario, side by side. A name
// ending in ":best" sweeps and reports the run with the lowest mean
// end-to-end latency, named as asked, with its split: static:best and
// dynamo-static:best over every fixed split, dynamo:best over those Dynamo
// splits and the shipped planner.
func Compare(sc Scenario, names []string, progress func(string)) ([]Result, error) {
	var out []Result
	for _, name := range names {
		if name == "oracle" {
			res, err := Oracle(sc, progress)
			if err != nil {
				return nil, err
			}
			out = append(out, res)
			continue
		}
		if base, ok := strings.CutSuffix(name, ":best"); ok {
			if base != "static" && base != "dynamo-static" && base != "dynamo" {
				return nil, fmt.Errorf("policy %q: only static:best, dynamo-static:best and dynamo:best sweep", name)
			}
			var best Result
			first := 1
			if base == "dynamo" {
				// dynamo:best: the shipped planner, and every fixed Dynamo split.
				pol, _ := ParsePolicy("dynamo", sc.Engines)
				if progress != nil {
					progress(pol.Name)
				}
				res, err := Run(sc, pol)
				if err != nil {
					return nil, err
				}
				best, first, base = res, 0, "dynamo-static"
			}
			for p := 1; p < sc.Engines; p++ {
				pol, err := ParsePolicy(fmt.Sprintf("%s:%d:%d", base, p, sc.Engines-p), sc.Engines)
				if err != nil {
					return nil, err
				}
				if progress != nil {
					progress(pol.Name)
				}
				res, err := Run(sc, pol)
				if err != nil {
					return nil, err
				}
				if (p == 1 && first == 1) || better(res, best) {
					best = res
				}
			}
			best.Policy = name
			out = append(out, best)
			continue
		}
		pol, err := ParsePolicy(name, sc.Engines)
		if err != nil {
			return nil, err
		}
		if progress != nil {
			progress(pol.Name)
		}
		res, err := Run(sc, pol)
		if err != nil {
			return nil, err
		}
		out = append(out, res)
	}
	return out, nil
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
