package orchestrator

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/evolvellm/evolve/orchestrator/routing"
	"github.com/nats-io/nats.go"
)

// Router replicas share the load they place: each tells the others what
// a request it routed adds to the policy's bookkeeping, when its prefill
// ends and when it finishes (as Dynamo's router replicas share their
// active sequences), so that two routers do not both send their next
// request to the engine each thinks idle. A router that goes silent has
// its requests dropped from the others' bookkeeping.

// subjectRouterLoad carries routers' load events.
const subjectRouterLoad = "evolve.router.load"

// Load event kinds.
const (
	loadPlaced   = "placed"
	loadFirst    = "first"
	loadFinished = "finished"
)

// loadEvent is one router's change to the shared bookkeeping.
type loadEvent struct {
	Router string        `json:"router"`
	ID     string        `json:"id"`
	Kind   string        `json:"kind"`
	Load   *routing.Load `json:"load,omitempty"`
}

// remoteLoads are the requests other routers placed that this one's
// policy counts, by router (so that a router's can be dropped at once),
// with the nodes each runs on.
type remoteLoads map[string]map[string]*remoteRequest

// remoteRequest is a request another router placed: its nodes, and
// whether its prefill is over (its prefill node is then free of it).
type remoteRequest struct {
	prefill, decode string
	prefillDone     bool
}

// shareLoad tells the other routers about request id (kind: placed,
// first or finished), when the policy keeps shared bookkeeping and other
// orchestrators are there.
func (o *Orchestrator) shareLoad(id, kind string) {
	sh, ok := o.policy.(routing.Shared)
	if !ok || o.nc == nil || !o.hasPeers() {
		return
	}
	ev := loadEvent{Router: o.cfg.Name, ID: id, Kind: kind}
	if kind == loadPlaced {
		o.policyMu.Lock()
		l, ok := sh.Load(id)
		o.policyMu.Unlock()
		if !ok {
			return
		}
		ev.Load = &l
	}
	b, _ := json.Marshal(ev)
	o.nc.Publish(subjectRouterLoad, b)
}

// followLoads takes the other routers' load into this one's policy.
func (o *Orchestrator) followLoads() error {
	sh, ok := o.policy.(routing.Shared)
	if !ok {
		return nil
	}
	o.remote = remoteLoads{}
	sub, err := o.nc.Subscribe(subjectRouterLoad, func(m *nats.Msg) {
		var ev loadEvent
		if json.Unmarshal(m.Data, &ev) != nil || ev.Router == o.cfg.Name || ev.Router == "" {
			return
		}
		key := ev.Router + "/" + ev.ID
		now := time.Now()
		o.policyMu.Lock()
		defer o.queue.kick() // load left an engine, or came: a queued request may look
		defer o.policyMu.Unlock()
		reqs := o.remote[ev.Router]
		switch ev.Kind {
		case loadPlaced:
			if ev.Load == nil {
				return
			}
			if reqs == nil {
				reqs = map[string]*remoteRequest{}
				o.remote[ev.Router] = reqs
			}
			reqs[key] = &remoteRequest{prefill: ev.Load.Prefill, decode: ev.Load.Decode}
			sh.AddLoad(key, *ev.Load)
		case loadFirst:
			if r := reqs[key]; r != nil {
				r.prefillDone = true
				o.policy.FirstToken(now, key)
			}
		case loadFinished:
			if _, ok := reqs[key]; ok {
				o.policy.Finished(now, key)
				delete(reqs, key)
			}
		}
	})
	if err != nil {
		return fmt.Errorf("subscribe %s: %w", subjectRouterLoad, err)
	}
	o.subs = append(o.subs, sub)
	return nil
}

// dropLoadsOf forgets the requests router placed (it went silent: its
// requests died with it, or will be finished without word).
func (o *Orchestrator) dropLoadsOf(router string) {
	o.policyMu.Lock()
	n := len(o.remote[router])
	for key := range o.remote[router] {
		o.policy.Finished(time.Now(), key)
	}
	delete(o.remote, router)
	o.policyMu.Unlock()
	if n > 0 {
		o.log.Info("a silent router's requests leave the routing bookkeeping", "router", router, "requests", n)
		o.queue.kick()
	}
}

// remoteOn is how many requests other routers placed on node id are in
// flight, as far as their load events say.
func (o *Orchestrator) remoteOn(id string) int {
	o.policyMu.Lock()
	defer o.policyMu.Unlock()
	n := 0
	for _, reqs := range o.remote {
		for _, r := range reqs {
			if r.decode == id || (r.prefill == id && !r.prefillDone) {
				n++
			}
		}
	}
	return n
}
