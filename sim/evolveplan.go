package sim

import (
	"fmt"
	"sort"
	"time"

	"github.com/evolvellm/evolve/engine/stepmodel"
	"github.com/evolvellm/evolve/planner"
	"github.com/evolvellm/evolve/roles"
)

// evolve's online planner in the simulator: the same planner.Planner the
// orchestrator runs, fed the same things (every engine pass, every routed
// request, every finished one) and switching nodes by the same protocol:
// the node leaves the router's view, finishes what it holds (requests
// running, queued or on their way to it as decode legs), copies its GPU KV
// to its host pool so that the context stays reachable, and serves in its
// new role.

// switchPoll is how often a draining node is checked.
const switchPoll = time.Second

func newPlanner(sc Scenario, m *stepmodel.Model) *planner.Planner {
	p := sc.Profile
	cfg := m.Config()
	return planner.New(planner.Config{
		Interval: sc.Planner.Interval, Persistence: sc.Planner.Persistence, TTFTWeight: sc.Planner.TTFTWeight,
		MinImprovement: sc.Planner.MinImprovement, TTFTSLO: sc.Planner.TTFTSLO, Uncalibrated: sc.Planner.Uncalibrated,
		Limits: planner.Limits{MaxBatchedTokens: cfg.MaxNumBatchedTokens, MaxSeqs: cfg.MaxNumSeqs,
			GPUKVTokens: cfg.GPUBlocks * p.BlockSize},
		HostSecPerBlock: p.BlockBytes() / (p.HostGBps * 1e9), NetSecPerBlock: p.BlockBytes() / (p.NetworkGBps * 1e9),
	})
}

// observePass gives the planner one pass of engine e.
func (r *run) observePass(e *engine, d time.Duration, st *stepmodel.PassStats) {
	if r.planner == nil || d <= 0 {
		return
	}
	r.planner.ObservePass(r.now, planner.Pass{Seconds: d.Seconds(), PrefillTokens: st.PrefillTokens,
		PrefillAttended: st.PrefillAttended, DecodeSeqs: st.DecodeSeqs, DecodeContext: st.DecodeContext,
		CopyBlocks: st.HostLoadBlocks + st.OffloadBlocks, OnPrefillNode: e.role == roles.Prefill})
}

// planStep runs one planner step and starts the switches it asks for.
func (r *run) planStep() {
	r.push(&event{at: r.now.Add(r.planner.Config().Interval), kind: evPlanStep})
	nodes := r.planNodes[:0]
	for _, e := range r.engines {
		role := e.role
		if e.switching {
			role = e.switchTo
		}
		nodes = append(nodes, planner.NodeInfo{ID: e.id, Role: role, Auto: true,
			Serving: e.state == engActive && !e.switching, Switching: e.switching,
			Waiting: e.stats.Waiting, Running: e.stats.Running, GPUBlocksUsed: e.stats.GPUBlocksUsed,
			ReferencedShare: r.referencedShare(e.dir), CanHandOver: !r.sc.DrainSwitches})
	}
	r.planNodes = nodes
	// The router prices recomputation with the learned cost.
	if sec, ok := r.planner.PrefillSecPerToken(r.now); ok {
		for i := range r.view.Nodes {
			r.view.Nodes[i].PrefillSecPerToken = sec
		}
	}
	if !r.pol.Planner {
		return // learning only: no node moves
	}
	for _, m := range r.planner.Step(r.now, nodes) {
		to := m.To
		why := "planner"
		if ds := r.planner.Status().Decisions; len(ds) > 0 {
			why = "planner: " + ds[len(ds)-1].Reason
		}
		r.startSwitch(r.byID[m.Node], to, why)
	}
}

// startSwitch begins moving engine i to role to: it leaves the router's
// view, hands its decodes over (unless the scenario drains), and takes
// the role once empty (switchStep).
func (r *run) startSwitch(i int, to roles.Role, why string) {
	e := r.engines[i]
	e.switching, e.switchTo, e.switchWhy = true, to, why
	r.res.Moves = append(r.res.Moves, Move{At: r.now.Sub(r.start), Engine: i, To: to})
	if !r.now.Before(r.scoreFrom) && !r.now.After(r.scoreTo) {
		r.res.RoleSwitches++
	}
	if e.role == roles.Decode && !r.sc.DrainSwitches {
		r.handOver(i)
	}
	r.push(&event{at: r.now.Add(switchPoll), kind: evSwitch, eng: i})
}

// replay starts a recorded switch, if its engine can move now as it could
// then (active, not moving, in the other role).
func (r *run) replay(m Move) {
	if m.Engine < 0 || m.Engine >= len(r.engines) {
		return
	}
	if e := r.engines[m.Engine]; e.switching || e.state != engActive || e.role == m.To {
		return
	}
	r.startSwitch(m.Engine, m.To, "replay")
}

