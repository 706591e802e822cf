package workload

import (
	"fmt"
	"math/rand/v2"
	"time"
)

// ComputerUse is an OSWorld-like agent (workloads.md, "computer-use"): a
// 3,000-token system prompt shared by all agents and a 200-token task; each
// step adds a screenshot (1,500 tokens) and an accessibility summary, and
// gets a short action; only the last 3 screenshots stay in the prompt, so
// from step 4 on every prompt rewrites its middle (a new branch; the old
// tail is dead).
type ComputerUse struct {
	System, Task  int
	Steps         LogNormal
	Screenshot    int
	Accessibility LogNormal
	Output        LogNormal
	ActionTime    LogNormal
	Window        int
}

// NewComputerUse returns the computer-use model with the defaults of
// workloads.md.
func NewComputerUse() *ComputerUse {
	return &ComputerUse{System: 3000, Task: 200, Steps: LogNormal{20, 50}, Screenshot: 1500,
		Accessibility: LogNormal{1000, 4000}, Output: LogNormal{150, 400}, ActionTime: LogNormal{1.5, 5}, Window: 3}
}

// Name is "computer-use".
func (*ComputerUse) Name() string { return "computer-use" }

// NewSession starts a task.
func (c *ComputerUse) NewSession(r *rand.Rand, agent, seq int, _ time.Duration) *Session {
	id := sessionID(agent, seq)
	l := &cuLane{c: c, r: r, session: id, steps: c.Steps.Int(r, 1)}
	l.head = content(l.head, "cu/system", 0, c.System)
	l.head = content(l.head, "cu/task/"+id, 0, c.Task)
	return &Session{ID: id, Model: "computer-use", Lanes: []Lane{l}}
}

type cuStep struct {
	observation []uint32 // screenshot and accessibility summary
	action      []uint32
}

type cuLane struct {
	c       *ComputerUse
	r       *rand.Rand
	session string
	head    []uint32
	history []cuStep
	steps   int
	rewrote int
}

func (l *cuLane) Next() (Call, bool) {
	n := len(l.history)
	if n >= l.steps {
		return Call{}, false
	}
	obs := content(nil, fmt.Sprintf("cu/screen/%s/%d", l.session, n), 0, l.c.Screenshot+l.c.Accessibility.Int(l.r, 100))
	l.history = append(l.history, cuStep{observation: obs})
	// The prompt: head, every earlier action, observations of the last
	// Window steps; sized first and written once (a call owns its tokens).
	first := max(0, len(l.history)-l.c.Window)
	size := len(l.head)
	for i, s := range l.history {
		if i >= first {
			size += len(s.observation)
		}
		size += len(s.action)
	}
	p := append(make([]uint32, 0, size), l.head...)
	for i, s := range l.history {
		if i >= first {
			p = append(p, s.observation...)
		}
		p = append(p, s.action...)
	}
	branch, parent, rewrite := "main", "", false
	if first > 0 {
		rewrite = true
		// The oldest kept screenshot moved: the middle is rewritten.
		l.rewrote = first
		branch, parent = fmt.Sprintf("w%d", first), fmt.Sprintf("w%d", first-1)
		if first == 1 {
			parent = "main"
		}
	}
	think := time.Duration(0)
	if n > 0 {
		think = l.c.ActionTime.Duration(l.r)
	}
	return Call{Session: l.session, Branch: branch, Parent: parent, Rewrite: rewrite, Tokens: p, MaxTokens: l.c.Output.Int(l.r, 1), Think: think}, true
}

func (l *cuLane) Answer(out []uint32) {
	l.history[len(l.history)-1].action = append([]uint32(nil), out...)
}
