package workload

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"
)

func TestLogNormalQuantiles(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	d := LogNormal{300, 2000}
	xs := make([]float64, 40000)
	for i := range xs {
		xs[i] = d.Sample(r)
	}
	sort.Float64s(xs)
	med, p95 := xs[len(xs)/2], xs[len(xs)*95/100]
	if med < 280 || med > 320 || p95 < 1850 || p95 > 2150 {
		t.Fatalf("median %.0f p95 %.0f, want 300 and 2000", med, p95)
	}
}

// run drives a session's lanes one after another with fake answers and
// returns every call.
func run(s *Session, answer func(c Call) []uint32) [][]Call {
	var out [][]Call
	for _, l := range s.Lanes {
		var calls []Call
		for {
			c, ok := l.Next()
			if !ok {
				break
			}
			calls = append(calls, Call{Session: c.Session, Branch: c.Branch, Parent: c.Parent, Tokens: slices.Clone(c.Tokens), MaxTokens: c.MaxTokens, Think: c.Think})
			l.Answer(answer(c))
		}
		out = append(out, calls)
	}
	return out
}

func fakeAnswer(c Call) []uint32 {
	out := make([]uint32, min(c.MaxTokens, 64))
	for i := range out {
		out[i] = uint32(600 + i)
	}
	return out
}

func isPrefix(a, b []uint32) bool { return len(a) <= len(b) && slices.Equal(a, b[:len(a)]) }

func TestCodingSessionsGrowAndShare(t *testing.T) {
	m := NewCoding(8)
	r := rand.New(rand.NewPCG(3, 4))
	sawSub, sawCompaction := false, false
	for seq := 0; seq < 30; seq++ {
		s := m.NewSession(r, seq%8, seq, 0)
		calls := run(s, fakeAnswer)[0]
		if len(calls) == 0 {
			t.Fatal("empty session")
		}
		// Every call starts with the shared system prompt.
		sys := content(nil, "coding/system", 0, m.SharedPrefix)
		last := map[string]Call{}
		for i, c := range calls {
			if !isPrefix(sys, c.Tokens) {
				t.Fatalf("call %d lacks the shared prefix", i)
			}
			if _, seen := last[c.Branch]; seen && c.Think <= 0 {
				t.Fatalf("call %d has no tool time", i)
			}
			if prev, ok := last[c.Branch]; ok && !isPrefix(append(slices.Clone(prev.Tokens), fakeAnswer(prev)...), c.Tokens) {
				t.Fatalf("call %d on branch %s does not extend the branch's previous call and answer", i, c.Branch)
			}
			if c.Parent != "" {
				if len(c.Branch) > 4 && c.Branch[len(c.Branch)-4:len(c.Branch)-1] == "sub" {
					sawSub = true
				} else {
					sawCompaction = true
				}
			}
			last[c.Branch] = c
		}
	}
	if !sawSub {
		t.Fatal("no sub-agent in 30 sessions (44% should have them)")
	}
	_ = sawCompaction // compaction needs 160K tokens: checked below with a low threshold
	m.CompactAt = 30000
	s := m.NewSession(r, 0, 99, 0)
	var branches []string
	for _, c := range run(s, fakeAnswer)[0] {
		if !slices.Contains(branches, c.Branch) {
			branches = append(branches, c.Branch)
		}
		if len(c.Tokens) > m.CompactAt+10000 {
			t.Fatalf("context %d past compaction", len(c.Tokens))
		}
	}
	if !slices.Contains(branches, "main.c1") {
		t.Fatalf("no compaction branch: %v", branches)
	}

	// A call's prompt is never modified afterwards, compaction included:
	// engines keep it while serving, the simulator compares the next
	// prompt with it.
	s = m.NewSession(r, 0, 100, 0)
	var kept, copies [][]uint32
	for _, l := range s.Lanes {
		for {
			c, ok := l.Next()
			if !ok {
				break
			}
			kept, copies = append(kept, c.Tokens), append(copies, slices.Clone(c.Tokens))
			l.Answer(fakeAnswer(c))
		}
	}
	for i := range kept {
		if !slices.Equal(kept[i], copies[i]) {
			t.Fatalf("call %d's prompt changed after it was returned", i)
		}
	}
}