// applySchedule starts the switches that bring the cluster to ch's split:
// the least loaded engines of the role that has too many move, by the
// same protocol as the planner's.
func (r *run) applySchedule(ch SplitChange) {
	bound := func(e *engine) roles.Role {
		if e.switching {
			return e.switchTo
		}
		return e.role
	}
	prefill := 0
	for _, e := range r.engines {
		if bound(e) == roles.Prefill {
			prefill++
		}
	}
	for prefill != ch.Prefill {
		from, to := roles.Decode, roles.Prefill
		if prefill > ch.Prefill {
			from, to = roles.Prefill, roles.Decode
		}
		best, load := -1, 0
		for i, e := range r.engines {
			if e.switching || e.state != engActive || e.role != from {
				continue
			}
			if l := e.stats.Running + e.stats.Waiting; best < 0 || l < load {
				best, load = i, l
			}
		}
		if best < 0 {
			return // every engine of that role is already moving
		}
		r.startSwitch(best, to, fmt.Sprintf("schedule: %d:%d", ch.Prefill, len(r.engines)-ch.Prefill))
		if to == roles.Prefill {
			prefill++
		} else {
			prefill--
		}
	}
}

// switchStep moves a switching node on: once nothing is in flight on it,
// its GPU KV goes to host, then it takes its new role.
func (r *run) switchStep(i int) {
	e := r.engines[i]
	if !e.switching {
		return
	}
	if e.model.InFlight() > 0 || e.pendingDecodes > 0 {
		if e.role == roles.Decode && !r.sc.DrainSwitches {
			// Sequences that were queued or prefilling when the switch
			// began hand over once they decode: without this a node
			// whose queue was full drains for as long as its last
			// answer takes (minutes of reasoning output).
			r.handOver(i)
		}
		r.push(&event{at: r.now.Add(switchPoll), kind: evSwitch, eng: i})
		return
	}
	e.model.OffloadGPU(r.now) // delays the node's next pass by the copy
	role := roles.Decode
	if e.switchTo == roles.Prefill {
		role = roles.Prefill
	}
	e.model.SetRole(role)
	r.noteRole(i, e.role.String(), e.switchTo.String(), e.switchWhy)
	e.role, e.switching = e.switchTo, false
	r.kick(i) // publishes the offload's KV events
}

// carried is what a request's earlier decode legs produced before it was
// handed over to another node.
type carried struct {
	first  stepmodel.Usage // the first leg's usage: prompt, KV sources, first token
	output []uint32
}

// handOver empties decode node i for a switch without waiting for its
// decodes to end (they can run for minutes on reasoning work): a sequence
// decoding there continues on a peer decode node, which pulls its KV
// (prompt and output so far) over the network; a decode leg routed there
// and not yet started goes to the peer instead. A request still in its
// prefill there finishes it there.
func (r *run) handOver(i int) {
	ids := make([]string, 0, 16)
	for id, req := range r.reqs {
		if req.decodeAt == i {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids) // map order is random; the run must not be
	for _, id := range ids {
		req := r.reqs[id]
		j := r.handOverTarget(i)
		if j < 0 {
			return
		}
		if req.pendingAt == i+1 {
			r.unpend(req)
			req.decodeAt, req.pendingAt = j, j+1
			r.engines[j].pendingDecodes++
			continue
		}
		mg, ok := r.engines[i].model.Migrate(r.now, id)
		if !ok {
			continue
		}
		if req.carry == nil {
			req.carry = &carried{first: mg.Usage}
		}
		req.carry.output = append(req.carry.output, mg.Output...)
		req.decodeAt = j
		req.migrations++
		r.res.HandedOver++
		sr := stepmodel.Request{ID: req.id, Tokens: mg.Tokens, Chain: mg.Chain, MaxTokens: mg.Remaining,
			Seed: req.seed + uint64(req.migrations), Remote: &stepmodel.RemoteKV{Blocks: mg.Chain}, Continues: true}
		if mg.Remaining < 1 {
			continue
		}
		r.submit(req, j, sr)
	}
	r.kick(i)
}

// handOverTarget is the serving decode node other than i with the least
// work, or -1.
func (r *run) handOverTarget(i int) int {
	best, load := -1, 0
	for j, e := range r.engines {
		if j == i || e.role != roles.Decode || e.switching || e.state != engActive {
			continue
		}
		l := e.stats.Running + e.stats.Waiting + e.pendingDecodes
		if best < 0 || l < load {
			best, load = j, l
		}
	}
	return best
}
