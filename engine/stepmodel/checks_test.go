package stepmodel

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"
)

// Every built-in profile reproduces, within CheckTolerance, each public
// measurement its file lists under checks, run on the model itself
// (real passes of Step, not the cost formula alone).
func TestProfilesMatchTheirPublicPoints(t *testing.T) {
	for _, name := range ProfileNames() {
		p, err := BuiltinProfile(name)
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(name, "gb300-glm5") || name == "gb300-kimi-k2" {
			if len(p.Checks) < 3 {
				t.Errorf("%s: %d public checks, want at least 3", name, len(p.Checks))
			}
		}
		for _, c := range p.Checks {
			got := runCheck(t, p, c)
			off := got/c.Want() - 1
			line := fmt.Sprintf("%s: %s: model %s, public %s (%+.0f%%)", name, c.Source, figure(got), figure(c.Want()), 100*off)
			if math.Abs(off) > CheckTolerance {
				t.Error(line)
			} else {
				t.Log(line)
			}
		}
	}
}

// runCheck measures on the model the figure that c gives.
func runCheck(t *testing.T, p *Profile, c Check) float64 {
	t.Helper()
	switch {
	case c.StepMs > 0:
		return decodeStep(t, p, c.Batch, c.Context).Seconds() * 1e3
	case c.DecodeTokPerGPUs > 0:
		return float64(c.Batch) / decodeStep(t, p, c.Batch, c.Context).Seconds() / float64(p.GPUs)
	case c.PrefillTokPerGPUs > 0:
		// Enough prompts for several full passes; only full passes count.
		m := NewModel(p, Config{})
		n := max(4, 4*m.Config().MaxNumBatchedTokens/c.Prompt)
		for i := range n {
			submit(t, m, t0, Request{ID: fmt.Sprint(i), Tokens: prompt(c.Prompt, uint32(i+1)), MaxTokens: 1})
		}
		var tokens int
		var busy time.Duration
		for _, pass := range run(t, m, t0, 100000).passes {
			if pass.Stats.PrefillTokens == m.Config().MaxNumBatchedTokens && pass.Stats.DecodeSeqs == 0 {
				tokens += pass.Stats.PrefillTokens
				busy += pass.Duration
			}
		}
		if tokens == 0 {
			t.Fatalf("%s: no full prefill pass", c.Source)
		}
		return float64(tokens) / busy.Seconds() / float64(p.GPUs)
	case c.DurationS > 0:
		m := NewModel(p, Config{})
		for i := range c.Requests {
			submit(t, m, t0, Request{ID: fmt.Sprint(i), Tokens: prompt(c.Prompt, uint32(i+1)), MaxTokens: c.Output})
		}
		res := run(t, m, t0, 10_000_000)
		if len(res.finished) != c.Requests {
			t.Fatalf("%s: %d of %d requests finished", c.Source, len(res.finished), c.Requests)
		}
		return res.end.Sub(t0).Seconds()
	default: // ttft_s
		m := NewModel(p, Config{})
		submit(t, m, t0, Request{ID: "x", Tokens: prompt(c.Prompt, 1), MaxTokens: 1})
		f := run(t, m, t0, 100000).finished["x"]
		return ttft(f).Seconds()
	}
}

// decodeStep is the duration of a pass that decodes batch sequences of
// context tokens each and computes nothing else.
func decodeStep(t *testing.T, p *Profile, batch, context int) time.Duration {
	t.Helper()
	m := NewModel(p, Config{MaxNumSeqs: max(batch, 1)})
	for i := range batch {
		submit(t, m, t0, Request{ID: fmt.Sprint(i), Tokens: prompt(context, uint32(i+1)), MaxTokens: p.MaxModelLen - context})
	}
	now := t0
	for range 100000 {
		d, out := m.Step(now)
		if out.Idle {
			t.Fatalf("idle before a pure decode pass of %d at %d", batch, context)
		}
		now = now.Add(d)
		if out.Stats.DecodeSeqs == batch && out.Stats.PrefillTokens == 0 {
			return d
		}
	}
	t.Fatalf("no pure decode pass of %d sequences at %d", batch, context)
	return 0
}

func figure(v float64) string {
	if v >= 100 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.3g", v)
}

// A check names one figure and what the model needs to run it: a flood
// without its requests or output, or two figures at once, is refused
// with the check's source.
func TestChecksSayWhatTheyLack(t *testing.T) {
	for _, c := range []struct {
		name  string
		check Check
		want  string
	}{
		{"flood without requests", Check{Source: "f", Prompt: 2000, Output: 100, DurationS: 60}, "needs requests and output"},
		{"flood without output", Check{Source: "f", Prompt: 2000, Requests: 500, DurationS: 60}, "needs requests and output"},
		{"flood without prompt", Check{Source: "f", Requests: 500, Output: 100, DurationS: 60}, "needs prompt"},
		{"two figures", Check{Source: "f", Prompt: 2000, Requests: 500, Output: 100, DurationS: 60, TTFTSec: 1}, "exactly one"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.check.validate()
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), `"f"`) {
				t.Fatalf("got %v, want an error with %q", err, c.want)
			}
		})
	}
	ok := Check{Source: "f", Prompt: 2000, Requests: 500, Output: 100, DurationS: 60}
	if err := ok.validate(); err != nil {
		t.Fatal(err)
	}
}
