package planner

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/evolvellm/evolve/roles"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// synthetic is an engine with known costs.
type synthetic struct {
	pc    PrefillCost
	dc    DecodeCost
	noise float64 // relative, uniform
}

func (s synthetic) pass(rng *rand.Rand, ps Pass) Pass {
	var t float64
	if ps.PrefillTokens > 0 {
		t = s.pc.BaseSec + s.pc.PerToken*float64(ps.PrefillTokens) + s.pc.PerTokenContext*ps.PrefillAttended + s.pc.PerBlock*float64(ps.CopyBlocks)
	} else {
		t = s.dc.BaseSec + s.dc.PerSeq*float64(ps.DecodeSeqs) + s.dc.PerContext*float64(ps.DecodeContext) + s.dc.PerBlock*float64(ps.CopyBlocks)
	}
	ps.Seconds = t * (1 + s.noise*(2*rng.Float64()-1))
	return ps
}

// randomPasses draws passes of the shapes an engine runs: prefill chunks
// of varying size over varying cached context, decode batches of varying
// size and context, some with KV copies.
func randomPass(rng *rand.Rand, prefill bool) Pass {
	if prefill {
		n := 64 + rng.IntN(8192)
		ctx := rng.IntN(100_000)
		return Pass{PrefillTokens: n, PrefillAttended: float64(n) * (float64(ctx) + float64(n)/2), CopyBlocks: rng.IntN(3) * rng.IntN(200)}
	}
	b := 1 + rng.IntN(256)
	return Pass{DecodeSeqs: b, DecodeContext: b * (1000 + rng.IntN(60_000)), CopyBlocks: rng.IntN(2) * rng.IntN(50)}
}

var gb300 = synthetic{
	pc:    PrefillCost{BaseSec: 0.012, PerToken: 55e-6, PerTokenContext: 0.9e-9, PerBlock: 20e-6},
	dc:    DecodeCost{BaseSec: 0.009, PerSeq: 40e-6, PerContext: 1.1e-9, PerBlock: 20e-6},
	noise: 0.05,
}

func within(t *testing.T, name string, got, want, tol float64) {
	t.Helper()
	if math.Abs(got-want) > tol*math.Abs(want) {
		t.Errorf("%s = %.4g, want %.4g within %.0f%%", name, got, want, tol*100)
	}
}

func TestCostModelRecoversASyntheticEngine(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	cm := NewCostModel(10*time.Minute, 50, 0.1)
	if _, ok := cm.PrefillModel(); ok {
		t.Fatal("an empty model claims to be trusted")
	}
	now := t0
	for i := 0; i < 4000; i++ {
		now = now.Add(20 * time.Millisecond)
		cm.Observe(now, gb300.pass(rng, randomPass(rng, i%3 == 0)))
	}
	pc, ok := cm.PrefillModel()
	if !ok {
		t.Fatalf("prefill model not trusted after 1333 passes: %+v", must(cm.Status()))
	}
	within(t, "prefill base", pc.BaseSec, gb300.pc.BaseSec, 0.05)
	within(t, "prefill per token", pc.PerToken, gb300.pc.PerToken, 0.05)
	within(t, "prefill per token x context", pc.PerTokenContext, gb300.pc.PerTokenContext, 0.05)
	dc, ok := cm.DecodeModel()
	if !ok {
		t.Fatal("decode model not trusted")
	}
	within(t, "decode base", dc.BaseSec, gb300.dc.BaseSec, 0.05)
	within(t, "decode per seq", dc.PerSeq, gb300.dc.PerSeq, 0.05)
	within(t, "decode per context", dc.PerContext, gb300.dc.PerContext, 0.05)

	ps, ds := cm.Status()
	if !ps.Ready || !ds.Ready || ps.Samples != 1334 || len(ds.Coefs) != 4 || ds.Coefs[1].Name != "per_seq_us" {
		t.Fatalf("status: %+v %+v", ps, ds)
	}
	within(t, "reported per_seq_us", ds.Coefs[1].Value, 40, 0.05)
	if ds.Coefs[1].StdErr <= 0 || ds.Coefs[1].StdErr > 2 {
		t.Errorf("per_seq_us stderr %.3g: want a small positive uncertainty", ds.Coefs[1].StdErr)
	}
}

func must(a, b FitStatus) string { return fmt.Sprintf("%+v %+v", a, b) }

