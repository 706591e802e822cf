package workload

import (
	"fmt"
	"math/rand/v2"
	"time"
)

// Math is a Putnam-like reasoning workload (workloads.md, "math"): a
// 1,500-token prompt (1,000 tokens of instructions shared by all, a
// 500-token problem), 4 sampled branches per problem sharing the prompt,
// long reasoning answers, and 1 to 4 rounds of refine and verify per branch,
// each appending the previous answer and a 300-token critique after 0.5 s.
type Math struct {
	Instructions, Problem int
	Branches              int
	Output                LogNormal
	Rounds                [2]int
	Critique              int
	Think                 time.Duration
}

// NewMath returns the math model with the defaults of workloads.md.
func NewMath() *Math {
	return &Math{Instructions: 1000, Problem: 500, Branches: 4, Output: LogNormal{8000, 30000},
		Rounds: [2]int{1, 4}, Critique: 300, Think: 500 * time.Millisecond}
}

// Name is "math".
func (*Math) Name() string { return "math" }

// NewSession starts a problem with its sampled branches.
func (m *Math) NewSession(r *rand.Rand, agent, seq int, _ time.Duration) *Session {
	id := sessionID(agent, seq)
	var prompt []uint32
	prompt = content(prompt, "math/instructions", 0, m.Instructions)
	prompt = content(prompt, "math/problem/"+id, 0, m.Problem)
	s := &Session{ID: id, Model: "math"}
	for b := 0; b < m.Branches; b++ {
		l := &mathLane{m: m, r: r, session: id, branch: fmt.Sprintf("b%d", b), rounds: uniformInt(r, m.Rounds[0], m.Rounds[1])}
		l.ctx = append(l.ctx, prompt...)
		s.Lanes = append(s.Lanes, l)
	}
	return s
}

type mathLane struct {
	m       *Math
	r       *rand.Rand
	session string
	branch  string
	ctx     []uint32
	rounds  int
	round   int
}

func (l *mathLane) Next() (Call, bool) {
	if l.round >= l.rounds {
		return Call{}, false
	}
	think := time.Duration(0)
	if l.round > 0 {
		think = l.m.Think
		l.ctx = content(l.ctx, fmt.Sprintf("math/critique/%s/%s/%d", l.session, l.branch, l.round), 0, l.m.Critique)
	}
	l.round++
	return Call{Session: l.session, Branch: l.branch, Tokens: l.ctx[:len(l.ctx):len(l.ctx)],
		MaxTokens: l.m.Output.Int(l.r, 16), Think: think}, true
}

func (l *mathLane) Answer(out []uint32) { l.ctx = append(l.ctx, out...) }
