// Package sim is the discrete-event simulator: a virtual clock drives the
// same code the live system runs (engine/stepmodel step models, the routing
// policies, the KV directory, the agent workloads), so that hours of a
// paper-scale cluster run in seconds and every policy sees the same agents.
// It is pure: no wall clock, no I/O; the same seed gives the same result.
package sim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"time"

	"github.com/evolvellm/evolve/engine/stepmodel"
	"github.com/evolvellm/evolve/kv"
	"github.com/evolvellm/evolve/orchestrator/routing"
	"github.com/evolvellm/evolve/planner"
	"github.com/evolvellm/evolve/roles"
	"github.com/evolvellm/evolve/workload"
)

// event kinds.
const (
	evStep     = iota // an engine runs a pass
	evArrive          // an agent sends a call
	evDecode          // a prefill leg is done: its decode leg starts
	evSession         // an agent slot starts its next session
	evPlan            // the Dynamo planner's 5-second tick
	evReady           // an added worker finished its cold start
	evRemove          // a removed worker's grace period ended
	evMinute          // a timeline window ends
	evPlanStep        // evolve's planner steps
	evSwitch          // a switching node is checked
	evSLA             // Dynamo's SLA planner's 180-second tick
	evWatch           // a watcher gets the cluster's state
	evSchedule        // a scheduled split (Policy.Schedule) begins
	evReplay          // a replayed switch (Policy.Replay) begins
)

type event struct {
	at         time.Time
	seq        uint64
	kind       int
	eng        int
	req        *request
	attempt    int // evDecode: the routing attempt it belongs to
	agent, num int // evSession
}

// eventQueue is a binary min-heap of events by time, then by the order
// they were pushed. Each item carries its key, so that sifting compares
// integers in the heap's own array rather than following every event's
// pointer to its time.
type eventQueue []queued

type queued struct {
	at  int64 // the event's time, Unix nanoseconds
	seq uint64
	ev  *event
}

func (a queued) before(b queued) bool { return a.at < b.at || a.at == b.at && a.seq < b.seq }

func (q *eventQueue) push(e *event) {
	x := queued{at: e.at.UnixNano(), seq: e.seq, ev: e}
	h := append(*q, x)
	i := len(h) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !x.before(h[p]) {
			break
		}
		h[i] = h[p]
		i = p
	}
	h[i] = x
	*q = h
}

func (q *eventQueue) pop() *event {
	h := *q
	top := h[0].ev
	n := len(h) - 1
	x := h[n]
	h[n] = queued{}
	h = h[:n]
	if n > 0 {
		i := 0
		for {
			c := 2*i + 1
			if c >= n {
				break
			}
			if c+1 < n && h[c+1].before(h[c]) {
				c++
			}
			if !h[c].before(x) {
				break
			}
			h[i] = h[c]
			i = c
		}
		h[i] = x
	}
	*q = h
	return top
}

type engine struct {
	id        string
	dir       kv.NodeID
	model     *stepmodel.Model
	role      roles.Role
	scheduled bool // a step event is queued
	stats     stepmodel.PassStats
	state     int // engActive, engStarting, engRemoving, engOff
	// A role switch by evolve's planner: the role it goes to, and the
	// decode legs routed to it that have not reached it yet.
	switching      bool
	switchTo       roles.Role
	pendingDecodes int
	switchWhy      string
	history        []roles.Change // for watchers
	tokens         uint64         // processed (prompt tokens computed, tokens generated)
	// Where the last watcher's look left tokens, for its tokens per second.
	watchTokens uint64
	watchAt     time.Time
}

// Engine states under a planner that adds and removes workers.
const (
	engActive = iota
	engStarting
	engRemoving
	engOff
)

// request is one call in flight.
type request struct {
	id        string
	call      workload.Call
	chain     []kv.BlockHash
	lane      *laneState
	arrival   time.Time
	dec       routing.Decision
	prefillAt int // engine indexes
	decodeAt  int
	scored    bool
	seed      uint64
	prefill   stepmodel.Usage // the prefill leg's, when disaggregated
	// Leg progress, for aborts when a worker is removed.
	prefillDone, decodeStarted bool
	retry                      bool
	attempt                    int // bumped on every routing; stale events are ignored
	pendingAt                  int // 1 + the engine whose pendingDecodes counts this request; 0: none
	carry                      *carried
	migrations                 int
	branch                     string         // as the branch tracker named it
	reuse                      kv.PlacedReuse // what its first placement knew, for its lost KV reuse
}