// A new engine build changes the costs: forgetting follows it.
func TestCostModelFollowsAChange(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	cm := NewCostModel(2*time.Minute, 50, 0.1)
	now := t0
	for i := 0; i < 3000; i++ {
		now = now.Add(40 * time.Millisecond)
		cm.Observe(now, gb300.pass(rng, randomPass(rng, false)))
	}
	faster := gb300
	faster.dc.PerSeq /= 2
	for i := 0; i < 30000; i++ { // 20 minutes: ten time constants
		now = now.Add(40 * time.Millisecond)
		cm.Observe(now, faster.pass(rng, randomPass(rng, false)))
	}
	dc, _ := cm.DecodeModel()
	within(t, "decode per seq after the change", dc.PerSeq, faster.dc.PerSeq, 0.05)
}

// A model fed only one shape of pass cannot tell its coefficients apart:
// it must say so rather than claim precision, and its predictions at the
// shape it saw must still be right.
func TestCostModelSaysWhenItCannotKnow(t *testing.T) {
	cm := NewCostModel(10*time.Minute, 50, 0.1)
	now := t0
	ps, _ := cm.Status()
	if ps.Ready || ps.Note == "" {
		t.Fatalf("empty model status %+v", ps)
	}
	for i := 0; i < 20; i++ {
		now = now.Add(time.Second)
		cm.Observe(now, Pass{Seconds: 0.05, PrefillTokens: 100, PrefillAttended: 1e4})
	}
	if _, ok := cm.PrefillModel(); ok {
		t.Fatal("20 passes are below the 50 required, yet the model is trusted")
	}
	if ps, _ := cm.Status(); ps.Note != "learning: 20 of 50 recent passes" {
		t.Fatalf("note %q", ps.Note)
	}
}

// cluster drives a planner with a synthetic cluster: demand given as
// arrivals per second of a request shape, passes from the synthetic engine.
type cluster struct {
	p     *Planner
	nodes []NodeInfo
	now   time.Time
	rng   *rand.Rand
	moves []time.Time
}

func newCluster(n, prefill int, cfg Config) *cluster {
	c := &cluster{p: New(cfg), now: t0, rng: rand.New(rand.NewPCG(7, 8))}
	for i := 0; i < n; i++ {
		role := roles.Decode
		if i < prefill {
			role = roles.Prefill
		}
		c.nodes = append(c.nodes, NodeInfo{ID: fmt.Sprintf("n%02d", i), Role: role, Auto: true, Serving: true})
	}
	return c
}

func (c *cluster) split() (p, d int) {
	for _, n := range c.nodes {
		if n.Role == roles.Prefill {
			p++
		} else {
			d++
		}
	}
	return
}

// run simulates dur of demand: rate requests/s (Poisson) of prompt tokens
// computed remotely and output tokens.
func (c *cluster) run(dur time.Duration, rate float64, prompt, output int) {
	end := c.now.Add(dur)
	for c.now.Before(end) {
		c.now = c.now.Add(time.Duration(c.rng.ExpFloat64() / rate * float64(time.Second)))
		c.p.Arrive(c.now, Arrival{Tokens: prompt + 20000, ComputeTokens: prompt, Disaggregated: true})
		c.p.Finish(c.now, prompt+20000, output)
		c.p.ObservePass(c.now, gb300.pass(c.rng, randomPass(c.rng, true)))
		for i := 0; i < 3; i++ {
			c.p.ObservePass(c.now, gb300.pass(c.rng, randomPass(c.rng, false)))
		}
		if c.p.Due(c.now) {
			for _, m := range c.p.Step(c.now, c.nodes) {
				for i := range c.nodes {
					if c.nodes[i].ID == m.Node {
						if c.nodes[i].Role != m.From || !c.nodes[i].Auto {
							panic("bad move " + m.Node)
						}
						c.nodes[i].Role = m.To
					}
				}
				c.moves = append(c.moves, c.now)
			}
		}
	}
}

