package sim

import (
	"sort"
	"time"

	"github.com/evolvellm/evolve/kv"
	"github.com/evolvellm/evolve/planner"
	"github.com/evolvellm/evolve/roles"
	"github.com/evolvellm/evolve/workload"
)

// Watching a run: with Hooks.Watch set, a simulation reports its cluster's
// state every Hooks.WatchEvery of modelled time, as the control API would
// report a live cluster, so that evolve top can follow a paper-scale run.
// Watching changes nothing the run computes: the same seed gives the same
// figures, watched or not.

// DefaultWatchEvery is how often a watched run reports, in modelled time.
const DefaultWatchEvery = time.Second

// State is a simulated cluster at one moment of modelled time. It is the
// caller's to keep; Branches may only be called during the Watch call.
type State struct {
	Policy  string
	Auto    bool          // a planner moves nodes (evolve's or Dynamo's)
	Now     time.Time     // the modelled clock
	Elapsed time.Duration // modelled time since the start
	Total   time.Duration // warm-up and scored time: the whole run
	Final   bool          // the run's last state
	Nodes   []NodeState
	Planner *planner.Status // evolve's planner; nil under other policies
	// Since the start: requests and sessions completed, prompt tokens by
	// KV source, and lost KV reuse (tokens recomputed that had been
	// computed before).
	Requests, Sessions                  int
	PromptTokens, GPUHitTokens, HostHit int64
	LostReuse                           int64
	LiveBranches                        int
	TracksBranches                      bool        // the policy tracks agent branches (evolve's KV management)
	LastMinute                          MinuteStats // the last full minute
	run                                 *run
}

// MinuteStats are the latencies of the requests of one minute.
type MinuteStats struct {
	Requests                  int
	TTFTP50, TTFTP95          float64
	E2EP50, E2EP95            float64
	OutputTokensPerSec        float64
	PrefillNodes, DecodeNodes int // serving at the minute's end
}

// NodeState is one simulated engine.
type NodeState struct {
	ID       string
	Role     string // prefill or decode
	State    string // serving, switching, starting, draining, down
	SwitchTo string // the role a switching node goes to
	Waiting  int
	Running  int
	// KV blocks: GPU blocks in use by sequences, resident (cached, in use
	// or not) and the capacity; host blocks resident and the capacity.
	GPUUsed, GPUBlocks, GPUCapacity int
	HostBlocks, HostCapacity        int
	// ReferencedShare is the share of its GPU copies live agent branches
	// reference (0 without branch tracking).
	ReferencedShare float64
	// TokensPerSec: tokens processed per modelled second since the last
	// state (prompt tokens computed and tokens generated).
	TokensPerSec float64
	// Passes: forward passes the engine has run, which the planner learns from.
	Passes  uint64
	History []roles.Change // oldest first, in modelled time
}

// maxHistory is how many role changes a node keeps.
const maxHistory = 8

// BranchState is a live or ended agent branch and where its blocks live.
type BranchState struct {
	kv.BranchInfo
	Residency []Residency
}

// Residency is how many of a branch's blocks a node holds per tier.
type Residency struct {
	Node      string
	GPU, Host int
}

// Branches lists the agent branches the run tracks (none under plain LRU
// or Dynamo's policies), sorted by session and branch, with each node's
// copies of their blocks. Only valid during the Watch call: it reads the
// run's state.
func (s *State) Branches() []BranchState {
	r := s.run
	if r == nil || r.branches == nil {
		return nil
	}
	var out []BranchState
	for _, b := range r.branches.List("") {
		st := BranchState{BranchInfo: b}
		for _, c := range r.dir.Residency(b.Chain) {
			st.Residency = append(st.Residency, Residency{Node: r.dir.NodeName(c.Node), GPU: c.GPU, Host: c.Host})
		}
		st.Chain = nil
		sort.Slice(st.Residency, func(i, j int) bool { return st.Residency[i].Node < st.Residency[j].Node })
		out = append(out, st)
	}
	return out
}

// state takes the run's state for a watcher.
func (r *run) state() *State {
	s := &State{Policy: r.pol.Name, Auto: r.pol.Planner || r.pol.DynamoPlanner || r.pol.SLAPlanner, Now: r.now, Elapsed: r.now.Sub(r.start), Total: r.sc.Warmup + r.sc.Duration, run: r}
	for _, e := range r.engines {
		n := NodeState{ID: e.id, Role: e.role.String(), State: "serving", Waiting: e.stats.Waiting, Running: e.stats.Running,
			GPUUsed: e.stats.GPUBlocksUsed, GPUBlocks: e.stats.GPUBlocksCached, GPUCapacity: e.model.Config().GPUBlocks,
			HostBlocks: e.stats.HostBlocksUsed, HostCapacity: e.model.Config().HostBlocks, ReferencedShare: r.referencedShare(e.dir),
			Passes: e.model.Counters().Passes, History: append([]roles.Change(nil), e.history...)}
		if dt := r.now.Sub(e.watchAt).Seconds(); dt > 0 && !e.watchAt.IsZero() {
			n.TokensPerSec = float64(e.tokens-e.watchTokens) / dt
		}
		e.watchTokens, e.watchAt = e.tokens, r.now
		switch {
		case e.switching:
			n.State, n.SwitchTo = "switching", e.switchTo.String()
		case e.state == engStarting:
			n.State = "starting"
		case e.state == engRemoving:
			n.State = "draining"
		case e.state == engOff:
			n.State = "down"
		}
		s.Nodes = append(s.Nodes, n)
	}
	if r.planner != nil && r.pol.Planner { // a learn-only planner (static splits) moves nothing: none shown
		st := r.planner.Status()
		st.Decisions = append([]planner.Decision(nil), st.Decisions...)
		s.Planner = &st
	}
	for _, w := range r.res.Timeline {
		s.Requests += w.Requests
		s.Sessions += w.Sessions
		s.PromptTokens += w.PromptTokens
		s.GPUHitTokens += w.GPUHit
		s.HostHit += w.HostHit
		s.LostReuse += w.LostReuse
	}
	if n := len(r.res.Timeline); n >= 2 {
		w := &r.res.Timeline[n-2]
		// Copies: Summarize sorts, and the run's figures must not depend
		// on whether it was watched.
		e2e := workload.Summarize(append([]float64(nil), w.e2e...))
		ttft := workload.Summarize(append([]float64(nil), w.ttft...))
		s.LastMinute = MinuteStats{Requests: w.Requests, TTFTP50: ttft.P50, TTFTP95: ttft.P95, E2EP50: e2e.P50, E2EP95: e2e.P95,
			OutputTokensPerSec: float64(w.OutputTokens) / 60, PrefillNodes: w.Prefill, DecodeNodes: w.Decode}
	}
	if r.branches != nil {
		s.LiveBranches, s.TracksBranches = r.branches.Live(), true
	}
	return s
}

// noteRole records a change of engine i's role or state.
func (r *run) noteRole(i int, from, to, reason string) {
	e := r.engines[i]
	e.history = append(e.history, roles.Change{Time: r.now, From: from, To: to, Reason: reason})
	if len(e.history) > maxHistory {
		e.history = append(e.history[:0], e.history[len(e.history)-maxHistory:]...)
	}
}

// watch reports the state to the watcher and schedules the next report.
func (r *run) watch() {
	s := r.state()
	next := r.now.Add(r.hooks.every)
	s.Final = next.After(r.scoreTo)
	r.hooks.watch(s)
	r.push(&event{at: next, kind: evWatch})
}