type laneState struct {
	lane    workload.Lane
	session *sessionState
	// The lane's last two prompts and their block chains, newest first: the
	// next prompt mostly extends one of them (a coding lane alternates
	// between its main branch and a sub-agent's), so only its new blocks
	// need hashing.
	recent [2]promptChain
}

type promptChain struct {
	tokens []uint32
	chain  []kv.BlockHash
}

// chain returns the block hashes of tokens, reusing the chain of the
// lane's recent prompt that shares the longest prefix with it.
func (ls *laneState) chain(tokens []uint32, bs int) []kv.BlockHash {
	best, n := 0, -1
	for i, pc := range ls.recent {
		if k := len(pc.tokens); k > 0 && len(tokens) >= k && &tokens[0] == &pc.tokens[0] {
			// The same array: a lane never modifies a prompt it returned
			// (workload.Call.Tokens), so that prompt is this one's prefix.
			best, n = i, k
			break
		}
	}
	if n < 0 {
		for i, pc := range ls.recent {
			k := 0
			for k < len(tokens) && k < len(pc.tokens) && tokens[k] == pc.tokens[k] {
				k++
			}
			if k > n {
				best, n = i, k
			}
		}
	}
	prev := ls.recent[best]
	reuse := min(n/bs, len(prev.chain))
	c := kv.ExtendChain(append(make([]kv.BlockHash, 0, len(tokens)/bs), prev.chain[:reuse]...), tokens, bs)
	ls.recent = [2]promptChain{{tokens, c}, ls.recent[1-best]}
	return c
}

type sessionState struct {
	id         string // the workload's session id
	agent, seq int
	lanes      int // still running
	scored     bool
	started    time.Time
	calls      int
}

type run struct {
	// routerQueue holds, in arrival order, requests a queueing policy
	// (Dynamo's router) keeps back while every engine is busy.
	routerQueue []*request

	sc      Scenario
	pol     Policy
	now     time.Time
	start   time.Time
	q       eventQueue
	seq     uint64
	engines []*engine
	byID    map[string]int
	dir     *kv.Directory
	router  routing.Policy
	view    routing.View
	model   workload.Model
	rng     *rand.Rand
	reqs    map[string]*request
	nextReq int
	ever    *kv.Set // blocks ever computed anywhere
	planner *planner.Planner
	sla     slaWindow
	slaWant [2]int // SLA planner's prefill and decode targets
	// Agent-aware KV: the branch tracker (nil under plain LRU) and
	// scratch for hints per engine.
	branches *kv.Branches
	hintBuf  [][]stepmodel.Hint
	holders  []kv.Replica
	// planNodes is reused by every planner step.
	planNodes []planner.NodeInfo

	// What the run tells outside (watch.go for the watcher).
	hooks runHooks

	e2e, ttft []float64
	// open holds the scored requests not yet finished, by id, with their
	// arrival: at the end each counts its age in the E2E figures.
	open      map[string]time.Time
	res       Result
	scoreFrom time.Time
	scoreTo   time.Time
}

// epoch is the virtual clock's origin.
var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Run simulates one fixed-split policy on a scenario.
func Run(sc Scenario, pol Policy) (Result, error) { return RunWatched(sc, pol, nil, 0) }

// RunWatched is Run with a watcher: watch, when not nil, gets the cluster's
// state every `every` of modelled time (DefaultWatchEvery when 0), in the
// simulation's goroutine; it may block to pace the run. The result is the
// same as Run's.
func RunWatched(sc Scenario, pol Policy, watch func(*State), every time.Duration) (Result, error) {
	return runWith(sc, pol, runHooks{watch: watch, every: every})
}

// runHooks are what a run tells outside, in the simulation's goroutine.
// They change nothing the run computes, unless progress answers true: the
// run then stops there and returns an *InterruptedError.
type runHooks struct {
	watch func(*State) // see RunWatched
	every time.Duration
	// progress gets the modelled time done and the run's whole span at
	// every modelled minute.
	progress func(elapsed, total time.Duration) (stop bool)
	// call gets every call as it arrives (an agent's, or a trace's), with
	// the modelled time since the run's start.
	call func(at time.Duration, call workload.Call)
	// inspect gets the run itself before each event (tests).
	inspect func(r *run)
}