// Prompt-heavy work wants prefill nodes; output-heavy work wants decode
// nodes. The split follows a shift from one to the other.
func TestSplitFollowsAShift(t *testing.T) {
	// The mean-E2E objective: at the default TTFT weight, 1:8's gain on
	// this steady math demand is under the hysteresis.
	c := newCluster(9, 3, Config{TTFTWeight: 1})
	// Math-like: short prompts, long outputs.
	c.run(10*time.Minute, 4, 1000, 4000)
	p, d := c.split()
	if p > 2 {
		t.Fatalf("output-heavy work: split %d:%d, want at most 2 prefill; status %+v", p, d, c.p.Status())
	}
	// Computer-use-like: big screenshots to prefill, short actions.
	shiftAt := c.now
	c.run(10*time.Minute, 6, 12000, 60)
	p, d = c.split()
	if p < 4 {
		t.Fatalf("prompt-heavy work: split %d:%d, want at least 4 prefill; status %+v", p, d, c.p.Status())
	}
	// The split reached its final value within 3 minutes of the shift.
	last := c.moves[len(c.moves)-1]
	if last.Sub(shiftAt) > 3*time.Minute {
		t.Errorf("the last move came %s after the shift; want within 3m", last.Sub(shiftAt))
		for _, d := range c.p.log {
			t.Logf("%s %s", d.Time.Sub(shiftAt), d.Reason)
		}
	}
	// The router's price of recomputing a token, from the learned model:
	// per token plus attention over the 20000+6000 tokens each attends to.
	sec, ok := c.p.PrefillSecPerToken(c.now)
	within(t, "learned prefill seconds per token", sec, gb300.pc.PerToken+gb300.pc.PerTokenContext*26000, 0.05)
	if !ok {
		t.Fatal("learned prefill cost not trusted")
	}
	st := c.p.Status()
	if st.State != "fitted" || len(st.Decisions) == 0 || st.Decisions[len(st.Decisions)-1].Reason == "" {
		t.Errorf("status after the shift: %s (%s), decisions %v", st.State, st.Reason, st.Decisions)
	}
}

// A stationary workload with noisy arrivals does not make the planner
// flap: at most one switch per 10 minutes, after it has settled.
func TestHysteresisHoldsUnderNoise(t *testing.T) {
	c := newCluster(9, 3, Config{})
	c.run(10*time.Minute, 5, 6000, 500) // settle
	settled := len(c.moves)
	// Noise: the rate and shape jitter every 20 s by up to +-30%.
	for i := 0; i < 180; i++ {
		j := func() float64 { return 1 + 0.6*(c.rng.Float64()-0.5) }
		c.run(20*time.Second, 5*j(), int(6000*j()), int(500*j()))
	}
	if n := len(c.moves) - settled; n > 6 {
		t.Fatalf("%d moves in an hour of stationary noisy traffic; want at most 6 (one per 10 minutes)", n)
	}
}

// Pinned nodes never move and count toward their role; the minimum per
// role holds.
func TestPinsAndMinimumsAreRespected(t *testing.T) {
	c := newCluster(6, 3, Config{})
	c.nodes[0].Auto = false // a pinned prefill node
	c.nodes[1].Auto = false
	c.run(15*time.Minute, 4, 500, 4000) // output-heavy: wants few prefill
	p, _ := c.split()
	if c.nodes[0].Role != roles.Prefill || c.nodes[1].Role != roles.Prefill {
		t.Fatal("a pinned node moved")
	}
	if p != 2 {
		t.Fatalf("%d prefill nodes; want the 2 pinned ones only", p)
	}
	// Every node pinned: nothing to do, and the status says why.
	for i := range c.nodes {
		c.nodes[i].Auto = false
	}
	c.run(time.Minute, 4, 500, 4000)
	if st := c.p.Status(); st.State != "fitted" && st.State != "pinned" {
		t.Fatalf("all pinned: state %s (%s)", st.State, st.Reason)
	}
}