func TestCodingAgentsShareRepositories(t *testing.T) {
	m := NewCoding(8) // 2 repositories
	r := rand.New(rand.NewPCG(5, 6))
	first := func(agent int) []uint32 {
		c, _ := m.NewSession(r, agent, agent, 0).Lanes[0].Next()
		return c.Tokens[:m.SharedPrefix+m.RepoContext]
	}
	if !slices.Equal(first(0), first(2)) || slices.Equal(first(0), first(1)) {
		t.Fatal("agents 0 and 2 should share a repository, 0 and 1 not")
	}
}

func TestMathBranchesShareThePrompt(t *testing.T) {
	m := NewMath()
	s := m.NewSession(rand.New(rand.NewPCG(7, 8)), 0, 0, 0)
	if len(s.Lanes) != 4 {
		t.Fatalf("%d branches", len(s.Lanes))
	}
	lanes := run(s, fakeAnswer)
	p := lanes[0][0].Tokens
	if len(p) != 1500 {
		t.Fatalf("prompt of %d tokens", len(p))
	}
	for _, calls := range lanes {
		if !slices.Equal(calls[0].Tokens, p) || len(calls) < 1 || len(calls) > 4 {
			t.Fatal("branches do not share the prompt, or wrong round count")
		}
		for i := 1; i < len(calls); i++ {
			prev := append(slices.Clone(calls[i-1].Tokens), fakeAnswer(calls[i-1])...)
			if !isPrefix(prev, calls[i].Tokens) || len(calls[i].Tokens) != len(prev)+300 || calls[i].Think != 500*time.Millisecond {
				t.Fatal("a refine round does not append the answer and a 300-token critique")
			}
		}
	}
}

func TestComputerUseWindowRewrites(t *testing.T) {
	m := NewComputerUse()
	m.Steps = LogNormal{10, 10}
	calls := run(m.NewSession(rand.New(rand.NewPCG(9, 10)), 0, 0, 0), fakeAnswer)[0]
	if len(calls) != 10 {
		t.Fatalf("%d steps", len(calls))
	}
	for i := 1; i < 3; i++ {
		if !isPrefix(calls[i-1].Tokens, calls[i].Tokens) || calls[i].Branch != "main" {
			t.Fatalf("step %d should extend step %d", i, i-1)
		}
	}
	// From step 4 (index 3) the oldest screenshot leaves: a rewrite.
	if isPrefix(calls[2].Tokens, calls[3].Tokens) || calls[3].Branch == calls[2].Branch || calls[3].Parent != calls[2].Branch {
		t.Fatalf("step 4 does not rewrite: branch %s parent %s", calls[3].Branch, calls[3].Parent)
	}
	if !isPrefix(calls[2].Tokens[:3200], calls[3].Tokens) {
		t.Fatal("the shared head did not survive the rewrite")
	}
}

func TestMixAndShift(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	mix, err := New("mix:coding=3,math=1", 8)
	if err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	for i := 0; i < 2000; i++ {
		count[mix.NewSession(r, i%8, i, 0).Model]++
	}
	if count["coding"] < 1350 || count["coding"] > 1650 || count["math"] == 0 {
		t.Fatalf("mix 3:1 gave %v", count)
	}
	sh, err := New("shift:math>computer-use:1h:1h:1h", 8)
	if err != nil {
		t.Fatal(err)
	}
	s := sh.(*Shift)
	for i, tc := range []struct {
		at   time.Duration
		want float64
	}{{0, 0}, {time.Hour, 0}, {90 * time.Minute, 0.5}, {2 * time.Hour, 1}, {3 * time.Hour, 1}} {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			if got := s.Fraction(tc.at); got != tc.want {
				t.Fatalf("fraction at %v = %v, want %v", tc.at, got, tc.want)
			}
		})
	}
	for _, bad := range []string{"poetry", "mix:coding=-1", "shift:math>x:1h:1h:1h", "shift:math:1h"} {
		if _, err := New(bad, 8); err == nil {
			t.Fatalf("%q accepted", bad)
		}
	}
}