// runWith is RunWatched with the other hooks.
func runWith(sc Scenario, pol Policy, hooks runHooks) (Result, error) {
	if sc.Engines < 2 || (sc.Agents < 1 && len(sc.Trace) == 0) || sc.Duration <= 0 || sc.Profile == nil {
		return Result{}, fmt.Errorf("a scenario needs a profile, at least 2 engines, agents or a trace, and a duration")
	}
	if sc.Workload == "" {
		sc.Workload = "coding"
	}
	var probed time.Duration // modelled time spent measuring before the run (dynamo-static)
	if pol.ProfiledSplit {
		var p int
		var err error
		p, probed, err = dynamoStaticSplit(sc, pol.Name, hooks)
		if err != nil {
			return Result{}, err
		}
		pol.Prefill, pol.ProfiledSplit = p, false
		if progress := hooks.progress; progress != nil {
			// Progress counts the measurement and the run as one span.
			hooks.progress = func(elapsed, total time.Duration) bool { return progress(probed+elapsed, probed+total) }
		}
	}
	if pol.Prefill < 1 || pol.Prefill >= sc.Engines {
		return Result{}, fmt.Errorf("policy %s: %d prefill engines of %d", pol.Name, pol.Prefill, sc.Engines)
	}
	m, err := workload.New(sc.Workload, sc.Agents)
	if err != nil {
		return Result{}, err
	}
	var router routing.Policy
	switch pol.Router {
	case "dynamo":
		router = routing.NewDynamoSeeded(sc.Seed + 1)
	default:
		if router, err = routing.New(pol.Router); err != nil {
			return Result{}, err
		}
	}
	r := &run{sc: sc, pol: pol, now: epoch, start: epoch, dir: kv.NewDirectory(), router: router, model: m,
		rng: rand.New(rand.NewPCG(sc.Seed, 0x5eed)), reqs: map[string]*request{}, byID: map[string]int{}, open: map[string]time.Time{},
		ever: &kv.Set{}, scoreFrom: epoch.Add(sc.Warmup), scoreTo: epoch.Add(sc.Warmup + sc.Duration)}
	p := sc.Profile
	blockBytes := float64(p.BlockSize * p.KVBytesPerToken)
	for i := 0; i < sc.Engines; i++ {
		id := fmt.Sprintf("e%d", i)
		dir, _ := r.dir.Node(id)
		role := roles.Decode
		if i < pol.Prefill {
			role = roles.Prefill
		}
		model := stepmodel.NewModel(p, pol.engineConfig())
		r.engines = append(r.engines, &engine{id: id, dir: dir, model: model, role: role})
		r.byID[id] = i
		r.view.Nodes = append(r.view.Nodes, routing.Node{ID: id, Dir: dir, Role: role, Serving: true,
			MaxSeqs: model.Config().MaxNumSeqs, MaxBatchedTokens: model.Config().MaxNumBatchedTokens, GPUBlocks: model.Config().GPUBlocks,
			PrefillSecPerToken: p.PrefillTokenSec(1),
			HostSecPerBlock:    blockBytes / (p.HostGBps * 1e9), NetSecPerBlock: blockBytes / (p.NetworkGBps * 1e9)})
	}
	r.view.BlockSize = p.BlockSize
	switch sc.Eviction {
	case "", "ref":
		if pol.Router != "dynamo" {
			r.branches = kv.NewBranches(BranchTTL)
			r.hintBuf = make([][]stepmodel.Hint, len(r.engines))
			r.dir.SetReferencedSource(func(h kv.BlockHash) bool { return r.branches.Refs(h) > 0 })
		}
	case "lru":
	default:
		return Result{}, fmt.Errorf("eviction %q: want ref or lru", sc.Eviction)
	}
	r.res = Result{Policy: pol.Name, Split: fmt.Sprintf("%d:%d", pol.Prefill, sc.Engines-pol.Prefill), Initial: pol.Prefill}
	if len(sc.Trace) > 0 {
		scale := sc.TimeScale
		if scale <= 0 {
			scale = 1
		}
		for i := range sc.Trace {
			rec := &sc.Trace[i]
			out := rec.OutputLength
			if rec.InputLength >= p.MaxModelLen {
				continue
			}
			out = min(out, p.MaxModelLen-rec.InputLength)
			r.nextReq++
			req := &request{id: fmt.Sprintf("r%d", r.nextReq), seed: uint64(r.nextReq)*0x9e3779b97f4a7c15 | 1,
				lane: &laneState{}, call: workload.Call{Session: rec.Session, Branch: rec.Branch, Parent: rec.Parent, Rewrite: rec.Rewrite, Tokens: rec.Tokens(), MaxTokens: out}}
			at := epoch.Add(workload.TraceDuration(rec.Timestamp * scale))
			r.push(&event{at: at, kind: evArrive, req: req})
		}
	} else {
		for a := 0; a < sc.Agents; a++ {
			r.push(&event{at: r.now, kind: evSession, agent: a})
		}
	}
	if pol.DynamoPlanner {
		r.push(&event{at: r.now.Add(dynamoPlanInterval), kind: evPlan})
	}
	if pol.SLAPlanner {
		r.push(&event{at: r.now.Add(slaInterval), kind: evSLA})
	}
	for k, ch := range pol.Schedule {
		r.push(&event{at: r.start.Add(ch.At), kind: evSchedule, num: k})
	}
	for k, m := range pol.Replay {
		r.push(&event{at: r.start.Add(m.At), kind: evReplay, num: k})
	}
	if pol.Planner || pol.Learn {
		r.planner = newPlanner(sc, r.engines[0].model)
		r.push(&event{at: r.now.Add(r.planner.Config().Interval), kind: evPlanStep})
	}
	r.res.Timeline = []Window{{}}
	r.push(&event{at: r.now.Add(time.Minute), kind: evMinute})
	r.hooks = hooks
	if hooks.watch != nil {
		if hooks.every <= 0 {
			r.hooks.every = DefaultWatchEvery
		}
		r.push(&event{at: r.now, kind: evWatch})
	}
	end := r.scoreTo
	simulated := r.now // the last event's time, watchers' aside
	for len(r.q) > 0 {
		ev := r.q.pop()
		if ev.at.After(end) {
			break
		}
		r.now = ev.at
		if ev.kind != evWatch {
			simulated = r.now
		}
		if r.hooks.inspect != nil {
			r.hooks.inspect(r)
		}
		switch ev.kind {
		case evStep:
			r.step(ev.eng)
		case evArrive:
			r.arrive(ev.req)
		case evDecode:
			if ev.attempt == ev.req.attempt {
				r.startDecode(ev.req)
			}
		case evSession:
			r.startSession(ev.agent, ev.num)
		case evPlan:
			r.plan()
		case evReady:
			r.ready(ev.eng)
		case evRemove:
			r.remove(ev.eng)
		case evMinute:
			r.closeWindow()
			if r.hooks.progress != nil && r.hooks.progress(r.now.Sub(r.start), r.scoreTo.Sub(r.start)) {
				return Result{}, &InterruptedError{Unfinished: []Unfinished{{Policy: pol.Name, Elapsed: probed + r.now.Sub(r.start), Total: probed + r.scoreTo.Sub(r.start)}}}
			}

		case evPlanStep:
			r.planStep()
		case evSwitch:
			r.switchStep(ev.eng)
		case evSLA:
			r.slaPlan()
		case evWatch:
			r.watch()
		case evSchedule:
			r.applySchedule(pol.Schedule[ev.num])
		case evReplay:
			r.replay(pol.Replay[ev.num])
		}
	}
	r.now = simulated
	return r.finish(), nil
}