// Until the costs are learned the planner holds.
func TestNoMovesWhileLearning(t *testing.T) {
	p := New(Config{})
	nodes := []NodeInfo{{ID: "a", Role: roles.Prefill, Auto: true, Serving: true}, {ID: "b", Role: roles.Prefill, Auto: true, Serving: true}, {ID: "c", Role: roles.Decode, Auto: true, Serving: true}}
	now := t0
	for i := 0; i < 100; i++ {
		now = now.Add(time.Second)
		p.Arrive(now, Arrival{Tokens: 100, ComputeTokens: 100})
		p.Finish(now, 100, 5000)
		if m := p.Step(now, nodes); len(m) > 0 {
			t.Fatalf("moved %v with no cost model", m)
		}
	}
	if st := p.Status(); st.State != "learning" || st.Reason != "learning the prefill cost (0 of 50 recent passes) and the decode cost (0 of 50 recent passes); holding the split" {
		t.Fatalf("state %q (%s), want learning, saying what", st.State, st.Reason)
	}
	// Decode passes come, prefill passes seldom (output-heavy work): the
	// status names the model that holds the split, and how far it is.
	rng := rand.New(rand.NewPCG(3, 3))
	for i := 0; i < 300; i++ {
		now = now.Add(100 * time.Millisecond)
		p.ObservePass(now, gb300.pass(rng, randomPass(rng, i%20 == 0)))
		p.Arrive(now, Arrival{Tokens: 100, ComputeTokens: 100})
		p.Finish(now, 100, 5000)
		p.Step(now, nodes)
	}
	var n int
	if st := p.Status(); st.State != "learning" || !strings.HasPrefix(st.Reason, "learning the prefill cost (") ||
		!strings.HasSuffix(st.Reason, " of 50 recent passes); holding the split") {
		t.Fatalf("state %q (%s), want learning the prefill cost alone", st.State, st.Reason)
	} else if fmt.Sscanf(strings.TrimPrefix(st.Reason, "learning the prefill cost ("), "%d", &n); n < 10 || n > 15 {
		t.Fatalf("%s: the 15 prefill passes seen, aged, should count 10 to 15", st.Reason)
	}
}

// The node moved is the one with the least referenced KV, then the least
// work in flight.
func TestMovesTheNodeThatLosesLeast(t *testing.T) {
	p := New(Config{})
	nodes := []NodeInfo{
		{ID: "a", Role: roles.Decode, Auto: true, Serving: true, Running: 50, ReferencedShare: 0.1},
		{ID: "b", Role: roles.Decode, Auto: true, Serving: true, Running: 2, ReferencedShare: 0.8},
		{ID: "c", Role: roles.Decode, Auto: true, Serving: true, Running: 10, ReferencedShare: 0.1},
		{ID: "d", Role: roles.Decode, Auto: false, Serving: true},
		{ID: "e", Role: roles.Decode, Auto: true, Switching: true},
	}
	got := p.pickNodes(nodes, +1)
	if len(got) != 3 || got[0].ID != "c" || got[1].ID != "a" || got[2].ID != "b" {
		t.Fatalf("order %v", got)
	}
}

func BenchmarkStep256(b *testing.B) {
	c := newCluster(256, 80, Config{})
	c.run(5*time.Minute, 100, 4000, 800)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		c.p.nextStep = time.Time{}
		c.p.Step(c.now, c.nodes)
	}
}

// Prefill done on decode nodes, mixed into their decode passes, teaches
// the prefill model once the decode model is known.
func TestCostModelLearnsPrefillFromMixedPasses(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	cm := NewCostModel(10*time.Minute, 50, 0.1)
	now := t0
	for i := 0; i < 3000; i++ {
		now = now.Add(20 * time.Millisecond)
		d := randomPass(rng, false)
		if i%4 != 0 {
			cm.Observe(now, gb300.pass(rng, d))
			continue
		}
		// A mixed pass: decode work plus a prefill chunk; the fixed cost
		// is paid once (the larger of the two).
		p := randomPass(rng, true)
		p.CopyBlocks = 0
		dur := max(gb300.pc.BaseSec, gb300.dc.BaseSec) + gb300.pc.PerToken*float64(p.PrefillTokens) +
			gb300.pc.PerTokenContext*p.PrefillAttended + gb300.dc.PerSeq*float64(d.DecodeSeqs) +
			gb300.dc.PerContext*float64(d.DecodeContext) + gb300.dc.PerBlock*float64(d.CopyBlocks)
		cm.Observe(now, Pass{Seconds: dur, PrefillTokens: p.PrefillTokens, PrefillAttended: p.PrefillAttended,
			DecodeSeqs: d.DecodeSeqs, DecodeContext: d.DecodeContext, CopyBlocks: d.CopyBlocks})
	}
	pc, ok := cm.PrefillModel()
	if !ok {
		t.Fatalf("prefill model not trusted from mixed passes: %s", must(cm.Status()))
	}
	within(t, "prefill per token (mixed)", pc.PerToken, gb300.pc.PerToken, 0.05)
	within(t, "prefill per token x context (mixed)", pc.PerTokenContext, gb300.pc.PerTokenContext, 0.05)
}