func TestSessionsAreDeterministic(t *testing.T) {
	gen := func() [][]Call {
		m, _ := New("mix:coding=1,math=1,computer-use=1", 8)
		r := rand.New(rand.NewPCG(13, 14))
		var all [][]Call
		for i := 0; i < 6; i++ {
			all = append(all, run(m.NewSession(r, i, i, 0), fakeAnswer)...)
		}
		return all
	}
	a, b := gen(), gen()
	if len(a) != len(b) {
		t.Fatal("different lane counts")
	}
	for i := range a {
		for j := range a[i] {
			if !slices.Equal(a[i][j].Tokens, b[i][j].Tokens) || a[i][j].MaxTokens != b[i][j].MaxTokens {
				t.Fatal("same seed, different calls")
			}
		}
	}
}

// The load generator's agents share one model: sessions started at once
// draw the shared prefix and repositories once and each get their own copy.
func TestCodingSessionsStartConcurrently(t *testing.T) {
	m := NewCoding(8)
	want := func(agent int) []uint32 {
		return content(content(nil, "coding/system", 0, m.SharedPrefix), "coding/repo", uint64(agent%m.Repos), m.RepoContext)
	}
	var wg sync.WaitGroup
	errs := make(chan string, 16)
	for agent := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := m.NewSession(rand.New(rand.NewPCG(uint64(agent), 1)), agent, agent, 0).Lanes[0]
			c, _ := l.Next()
			l.Answer(fakeAnswer(c)) // appends to the lane's own context
			if !isPrefix(want(agent), c.Tokens) {
				errs <- fmt.Sprintf("agent %d's first call lacks its shared prefix and repository", agent)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

// The claude-code model matches the research system's figures: about 117
// LLM calls a session, sub-agents included, and about 20 s of tool time
// between calls; the coding model keeps the public traces' 56 and 4 s.
func TestClaudeCodeSessionsAreLongAndSlow(t *testing.T) {
	for _, tc := range []struct {
		m                  Model
		name               string
		calls, think       float64 // means
		callsTol, thinkTol float64
	}{
		{NewClaudeCode(8), "claude-code", 117, 20, 12, 2.5},
		{NewCoding(8), "coding", 56, 4.2, 8, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, _ := New(tc.name, 8)
			if m.Name() != tc.name || tc.m.Name() != tc.name {
				t.Fatalf("New(%q) is %q", tc.name, m.Name())
			}
			r := rand.New(rand.NewPCG(5, 6))
			calls, thinks, think := 0, 0, 0.0
			const sessions = 200
			for seq := range sessions {
				s := m.NewSession(r, seq%8, seq, 0)
				if s.Model != tc.name {
					t.Fatalf("session of %s says %q", tc.name, s.Model)
				}
				for _, c := range run(s, fakeAnswer)[0] {
					calls++
					if c.Think > 0 {
						thinks++
						think += c.Think.Seconds()
					}
				}
			}
			gotCalls, gotThink := float64(calls)/sessions, think/float64(thinks)
			t.Logf("%s: %.1f calls a session, %.1f s of tool time a call", tc.name, gotCalls, gotThink)
			if gotCalls < tc.calls-tc.callsTol || gotCalls > tc.calls+tc.callsTol || gotThink < tc.think-tc.thinkTol || gotThink > tc.think+tc.thinkTol {
				t.Errorf("%s: %.1f calls a session and %.1f s of tool time, want about %.0f and %.1f", tc.name, gotCalls, gotThink, tc.calls, tc.think)
			}
		})
	}
}
