// Package workload models agent traffic: sessions of LLM calls that wait for
// each answer, think or run a tool, and send the next call with the grown
// context; sub-agents and sampled branches; compaction and sliding history
// windows that rewrite a context. The models' parameters come from public
// statistics of agent traces (docs/measurements.md). It is
// pure (internal/purity checks it): the load generator (loadgen) and the
// simulator drive it with their clocks, and files are read by the caller.
package workload

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"time"
)

// Call is one request an agent sends.
type Call struct {
	Session string
	Branch  string
	Parent  string // the branch this one forked from or rewrote, if any
	// Rewrite: this call's branch replaces its parent (a compaction, a
	// rewritten window): the parent's context past what they share is dead.
	Rewrite bool
	// Tokens is the whole prompt. It is shared (with the lane, with
	// engines that keep it while serving): neither the lane nor a reader
	// modifies it once Next has returned it.
	Tokens    []uint32
	MaxTokens int // the answer's length (engines generate exactly this)
	Think     time.Duration
}

// Lane is one sequential stream of calls in a session: each call waits for
// the answer to the one before.
type Lane interface {
	// Next returns the next call, or false when the lane is done.
	Next() (Call, bool)
	// Answer gives the lane the answer to its last call.
	Answer(output []uint32)
}

// Session is one agent task; its lanes run concurrently and the session
// ends when all have.
type Session struct {
	ID    string
	Model string
	Lanes []Lane
}

// Model makes sessions for agent slots.
type Model interface {
	Name() string
	// NewSession starts session seq of agent slot agent, elapsed into the run.
	NewSession(r *rand.Rand, agent, seq int, elapsed time.Duration) *Session
}

// New returns a model by name: coding, claude-code, math, computer-use, a mix such as
// "mix:coding=3,math=1", or a shift such as "shift:math>computer-use:1h:1h:1h"
// (first model for 1 h, a linear change over 1 h, the second for 1 h).
// agents is the fleet size (coding shares repositories among agents/4).
func New(name string, agents int) (Model, error) {
	switch {
	case name == "coding":
		return NewCoding(agents), nil
	case name == "claude-code":
		return NewClaudeCode(agents), nil
	case name == "math":
		return NewMath(), nil
	case name == "computer-use":
		return NewComputerUse(), nil
	case name == "shift":
		return New("shift:math>computer-use:1h:1h:1h", agents)
	case strings.HasPrefix(name, "mix:"):
		return parseMix(strings.TrimPrefix(name, "mix:"), agents)
	case strings.HasPrefix(name, "shift:"):
		return parseShift(strings.TrimPrefix(name, "shift:"), agents)
	}
	return nil, fmt.Errorf("unknown workload %q (want coding, claude-code, math, computer-use, mix:A=w,B=w or shift:A>B:T1:T2:T3)", name)
}

// Names lists the plain models.
func Names() []string { return []string{"coding", "claude-code", "math", "computer-use", "shift"} }

// Mix picks a model for each new session by weight.
type Mix struct {
	name    string
	models  []Model
	weights []float64
}

func parseMix(spec string, agents int) (Model, error) {
	m := &Mix{name: "mix:" + spec}
	for _, part := range strings.Split(spec, ",") {
		k, v, ok := strings.Cut(part, "=")
		w := 1.0
		if ok {
			if _, err := fmt.Sscan(v, &w); err != nil || w <= 0 {
				return nil, fmt.Errorf("mix weight %q: want a positive number", v)
			}
		}
		sub, err := New(k, agents)
		if err != nil {
			return nil, err
		}
		m.models = append(m.models, sub)
		m.weights = append(m.weights, w)
	}
	return m, nil
}

// Name returns the mix's spec.
func (m *Mix) Name() string { return m.name }

// NewSession draws a model by weight.
func (m *Mix) NewSession(r *rand.Rand, agent, seq int, elapsed time.Duration) *Session {
	total := 0.0
	for _, w := range m.weights {
		total += w
	}
	x := r.Float64() * total
	for i, w := range m.weights {
		if x < w || i == len(m.weights)-1 {
			return m.models[i].NewSession(r, agent, seq, elapsed)
		}
		x -= w
	}
	return nil
}

// Shift moves the fleet from one model to another: the first alone for
// Hold1, then linearly over Ramp, then the second alone.
type Shift struct {
	name        string
	From, To    Model
	Hold1, Ramp time.Duration
	Hold2       time.Duration
}

func parseShift(spec string, agents int) (Model, error) {
	parts := strings.Split(spec, ":")
	if len(parts) != 4 {
		return nil, fmt.Errorf("shift %q: want A>B:T1:T2:T3", spec)
	}
	a, b, ok := strings.Cut(parts[0], ">")
	if !ok {
		return nil, fmt.Errorf("shift %q: want A>B", parts[0])
	}
	from, err := New(a, agents)
	if err != nil {
		return nil, err
	}
	to, err := New(b, agents)
	if err != nil {
		return nil, err
	}
	var d [3]time.Duration
	for i, p := range parts[1:] {
		if d[i], err = time.ParseDuration(p); err != nil || d[i] < 0 {
			return nil, fmt.Errorf("shift duration %q: %v", p, err)
		}
	}
	return &Shift{name: "shift:" + spec, From: from, To: to, Hold1: d[0], Ramp: d[1], Hold2: d[2]}, nil
}

// Name returns the shift's spec.
func (s *Shift) Name() string { return s.name }

// Fraction is the share of new sessions from the second model at elapsed.
func (s *Shift) Fraction(elapsed time.Duration) float64 {
	switch {
	case elapsed <= s.Hold1:
		return 0
	case elapsed >= s.Hold1+s.Ramp:
		return 1
	}
	return float64(elapsed-s.Hold1) / float64(s.Ramp)
}

// NewSession draws from the model the schedule gives at elapsed.
func (s *Shift) NewSession(r *rand.Rand, agent, seq int, elapsed time.Duration) *Session {
	if r.Float64() < s.Fraction(elapsed) {
		return s.To.NewSession(r, agent, seq, elapsed)
	}
	return s.From.NewSession(r, agent, seq, elapsed)
}

// Duration of a shift schedule (the run length it was written for).
func (s *Shift) Duration() time.Duration { return s.Hold1 + s.Ramp + s.Hold2 }

func sessionID(agent, seq int) string { return fmt.Sprintf("a%d-s%d", agent, seq) }