// Agents wait for their answers: when the prefill nodes fall behind, the
// arrival rate drops to what they serve and looks light while a queue
// builds. The planner sees through it: what the prefill nodes compute per
// second and the requests queued on them count as demand, and it adds
// prefill nodes. The same arrivals with no queue and idle prefill nodes
// do not.
func TestPrefillQueueRevealsHiddenDemand(t *testing.T) {
	for _, slow := range []bool{false, true} {
		// The mean-E2E objective, for which 3 to 5 prefill nodes are
		// right (4 and 5 differ by 0.1%, under the 2% hysteresis; the
		// planner reaches 5 while the queue it revealed still drains);
		// the default TTFT weight asks for one more.
		c := newCluster(9, 2, Config{TTFTWeight: 1})
		seen := runPrefillBehind(c, slow, 10*time.Minute, nil)
		p, d := c.split()
		st := c.p.Status()
		if slow && (p < 3 || p > 5) {
			t.Fatalf("two prefill nodes busy with 40 queued each: split %d:%d, want 3 to 5 prefill nodes; demand %+v, reason %s", p, d, st.Short, st.Reason)
		}
		if !slow && p > 2 {
			t.Fatalf("light prefill demand and no queue: split %d:%d, want no more prefill nodes; demand %+v, reason %s", p, d, st.Short, st.Reason)
		}
		if slow && (seen.ServedTokPerSec < 2*seen.RequestsPerSec*promptBehind || seen.PrefillQueue < 30 || seen.HiddenTokPerSec <= 0) {
			t.Fatalf("the first move's demand does not show what was hidden: %+v", seen)
		}
	}
}

const promptBehind = 6000

// runPrefillBehind drives c for dur with 1 request/s of 6000 new tokens
// over 60K of context. With slow, two prefill nodes fall behind (busy,
// 40 requests queued on each) and three keep up. It returns the short
// demand when the planner first moved, and calls step after every
// planner step.
func runPrefillBehind(c *cluster, slow bool, dur time.Duration, step func()) Demand {
	var seen Demand
	const rate, prompt, ctx = 1.0, promptBehind, 60_000
	full := Pass{PrefillTokens: 8192, PrefillAttended: 8192 * (ctx + 4096), OnPrefillNode: true}
	own := Pass{PrefillTokens: prompt, PrefillAttended: prompt * (ctx + prompt/2), OnPrefillNode: true}
	nextArrival, nextPass := c.now, c.now
	end := c.now.Add(dur)
	for c.now.Before(end) {
		c.now = c.now.Add(50 * time.Millisecond)
		// Two prefill nodes fall behind; three keep up.
		p, _ := c.split()
		behind := slow && p == 2
		for !nextArrival.After(c.now) {
			c.p.Arrive(nextArrival, Arrival{Tokens: prompt + ctx, ComputeTokens: prompt, Disaggregated: true})
			c.p.Finish(nextArrival, prompt+ctx, 300)
			if !behind {
				c.p.ObservePass(nextArrival, gb300.pass(c.rng, own))
			}
			nextArrival = nextArrival.Add(time.Duration(c.rng.ExpFloat64() / rate * float64(time.Second)))
		}
		for !nextPass.After(c.now) { // decode passes, and behind: both prefill nodes busy
			for i := 0; i < 3; i++ {
				c.p.ObservePass(nextPass, gb300.pass(c.rng, randomPass(c.rng, false)))
			}
			c.p.ObservePass(nextPass, gb300.pass(c.rng, randomPass(c.rng, true)))
			if behind {
				ps := gb300.pass(c.rng, full)
				c.p.ObservePass(nextPass, ps)
				c.p.ObservePass(nextPass, ps)
				nextPass = nextPass.Add(time.Duration(ps.Seconds * float64(time.Second)))
			} else {
				nextPass = nextPass.Add(time.Second)
			}
		}
		for i := range c.nodes {
			c.nodes[i].Waiting = 0
			if behind && c.nodes[i].Role == roles.Prefill {
				c.nodes[i].Waiting = 40
			}
		}
		if c.p.Due(c.now) {
			moves := c.p.Step(c.now, c.nodes)
			if len(moves) > 0 && seen.RequestsPerSec == 0 {
				seen = c.p.Status().Short
			}
			for _, m := range moves {
				for i := range c.nodes {
					if c.nodes[i].ID == m.Node {
						c.nodes[i].Role = m.To
					}
				}
			}
			if step != nil {
				step()
			}
		}
	}
	return seen
}

