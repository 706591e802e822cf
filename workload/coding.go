package workload

import (
	"fmt"
	"math/rand/v2"
	"time"
)

// Coding is a Claude Code-like agent (workloads.md, "coding"): a 20K-token
// system prompt and tool definitions shared by every agent, 8K tokens of
// repository context shared by the agents on one repository (agents/4
// repositories), tens of calls per session that each append the previous
// answer and a tool result, short answers, tool time between calls,
// compaction past 160K tokens (the context becomes the shared prefix plus an
// 8K summary: the old branch dies), and in 44% of sessions 1 to 3
// sub-agents that share only the shared prefix plus a 2K task, run 5 to 20
// calls and return to the parent as a tool result.
type Coding struct {
	Repos         int
	SharedPrefix  int
	RepoContext   int
	Calls         LogNormal // LLM calls per session (main branch)
	ToolResult    LogNormal // tokens appended per call
	Output        LogNormal // answer tokens
	ToolTime      LogNormal // seconds
	CompactAt     int
	Summary       int
	SubAgentShare float64
	SubAgents     [2]int // per session that has them
	SubAgentTask  int
	SubAgentCalls [2]int

	// Label names the model ("coding" unless set), in results and in the
	// sessions it makes.
	Label string

	shared *sharedContent // the shared prefix and repositories, drawn once
}

// NewCoding returns the coding model with the defaults of workloads.md.
func NewCoding(agents int) *Coding {
	return &Coding{
		Repos: max(1, agents/4), SharedPrefix: 20000, RepoContext: 8000,
		Calls: LogNormal{35, 110}, ToolResult: LogNormal{1500, 8000}, Output: LogNormal{300, 2000},
		ToolTime: LogNormal{2, 15}, CompactAt: 160000, Summary: 8000,
		SubAgentShare: 0.44, SubAgents: [2]int{1, 3}, SubAgentTask: 2000, SubAgentCalls: [2]int{5, 20},
		shared: &sharedContent{},
	}
}

// NewClaudeCode returns the coding model shaped by the research system's
// Claude Code figures rather than by the public agent traces: 117 sessions
// an hour at 13.0 s mean latency from 126 agents make about 117 LLM calls
// a session and about 20 s of tool time between calls (3,880 s a session:
// 117 x (13 + 20) s). Main-branch calls: median 83, p95 260 (mean about
// 106, and sub-agents add about 11); tool time: median 14 s, p95 55 s
// (mean about 19.8 s). Everything else is NewCoding's.
func NewClaudeCode(agents int) *Coding {
	c := NewCoding(agents)
	c.Label = "claude-code"
	c.Calls = LogNormal{83, 260}
	c.ToolTime = LogNormal{14, 55}
	return c
}

// Name is the model's label: "coding" or "claude-code".
func (c *Coding) Name() string {
	if c.Label == "" {
		return "coding"
	}
	return c.Label
}

// NewSession starts a coding session.
func (c *Coding) NewSession(r *rand.Rand, agent, seq int, _ time.Duration) *Session {
	id := sessionID(agent, seq)
	l := &codingLane{c: c, r: r, session: id, branch: "main", callsLeft: c.Calls.Int(r, 1)}
	l.ctx = c.shared.append(l.ctx, "coding/system", 0, c.SharedPrefix)
	l.ctx = c.shared.append(l.ctx, "coding/repo", uint64(agent%c.Repos), c.RepoContext)
	l.ctx = content(l.ctx, "coding/task/"+id, 0, 300)
	if r.Float64() < c.SubAgentShare {
		n := uniformInt(r, c.SubAgents[0], c.SubAgents[1])
		for i := 0; i < n; i++ {
			l.subAt = append(l.subAt, r.IntN(max(1, l.callsLeft)))
		}
	}
	return &Session{ID: id, Model: c.Name(), Lanes: []Lane{l}}
}

type codingLane struct {
	c         *Coding
	r         *rand.Rand
	session   string
	branch    string
	parent    string
	ctx       []uint32
	callsLeft int
	calls     int
	answered  bool
	subAt     []int // main-branch call indices after which a sub-agent runs
	sub       *codingLane
	subs      int
	compacts  int
}

func (l *codingLane) Next() (Call, bool) {
	if l.sub != nil {
		if call, ok := l.sub.Next(); ok {
			return call, true
		}
		// The sub-agent is done: its result comes back as a tool result.
		l.ctx = content(l.ctx, fmt.Sprintf("coding/subresult/%s/%d", l.session, l.subs), 0, l.c.ToolResult.Int(l.r, 50))
		l.sub = nil
		l.answered = false // the sub-agent was the tool call
	}
	if l.callsLeft == 0 {
		return Call{}, false
	}
	think := time.Duration(0)
	if l.calls > 0 {
		think = l.c.ToolTime.Duration(l.r)
		if l.answered {
			l.ctx = content(l.ctx, fmt.Sprintf("coding/tool/%s/%s/%d", l.session, l.branch, l.calls), 0, l.c.ToolResult.Int(l.r, 50))
		}
	}
	rewrite := false
	if len(l.ctx) > l.c.CompactAt {
		rewrite = true
		// Compaction: the context is rewritten into a summary; the old
		// branch is dead.
		l.compacts++
		old := l.branch
		// A fresh slice: earlier calls' prompts share the old one.
		l.ctx = l.c.shared.append(nil, "coding/system", 0, l.c.SharedPrefix)
		l.ctx = content(l.ctx, fmt.Sprintf("coding/summary/%s/%d", l.session, l.compacts), 0, l.c.Summary)
		l.parent, l.branch = old, fmt.Sprintf("main.c%d", l.compacts)
	}
	l.callsLeft--
	l.calls++
	l.answered = false
	return Call{Session: l.session, Branch: l.branch, Parent: l.parent, Rewrite: rewrite, Tokens: l.ctx[:len(l.ctx):len(l.ctx)],
		MaxTokens: l.c.Output.Int(l.r, 1), Think: think}, true
}

func (l *codingLane) Answer(out []uint32) {
	if l.sub != nil {
		l.sub.Answer(out)
		return
	}
	l.ctx = append(room(l.ctx, len(out)), out...)
	l.answered = true
	for _, at := range l.subAt {
		if at == l.calls-1 && l.branch != "" {
			l.subs++
			sub := &codingLane{c: l.c, r: l.r, session: l.session, branch: fmt.Sprintf("%s.sub%d", l.branch, l.subs), parent: l.branch,
				callsLeft: uniformInt(l.r, l.c.SubAgentCalls[0], l.c.SubAgentCalls[1])}
			sub.ctx = l.c.shared.append(sub.ctx, "coding/system", 0, l.c.SharedPrefix)
			sub.ctx = content(sub.ctx, fmt.Sprintf("coding/subtask/%s/%d", l.session, l.subs), 0, l.c.SubAgentTask)
			sub.calls = 0
			l.sub = sub
			break
		}
	}
}