func (r *run) push(e *event) {
	r.seq++
	e.seq = r.seq
	r.q.push(e)
}

func (r *run) startSession(agent, seq int) {
	s := r.model.NewSession(r.rng, agent, seq, r.now.Sub(r.start))
	ss := &sessionState{agent: agent, seq: seq, lanes: len(s.Lanes), scored: !r.now.Before(r.scoreFrom), started: r.now}
	for _, l := range s.Lanes {
		r.nextCall(&laneState{lane: l, session: ss})
	}
}

// nextCall asks a lane for its next call and schedules it.
func (r *run) nextCall(ls *laneState) {
	if ls.lane == nil {
		return // a trace request: nothing follows it
	}
	call, ok := ls.lane.Next()
	if ok && len(call.Tokens)+call.MaxTokens > r.sc.Profile.MaxModelLen {
		// Past the model's context: the agent's session ends here.
		if len(call.Tokens) >= r.sc.Profile.MaxModelLen {
			ok = false
		} else {
			call.MaxTokens = r.sc.Profile.MaxModelLen - len(call.Tokens)
		}
	}
	if !ok {
		ss := ls.session
		ss.lanes--
		if ss.lanes == 0 {
			r.sessionEnd(ss.id)
			if ss.calls > 0 {
				r.window().Sessions++
				if !r.now.Before(r.scoreFrom) && !r.now.After(r.scoreTo) {
					r.res.Sessions++
				}
			}
			// The agent starts its next task at once (closed loop); a session
			// that could not send anything waits a second before the next.
			at := r.now
			if ss.calls == 0 {
				at = at.Add(time.Second)
			}
			r.push(&event{at: at, kind: evSession, agent: ss.agent, num: ss.seq + 1})
		}
		return
	}
	ls.session.calls++
	ls.session.id = call.Session
	r.nextReq++
	req := &request{id: fmt.Sprintf("r%d", r.nextReq), call: call, lane: ls, seed: uint64(r.nextReq)*0x9e3779b97f4a7c15 | 1}
	r.push(&event{at: r.now.Add(call.Think), kind: evArrive, req: req})
}