// Once the two-node split has fallen behind and the planner has left it,
// it does not go back while the demand holds, and Step says it leaves
// that split out.
func TestPlannerDoesNotReturnToAnOverloadedSplit(t *testing.T) {
	c := newCluster(9, 2, Config{})
	left, back := false, false
	runPrefillBehind(c, true, 20*time.Minute, func() {
		p, _ := c.split()
		left = left || p > 2
		back = back || (left && p <= 2)
	})
	st := c.p.Status()
	if !left || back {
		t.Fatalf("left 2 prefill nodes: %v; went back: %v; decisions %+v", left, back, st.Decisions)
	}
	found := false
	for _, a := range st.Avoided {
		found = found || strings.HasPrefix(a, "2:7 ")
	}
	if !found {
		t.Fatalf("status lists %q as avoided, want 2:7", st.Avoided)
	}
}

// A split seen overloaded for a minute (Persistence) is left out while
// the demand on the stage that was overloaded holds (within 20%), for 30
// minutes: with it every split with fewer nodes in that stage. Not while
// a switch is in progress, nor after an overload shorter than a minute
// (a burst).
func TestOverloadedSplitIsAvoided(t *testing.T) {
	p := New(Config{})
	prefillBehind := Prediction{Saturated: true, PrefillLoad: 1.3, DecodeLoad: 0.4}
	p.noteOverload(t0, 2, 1, prefillBehind, Demand{PrefillTokPerSec: 30000})
	p.noteOverload(t0.Add(time.Minute), 2, 1, prefillBehind, Demand{PrefillTokPerSec: 30000})
	if _, ok := p.avoid(t0.Add(time.Minute), 2, Demand{PrefillTokPerSec: 30000}); ok {
		t.Fatal("recorded an overload seen while a switch was in progress")
	}
	p.noteOverload(t0, 2, 0, prefillBehind, Demand{PrefillTokPerSec: 30000})
	p.noteOverload(t0.Add(30*time.Second), 2, 0, prefillBehind, Demand{PrefillTokPerSec: 30000})
	if _, ok := p.avoid(t0.Add(30*time.Second), 2, Demand{PrefillTokPerSec: 30000}); ok {
		t.Fatal("recorded an overload of 30 s: a burst")
	}
	p.noteOverload(t0.Add(time.Minute), 2, 0, prefillBehind, Demand{PrefillTokPerSec: 30000})
	decodeBehind := Prediction{Saturated: true, PrefillLoad: 0.2, DecodeLoad: 1.1}
	p.noteOverload(t0.Add(time.Minute), 6, 0, decodeBehind, Demand{OutputTokPerSec: 9000})
	p.noteOverload(t0.Add(2*time.Minute), 6, 0, decodeBehind, Demand{OutputTokPerSec: 9000})
	same := Demand{PrefillTokPerSec: 27000, OutputTokPerSec: 8000}
	for np, want := range map[int]bool{1: true, 2: true, 3: false, 5: false, 6: true, 7: true} {
		t.Run(fmt.Sprint(np), func(t *testing.T) {
			if _, got := p.avoid(t0.Add(3*time.Minute), np, same); got != want {
				t.Errorf("split %d prefill, a minute later at the same demand: avoided %v, want %v", np, got, want)
			}
		})
	}
	if _, ok := p.avoid(t0.Add(3*time.Minute), 2, Demand{PrefillTokPerSec: 20000, OutputTokPerSec: 8000}); ok {
		t.Error("still avoided after the prefill demand fell by a third")
	}
	if _, ok := p.avoid(t0.Add(32*time.Minute), 2, same); ok {
		t.Error("still avoided after 31 minutes")
	}
}

