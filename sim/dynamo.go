package sim

import (
	"sort"
	"time"

	"github.com/evolvellm/evolve/engine/stepmodel"
	"github.com/evolvellm/evolve/roles"
)

// Dynamo's 2026 default planner ("throughput" target, load-based), as
// docs/baselines.md describes it: every 5 s, per pool,
// at most one step of one worker; prefill grows when any prefill worker has
// queued prefill tokens of at least one context length and shrinks when all
// are under a tenth; decode grows when any decode worker's scheduled plus
// queued KV exceeds its capacity and shrinks when all are under 60%; at
// least one worker per pool, within the cluster's engine budget; no new
// action while the pool's previous one is pending. An added worker cold
// starts (model load) before it serves; a removed one stops getting
// requests, gets 5 s of grace, then its requests in flight abort and are
// sent again from scratch (counted as retried). Workers never change role.
const (
	dynamoPlanInterval = 5 * time.Second
	dynamoRemoveGrace  = 5 * time.Second
)

func (r *run) plan() {
	r.push(&event{at: r.now.Add(dynamoPlanInterval), kind: evPlan})
	for _, role := range []roles.Role{roles.Prefill, roles.Decode} {
		var pool []int
		pending := false
		for i, e := range r.engines {
			if e.role != role {
				continue
			}
			switch e.state {
			case engActive:
				pool = append(pool, i)
			case engStarting, engRemoving:
				pending = true
			}
		}
		if pending || len(pool) == 0 {
			continue
		}
		up, down := false, true
		for _, i := range pool {
			e := r.engines[i]
			qp, qkv := e.model.Load()
			var load float64
			if role == roles.Prefill {
				load = float64(qp) / float64(r.sc.Profile.MaxModelLen)
				up = up || load >= 1.0
				down = down && load < 0.1
			} else {
				capTokens := float64(e.model.Config().GPUBlocks * r.sc.Profile.BlockSize)
				load = (float64(e.stats.GPUBlocksUsed*r.sc.Profile.BlockSize) + float64(qkv)) / capTokens
				up = up || load > 1.0
				down = down && load < 0.6
			}
		}
		switch {
		case up:
			r.addWorker(role)
		case down && len(pool) > 1:
			r.removeWorker(pool[r.leastLoaded(pool)])
		}
	}
}

// leastLoaded is the position in pool of the engine with the fewest
// requests running and waiting (the first among equals).
func (r *run) leastLoaded(pool []int) int {
	best, bestLoad := -1, 0
	for k, i := range pool {
		st := r.engines[i].stats
		if l := st.Running + st.Waiting; best < 0 || l < bestLoad {
			best, bestLoad = k, l
		}
	}
	return best
}

// removeWorker stops routing to engine i; after the grace period its
// requests abort and are sent again (remove).
func (r *run) removeWorker(i int) {
	r.noteRole(i, r.engines[i].role.String(), "down", "planner removed the worker: grace, then abort")
	r.engines[i].state = engRemoving
	r.push(&event{at: r.now.Add(dynamoRemoveGrace), kind: evRemove, eng: i})
}

// addWorker starts a cold worker of role in a free slot of the budget.
func (r *run) addWorker(role roles.Role) {
	for i, e := range r.engines {
		if e.state != engOff {
			continue
		}
		r.noteRole(i, "down", role.String(), "planner added a worker: cold start")
		e.role, e.state = role, engStarting // its model is the empty one remove left
		e.stats = stepmodel.PassStats{}
		r.push(&event{at: r.now.Add(r.pol.ColdStart), kind: evReady, eng: i})
		return
	}
}

func (r *run) ready(i int) {
	e := r.engines[i]
	if e.state != engStarting {
		return
	}
	e.state = engActive
	r.res.RoleSwitches++
	r.drainRouterQueue() // a new worker is not busy
}

// remove ends a removed worker's grace: what it still serves aborts and is
// sent again from scratch; its KV is gone.
func (r *run) remove(i int) {
	e := r.engines[i]
	if e.state != engRemoving {
		return
	}
	aborted := map[string]bool{}
	for _, id := range e.model.AbortAll(r.now) {
		aborted[id] = true
	}
	ids := make([]string, 0, len(aborted))
	for id := range r.reqs {
		ids = append(ids, id)
	}
	sort.Strings(ids) // retries are queued in this order: it must not be the map's
	for _, id := range ids {
		req := r.reqs[id]
		onIt := aborted[id] && !(req.prefillAt == i && req.prefillDone && req.decodeStarted && req.decodeAt != i)
		if !onIt {
			continue
		}
		// Drop the other leg too (a held prefill, or a decode elsewhere).
		for _, other := range []int{req.prefillAt, req.decodeAt} {
			if other != i {
				r.engines[other].model.Abort(r.now, id)
			}
		}
		r.router.Finished(r.now, id)
		delete(r.reqs, id)
		req.retry = true
		r.res.Retried++
		r.push(&event{at: r.now, kind: evArrive, req: req})
	}
	// The worker's process is gone, and its KV with it, in the directory
	// and in the engine (a step still due finds nothing to do).
	r.dir.DropNode(e.dir)
	e.model = stepmodel.NewModel(r.sc.Profile, r.pol.engineConfig())
	e.state = engOff
	e.stats = stepmodel.PassStats{}
	r.res.RoleSwitches++
	if r.pol.SLAPlanner {
		r.slaFill() // a freed slot may be what a growing pool waits for
	}
	r.drainRouterQueue()
}