// arrive routes a call and submits its first leg, or queues it at the
// router while a queueing policy (Dynamo's) finds every engine busy.
func (r *run) arrive(req *request) {
	if !req.retry {
		req.arrival = r.now
		req.scored = !r.now.Before(r.scoreFrom)
		if req.scored {
			r.open[req.id] = req.arrival
		}
		req.chain = req.lane.chain(req.call.Tokens, r.sc.Profile.BlockSize)
		if r.hooks.call != nil {
			r.hooks.call(r.now.Sub(r.start), req.call)
		}
		r.branchBegin(req)
		if r.pol.SLAPlanner {
			r.slaObserve(len(req.call.Tokens), req.call.MaxTokens)
		}
	}
	r.refreshView()
	if q, ok := r.router.(routing.Queuer); ok && (len(r.routerQueue) > 0 || q.Busy(&r.view)) {
		// Behind those already waiting, first come first served.
		r.routerQueue = append(r.routerQueue, req)
		r.res.RouterQueued++
		return
	}
	r.route(req)
}

// route places a request on the router's current view (refreshView) and
// submits its first leg.
func (r *run) route(req *request) {
	req.prefillDone, req.decodeStarted = false, false
	req.attempt++
	var m kv.Match
	r.dir.Match(req.chain, &m)
	rr := &routing.Request{ID: req.id, Tokens: len(req.call.Tokens), Chain: req.chain, Match: &m, MaxTokens: req.call.MaxTokens}
	dec, err := r.router.Route(r.now, rr, &r.view)
	if err != nil {
		// No worker serves (a planner removed the last one): try again soon.
		req.retry = true
		r.push(&event{at: r.now.Add(time.Second), kind: evArrive, req: req})
		return
	}
	req.dec = dec
	req.prefillAt, req.decodeAt = r.byID[dec.Prefill], r.byID[dec.Decode]
	r.reqs[req.id] = req
	r.unpend(req) // a retried request's earlier claim
	if dec.Disaggregated {
		req.pendingAt = req.decodeAt + 1
		r.engines[req.decodeAt].pendingDecodes++
	}
	if r.planner != nil && !req.retry {
		r.planner.Arrive(r.now, planner.Arrival{Tokens: len(req.call.Tokens), ComputeTokens: dec.ComputeTokens, Disaggregated: dec.Disaggregated})
	}
	r.notePlacement(req, &m, !req.retry)
	for _, f := range dec.Fetches {
		to := r.engines[r.byID[f.To]]
		to.model.Fetch(r.now, req.chain[:f.End], f.From, 0)
		r.kick(r.byID[f.To])
	}
	sr := stepmodel.Request{ID: req.id, Tokens: req.call.Tokens, Chain: req.chain, MaxTokens: req.call.MaxTokens, Seed: req.seed}
	if dec.Disaggregated {
		sr.MaxTokens, sr.RemoteDecode = 1, true
	}
	r.submit(req, req.prefillAt, sr)
}