// The default objective is the predicted mean E2E (TTFT weight 1); a
// larger weight favours TTFT: for the same demand its best split has at
// least as many prefill nodes as the mean-E2E objective's, and more where
// prompts queue.
func TestTTFTWeightFavoursPrefill(t *testing.T) {
	if w := New(Config{}).Config().TTFTWeight; w != 1 {
		t.Fatalf("default TTFT weight %v, want 1 (the mean E2E)", w)
	}
	lim := Limits{MaxBatchedTokens: 8192, MaxSeqs: 1024, GPUKVTokens: 2_000_000}
	best := func(dm Demand, w float64) Prediction {
		var b Prediction
		for np := 1; np < 9; np++ {
			if pr := predict(np, 9-np, dm, gb300.pc, gb300.dc, lim, w); np == 1 || pr.Objective < b.Objective {
				b = pr
			}
		}
		return b
	}
	more := 0
	for _, shape := range [][2]float64{{2000, 300}, {4000, 500}, {1000, 1000}, {6000, 200}} {
		for _, rate := range []float64{2, 5, 10, 20} {
			dm := Demand{RequestsPerSec: rate, DisaggShare: 1, PrefillTokens: shape[0], PrefillCV2: 1, PrefillContext: 30000,
				PrefillTokPerSec: rate * shape[0], OutputTokens: shape[1], OutputTokPerSec: rate * shape[1], DecodeContext: 36000}
			b1, b4 := best(dm, DefaultTTFTWeight), best(dm, 4)
			if b1.E2E > b4.E2E+1e-9 {
				t.Fatalf("%v tokens in, %v out, %v req/s: the default objective's split predicts %.3fs mean E2E, weight 4's %.3fs",
					shape[0], shape[1], rate, b1.E2E, b4.E2E)
			}
			if b4.Prefill < b1.Prefill {
				t.Fatalf("%v tokens in, %v out, %v req/s: weight 4 picks %d prefill nodes, the mean-E2E objective %d",
					shape[0], shape[1], rate, b4.Prefill, b1.Prefill)
			}
			if b4.Prefill > b1.Prefill {
				more++
			}
		}
	}
	if more < 4 {
		t.Fatalf("weight 4 asked for more prefill nodes than the mean-E2E objective in only %d of 16 demands", more)
	}
}

// A decode node that hands its sequences over switches within a pass or
// two and the time its KV takes to move; one that finishes them first
// runs a node short for a whole output. Moving it costs the former far
// less, on math's long outputs.
func TestHandOverMakesADecodeSwitchCheap(t *testing.T) {
	p := New(Config{})
	p.SetLimits(Limits{MaxBatchedTokens: 8192, MaxSeqs: 256, GPUKVTokens: 2_000_000}, 2e-6, 5e-6)
	dm := Demand{RequestsPerSec: 4, DisaggShare: 1, PrefillTokens: 1000, PrefillCV2: 1, PrefillContext: 1000,
		PrefillTokPerSec: 4000, OutputTokens: 4000, OutputTokPerSec: 16000, DecodeContext: 3000}
	n := NodeInfo{ID: "d", Role: roles.Decode, Auto: true, Serving: true, Running: 60, GPUBlocksUsed: 20000}
	drained := p.switchCost(dm, 3, 9, -1, gb300.pc, gb300.dc, []NodeInfo{n})
	n.CanHandOver = true
	handed := p.switchCost(dm, 3, 9, -1, gb300.pc, gb300.dc, []NodeInfo{n})
	// Both pay to reload the 20000 blocks it offloads (0.04 s); beyond
	// that, the time the cluster runs a node short.
	const reload = 20000 * 2e-6
	if handed <= reload || drained-reload < 20*(handed-reload) {
		t.Fatalf("switch cost: %.3g finishing its decodes, %.3g handing them over", drained, handed)
	}
}

// A split request's first token comes from its decode node, in the pass
// that takes its KV in: the predicted TTFT is the prefill node's wait and
// compute plus one decode pass, so slower decode passes (a larger batch on
// fewer decode nodes) show in it.
func TestRemoteTTFTIncludesTheDecodePass(t *testing.T) {
	lim := Limits{MaxBatchedTokens: 8192, MaxSeqs: 1024, GPUKVTokens: 2_000_000}
	dm := Demand{RequestsPerSec: 5, DisaggShare: 1, PrefillTokens: 2000, PrefillCV2: 1, PrefillContext: 30000,
		PrefillTokPerSec: 10000, OutputTokens: 300, OutputTokPerSec: 1500, DecodeContext: 36000, DecodeSeqs: 200}
	for _, d := range []int{2, 4, 7} {
		pr := predict(2, d, dm, gb300.pc, gb300.dc, lim, DefaultTTFTWeight)
		r := gb300.pc.PerToken + gb300.pc.PerTokenContext*dm.PrefillContext
		own := gb300.pc.BaseSec + dm.PrefillTokens*r
		if pr.Saturated || pr.ITL <= 0 {
			t.Fatalf("2:%d saturated (%+v)", d, pr)
		}
		within(t, fmt.Sprintf("2:%d TTFT", d), pr.TTFT, pr.PrefillWait+own+pr.ITL, 1e-9)
	}
}
