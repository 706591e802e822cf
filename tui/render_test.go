package tui

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// evolve planner prints the planner view as a report: at 80 columns every
// line fits and no reason is cut, wrapped onto indented lines instead.
func TestRenderPlannerWrapsRatherThanCuts(t *testing.T) {
	reason := "2:1 -> 1:2: objective 46.61s -> 23.30s (TTFT 0.01s -> 0.01s, ITL 10.9ms -> 5.5ms), gain 475s > cost 0s, held 7s"
	p := Planner{State: "fitted", Enabled: true, Reason: "1:2 is within 5% of the best split, and " + reason,
		PrefillFit: Fit{Ready: true, Samples: 239, Coefs: []Coef{{Name: "base_ms", Value: 0.203, StdErr: 0.0041},
			{Name: "per_token_us", Value: 2.07, StdErr: 0.0065}, {Name: "per_token_context_ns", Value: 0.0241, StdErr: 0.0015},
			{Name: "per_block_us", Value: 1.63, StdErr: 0.0082}}},
		Prefill: 2, Decode: 1, Recommend: 1, HeldSec: 40, ActsInSec: 20, GainSec: 310, CostSec: 12,
		Avoided:   []string{"0:3 (1:2 was overloaded at this demand, and so was every split with fewer prefill nodes)"},
		Decisions: []Decision{{Time: time.Date(2026, 11, 30, 13, 42, 49, 0, time.Local), Action: "move", Reason: reason, Moves: []Move{{Node: "engine-0", To: "decode"}}}}}
	out := RenderPlanner(p, 80)
	for _, line := range strings.Split(out, "\n") {
		if n := utf8.RuneCountInString(line); n > 80 {
			t.Fatalf("a line is %d columns:\n%s", n, out)
		}
	}
	if strings.Contains(out, "…") {
		t.Fatalf("the report cut a text:\n%s", out)
	}
	flat := strings.Join(strings.Fields(out), " ")
	for _, want := range []string{"13:42:49 move engine-0->decode: " + reason, "gain 310 vs cost 12 request-s", "fewer prefill nodes)", p.Reason} {
		if !strings.Contains(flat, want) {
			t.Errorf("the report lacks %q:\n%s", want, out)
		}
	}
	// One line per item when there is room.
	if wide := RenderPlanner(p, 1<<20); !strings.Contains(wide, "  13:42:49 move engine-0->decode: "+reason+"\n") {
		t.Fatalf("wide:\n%s", wide)
	}
	// Real time: no word of a clock; engines at 10x: the costs and
	// predictions are wall-clock, and the report says so.
	if strings.Contains(out, "wall clock") {
		t.Fatalf("real time:\n%s", out)
	}
	p.Speedup = 10
	if fast := RenderPlanner(p, 80); !strings.Contains(strings.Join(strings.Fields(fast), " "), "wall clock: engines run 10x, so modelled costs and times are 10x those below") {
		t.Fatalf("at 10x:\n%s", fast)
	}
}

// A planner that has learned nothing yet says so on one line per cost,
// without an error figure no pass gave.
func TestRenderPlannerBeforeAnyPass(t *testing.T) {
	p := Planner{State: "learning", Enabled: true, Reason: "the cost models are not trusted yet; holding the split",
		PrefillFit: Fit{Note: "learning: too few passes"}, DecodeFit: Fit{Note: "learning: too few passes"},
		Prefill: 1, Decode: 3, Recommend: -1}
	out := RenderPlanner(p, 80)
	for _, want := range []string{"prefill cost  0 passes, learning: too few passes\n", "decode cost   0 passes, learning: too few passes\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("the report lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "±") {
		t.Errorf("an error figure without passes:\n%s", out)
	}
	// Once passes come in, their error shows.
	p.PrefillFit = Fit{Samples: 12, RelErr: 0.083, Note: "learning: error above 5%", Coefs: []Coef{{Name: "base_ms", Value: 0.2}}}
	if out := RenderPlanner(p, 80); !strings.Contains(out, "12 passes, ±8.3%, learning: error above 5%") {
		t.Errorf("with passes:\n%s", out)
	}
}

func TestWhereShortNamesTheLargestHolder(t *testing.T) {
	b := Branch{Residency: []Residency{{Node: "engine-0", GPU: 437}, {Node: "engine-3", GPU: 855, Host: 44}, {Node: "engine-9", Host: 12}}}
	if got := WhereShort(b); got != "engine-3 855G/44H +2 more" {
		t.Fatalf("WhereShort = %q", got)
	}
	if got := WhereShort(Branch{Residency: b.Residency[:1]}); got != "engine-0 437G/0H" {
		t.Fatalf("one holder: %q", got)
	}
	if got := WhereShort(Branch{}); got != "-" {
		t.Fatalf("none: %q", got)
	}
	// evolve top lists every holder where they fit, else the summary
	// rather than a cut list.
	if got := fitWhere(b, 80); got != Where(b) {
		t.Fatalf("room for all: %q", got)
	}
	if got := fitWhere(b, 30); got != "engine-3 855G/44H +2 more" {
		t.Fatalf("narrow: %q", got)
	}
}