// refreshView copies the engines' load and state into the router's view.
func (r *run) refreshView() {
	for i, e := range r.engines {
		v := &r.view.Nodes[i]
		v.Running, v.Waiting = e.stats.Running, e.stats.Waiting
		v.GPUBlocksUse = e.stats.GPUBlocksUsed
		v.Serving = e.state == engActive && !e.switching
		v.Role = e.role
	}
}

// drainRouterQueue routes the requests waiting in the router's queue, in
// order, while the policy no longer finds every engine busy; called when
// load leaves an engine.
func (r *run) drainRouterQueue() {
	q, ok := r.router.(routing.Queuer)
	if !ok {
		return
	}
	for len(r.routerQueue) > 0 {
		r.refreshView()
		if q.Busy(&r.view) {
			return
		}
		req := r.routerQueue[0]
		r.routerQueue[0] = nil
		r.routerQueue = r.routerQueue[1:]
		r.route(req)
	}
}

// submit gives a leg to engine i; if the engine refuses it, the request is
// dropped and its agent moves on.
func (r *run) submit(req *request, i int, sr stepmodel.Request) {
	if i == req.decodeAt {
		r.unpend(req)
	}
	if err := r.engines[i].model.Submit(r.now, sr); err != nil {
		r.unpend(req)
		r.router.Finished(r.now, req.id)
		delete(r.reqs, req.id)
		delete(r.open, req.id) // refused: it will not finish, nor wait
		r.nextCall(req.lane)
		r.drainRouterQueue()
		return
	}
	r.kick(i)
}

// unpend ends a decode leg's claim on its node, which a switch waits for.
func (r *run) unpend(req *request) {
	if req.pendingAt > 0 {
		r.engines[req.pendingAt-1].pendingDecodes--
		req.pendingAt = 0
	}
}

// notePlacement records, at a request's first placement, what its lost
// KV reuse is counted from when its prefill ends: how far the prefill node
// holds the prompt or fetches it, and which later blocks the cluster had
// computed before. A retry keeps the first placement's view: what the
// aborted attempt computed is not counted as lost again.
func (r *run) notePlacement(req *request, m *kv.Match, first bool) {
	if !first {
		return
	}
	covered := m.For(r.engines[req.prefillAt].dir).Local
	for _, f := range req.dec.Fetches {
		covered = max(covered, f.End)
	}
	req.reuse = kv.NotePlacement(req.chain, covered, r.ever)
}

// lostReuse is a request's lost KV reuse once its prefill ended (src):
// see kv.PlacedReuse.Lost.
func (r *run) lostReuse(req *request, src stepmodel.Usage) int64 {
	return req.reuse.Lost(len(req.chain), len(req.call.Tokens), src.CachedTokens(), src.ComputedTokens, r.sc.Profile.BlockSize)
}

func (r *run) startDecode(req *request) {
	if r.reqs[req.id] != req || req.decodeStarted {
		return // aborted meanwhile
	}
	req.decodeStarted = true
	p := r.engines[req.prefillAt]
	chain, _ := p.model.Release(req.id)
	sr := stepmodel.Request{ID: req.id, Tokens: req.call.Tokens, Chain: req.chain, MaxTokens: req.call.MaxTokens,
		Seed: req.seed, Remote: &stepmodel.RemoteKV{Blocks: chain}}
	r.submit(req, req.decodeAt, sr)
}

// kick makes sure engine i steps.
func (r *run) kick(i int) {
	e := r.engines[i]
	if e.scheduled {
		return
	}
	e.scheduled = true
	r.push(&event{at: r.now, kind: evStep, eng: i})
}

func (r *run) step(i int) {
	e := r.engines[i]
	e.scheduled = false
	d, out := e.model.Step(r.now)
	end := out.Start.Add(d)
	for _, ev := range out.Events {
		blocks := r.dir.Blocks()
		r.dir.Apply(e.dir, ev)
		// A block the cluster held already was stored before: only one
		// new to the directory may be new to ever.
		if ev.Kind == kv.BlockStored && r.dir.Blocks() > blocks {
			r.ever.Add(ev.Hash)
		}
	}
	e.stats = out.Stats
	e.tokens += uint64(out.Stats.PrefillTokens + out.Stats.DecodeSeqs)
	if !out.Idle {
		r.observePass(e, d, &out.Stats)
		for _, f := range out.Finished {
			r.finished(e, i, f, end)
		}
		if len(out.Finished) > 0 {
			r.drainRouterQueue()
		}
		e.scheduled = true
		r.push(&event{at: end, kind: evStep, eng: i})
		return
	}
	if next, ok := e.model.NextWake(r.now); ok {
		e.scheduled = true
		r.push(&event{at: next, kind: evStep, eng: i})
	}
}

func (r *run) finished(e *engine, i int, f stepmodel.Finished, end time.Time) {
	req := r.reqs[f.ReqID]
	if req == nil {
		return
	}
	if f.Reason == stepmodel.FinishRemoteDecode {
		req.prefill = f.Usage
		req.prefillDone = true
		r.router.FirstToken(end, req.id)
		r.push(&event{at: end, kind: evDecode, req: req, attempt: req.attempt})
		return
	}
	r.router.FirstToken(end, req.id)
	r.router.Finished(end, req.id)
	delete(r.reqs, req.id)
	u := f.Usage
	output := f.Output
	if c := req.carry; c != nil {
		// Handed over mid-decode: the request's story starts on its first
		// leg, and its output is what every leg produced.
		output = append(c.output, f.Output...)
		u.CompletionTokens += len(c.output)
		u.PromptTokens, u.FirstToken = c.first.PromptTokens, c.first.FirstToken
		u.GPUHitTokens, u.HostHitTokens, u.TransferredTokens, u.ComputedTokens =
			c.first.GPUHitTokens, c.first.HostHitTokens, c.first.TransferredTokens, c.first.ComputedTokens
	}
	if !end.Before(r.scoreFrom) && !end.After(r.scoreTo) {
		r.res.Throughput += float64(u.CompletionTokens)
	}
	r.branchFinish(req, end)
	if r.planner != nil {
		r.planner.Finish(end, u.PromptTokens, u.CompletionTokens)
		r.planner.Measured(end, u.FirstToken.Sub(req.arrival).Seconds(), end.Sub(req.arrival).Seconds(), u.CompletionTokens)
	}
	// Where the prompt's KV came from is the prefill's story; a decode
	// leg's pull from its prefill engine is counted apart.
	src := u
	if req.dec.Disaggregated {
		src = req.prefill
	}
	// A request belongs to the window it arrived in, as the scored results
	// count requests by arrival.
	w := r.window()
	if i := int(req.arrival.Sub(r.start) / time.Minute); i < len(r.res.Timeline) {
		w = &r.res.Timeline[i]
	}
	w.Requests++
	r.window().OutputTokens += int64(u.CompletionTokens) // throughput: when produced
	w.e2e = append(w.e2e, end.Sub(req.arrival).Seconds())
	w.ttft = append(w.ttft, u.FirstToken.Sub(req.arrival).Seconds())
	w.PromptTokens += int64(u.PromptTokens)
	w.GPUHit += int64(src.GPUHitTokens)
	w.HostHit += int64(src.HostHitTokens)
	w.Computed += int64(src.ComputedTokens)
	lost := r.lostReuse(req, src)
	w.LostReuse += lost
	if req.scored {
		delete(r.open, req.id)
		r.e2e = append(r.e2e, end.Sub(req.arrival).Seconds())
		r.ttft = append(r.ttft, u.FirstToken.Sub(req.arrival).Seconds())
		r.res.Requests++
		r.res.PromptTokens += int64(u.PromptTokens)
		if req.dec.Disaggregated {
			r.res.TransferredTokens += int64(u.TransferredTokens)
		}
		r.res.GPUHitTokens += int64(src.GPUHitTokens)
		r.res.HostHitTokens += int64(src.HostHitTokens)
		r.res.ComputedTokens += int64(src.ComputedTokens)
		r.res.LostKVReuse += lost
	}
	if req.lane.lane != nil {
		req.lane.lane.Answer(output)
		r.nextCall(req.lane)
	}
}

// window is the current timeline window.
func (r *run) window() *Window { return &r.res.Timeline[len(r.res.Timeline)-1] }

// closeWindow records the cluster's state at a minute's end and opens the
// next window.
func (r *run) closeWindow() {
	w := r.window()
	for _, e := range r.engines {
		if e.state != engActive {
			continue
		}
		if e.role == roles.Prefill {
			w.Prefill++
		} else {
			w.Decode++
		}
		w.Waiting += e.stats.Waiting
	}
	if r.planner != nil {
		st := r.planner.Status()
		w.Recommended, w.PredictedTTFT, w.planned = st.Recommended, st.Current.TTFT, true
	}
	if r.branches != nil && r.branches.Expire(r.now) > 0 {
		r.pushHints()
	}
	r.res.Timeline = append(r.res.Timeline, Window{Start: r.now.Sub(r.start)})
	r.push(&event{at: r.now.Add(time.Minute), kind: evMinute})
}

func (r *run) finish() Result {
	r.res.Timeline = r.res.Timeline[:len(r.res.Timeline)-1] // the open one is partial
	res := r.res
	res.MeanE2EFinished = workload.Summarize(r.e2e).Mean
	// The scored requests still unfinished count their age at the scored
	// window's end (in a fixed order: the sum must not depend on a map's).
	ages := make([]float64, 0, len(r.open))
	for _, at := range r.open {
		ages = append(ages, r.scoreTo.Sub(at).Seconds())
	}
	sort.Float64s(ages)
	res.RequestsUnfinished = len(ages)
	e2e, ttft := workload.Summarize(append(r.e2e, ages...)), workload.Summarize(r.ttft)
	res.MeanE2E, res.P50E2E, res.P99E2E = e2e.Mean, e2e.P50, e2e.P99
	res.MeanTTFT, res.P50TTFT, res.P95TTFT, res.P99TTFT = ttft.Mean, ttft.P50, ttft.P95, ttft.P99
	secs := r.sc.Duration.Seconds()
	res.Throughput /= secs
	res.SessionsPerHour = float64(res.Sessions) / secs * 3600
	for _, e := range r.engines {
		res.Preemptions += e.model.Counters().Preemptions
		res.EnginePasses += e.model.Counters().Passes
	}
	res.VirtualSec = r.now.Sub(r.start).Seconds()
	res.Reversals = reversals(res.Moves)
	res.MeanE2EStdErr = batchStdErr(res.Timeline, r.sc.Warmup)
	res.Split = scoredSplit(res.Timeline, r.sc.Warmup, res.Split)
	return res
}

// scoredSplit is the split the scored windows served: the one split, or
// the first and the last ("3:6 -> 2:7", or "8:1, varied" when it came
// back) when a planner moved nodes; def when no window was scored.
func scoredSplit(tl []Window, warmup time.Duration, def string) string {
	first, last, changed := "", "", false
	for _, w := range tl {
		if w.Start < warmup {
			continue
		}
		sp := fmt.Sprintf("%d:%d", w.Prefill, w.Decode)
		if first == "" {
			first = sp
		}
		changed = changed || sp != first
		last = sp
	}
	switch {
	case first == "":
		return def
	case changed && first == last:
		return first + ", varied"
	case changed:
		return first + " -> " + last
	}
	return first
}

// reversals counts the switches that go the other way from the one before.
func reversals(moves []Move) int {
	n := 0
	for i := 1; i < len(moves); i++ {
		if moves[i].To != moves[i-1].To {
			n++
		}
	}
	return n
}

// batchStdErr is the standard error of the mean E2E by batch means over
// the scored minutes but the last (its requests mostly had no time to
// finish); 0 with fewer than 4 of them.
func batchStdErr(tl []Window, warmup time.Duration) float64 {
	var means []float64
	for _, w := range tl {
		if w.Start >= warmup && len(w.e2e) > 0 {
			means = append(means, w.MeanE2E())
		}
	}
	if len(means) > 0 {
		means = means[:len(means)-1]
	}
	k := float64(len(means))
	if k < 4 {
		return 0
	}
	var sum, sq float64
	for _, m := range means {
		sum += m
	}
	mean := sum / k
	for _, m := range means {
		sq += (m - mean) * (m - mean)
	}
	return math.Sqrt(sq/(k-1)) / math.Sqrt(k)
}
