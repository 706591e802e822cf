package orchestrator

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/evolvellm/evolve/controlapi"
	"github.com/evolvellm/evolve/kv"
	"github.com/evolvellm/evolve/protocol"
	"github.com/evolvellm/evolve/roles"
)

// ErrUnknownNode is returned for a node id the orchestrator has not seen.
type ErrUnknownNode string

func (e ErrUnknownNode) Error() string { return fmt.Sprintf("no node %q", string(e)) }

// SetRole starts switching node id to role (and pins it when pin is set);
// the switch runs in the background: stop routing new work to the node,
// let its requests in flight end (a decode node whose engine can hands
// them over to peer decode nodes, where they go on; see startHandOver),
// offload its GPU KV to its host pool so the context stays reachable,
// flip the engine's role, resume. A request is never dropped. It returns at once with the node's status. An operator's
// choice is stored and survives restarts.
// On an orchestrator that does not lead the planner, the change is sent
// to the leader, which makes it.
func (o *Orchestrator) SetRole(id, role string, pin bool, reason string) (controlapi.Node, error) {
	if !o.leading() {
		if _, ok := parseRole(role); !ok {
			return controlapi.Node{}, fmt.Errorf("role %q: want prefill or decode", role)
		}
		return o.askLeader(roleRequest{Node: id, Role: role, Pin: pin, Reason: reason})
	}
	return o.setRole(id, role, pin, reason, true)
}

// setRole is SetRole; the planner's moves are not stored (it re-derives
// the split; an engine re-registering reports the role it has).
func (o *Orchestrator) setRole(id, role string, pin bool, reason string, store bool) (controlapi.Node, error) {
	to, ok := parseRole(role)
	if !ok {
		return controlapi.Node{}, fmt.Errorf("role %q: want prefill or decode", role)
	}
	check := func() (*node, error) {
		n := o.c.nodes[id]
		switch {
		case n == nil:
			return nil, ErrUnknownNode(id)
		case n.state == StateDown:
			return nil, fmt.Errorf("node %s is down", id)
		}
		return n, nil
	}
	o.c.mu.Lock()
	n, err := check()
	if err != nil {
		o.c.mu.Unlock()
		return controlapi.Node{}, err
	}
	rec := roleRecord{Role: role, Pinned: pin || n.mode == ModePinned}
	o.c.mu.Unlock()
	if store {
		// Stored first: a choice that would not survive a restart is
		// refused, and nothing changes (a full data directory said
		// "pinned" and lost the pin).
		if err := o.store.put(id, rec); err != nil {
			o.noteStoreFailure()
			o.log.Warn("role override not stored; the role is left as it was", "id", id, "err", err)
			return controlapi.Node{}, &NotStoredError{What: "the role of " + id, Err: err}
		}
		if err := o.shadow.set(id, rec); err != nil {
			o.log.Warn("the copy of the role overrides is not written", "err", err)
		}
	}
	o.c.mu.Lock()
	if n, err = check(); err != nil {
		o.c.mu.Unlock()
		return controlapi.Node{}, err
	}
	if pin {
		n.mode = ModePinned
	}
	start := false
	if n.sw == nil && n.role != to {
		n.sw = &controlapi.Switch{To: role, Phase: "draining", Started: time.Now()}
		n.state = StateSwitching
		start = true
	}
	o.c.changed(id)
	st := n.status(id, o.c.dir)
	o.c.mu.Unlock()
	if start {
		o.announceSwitch(switchEvent{Node: id, To: role, Phase: "draining", Reason: reason})
		go o.runSwitch(id, to, reason)
	}
	return st, nil
}

// Unpin returns node id to automatic mode (on the leader, as SetRole).
func (o *Orchestrator) Unpin(id string) (controlapi.Node, error) {
	if !o.leading() {
		return o.askLeader(roleRequest{Node: id, Unpin: true})
	}
	o.c.mu.Lock()
	known := o.c.nodes[id] != nil
	o.c.mu.Unlock()
	if !known {
		return controlapi.Node{}, ErrUnknownNode(id)
	}
	if err := o.store.unpin(id); err != nil {
		o.noteStoreFailure()
		o.log.Warn("unpin not stored; the node stays pinned", "id", id, "err", err)
		return controlapi.Node{}, &NotStoredError{What: "the unpin of " + id, Err: err}
	}
	o.c.mu.Lock()
	defer o.c.mu.Unlock()
	n := o.c.nodes[id]
	if n == nil {
		return controlapi.Node{}, ErrUnknownNode(id)
	}
	n.mode = ModeAuto
	o.c.changed(id)
	return n.status(id, o.c.dir), nil
}

// NotStoredError is an operator's change that the durable store (the
// event plane's JetStream, under the data directory) did not take:
// nothing changed, since it would not have survived a restart.
type NotStoredError struct {
	What string // what was not stored; "" when Err says it all
	Err  error
}

func (e *NotStoredError) Error() string {
	if e.What == "" {
		return e.Err.Error() // said in full already (by the planner's leader)
	}
	return fmt.Sprintf("%s was not stored, so nothing changed: %v (is the orchestrator's data directory full or read-only? try again once it takes writes)", e.What, e.Err)
}

func (e *NotStoredError) Unwrap() error { return e.Err }

func (o *Orchestrator) phase(id, phase string) {
	o.c.mu.Lock()
	var ev *switchEvent
	if n := o.c.nodes[id]; n != nil && n.sw != nil {
		n.sw.Phase = phase
		o.c.changed(id)
		ev = &switchEvent{Node: id, To: n.sw.To, Phase: phase, HandedOver: n.sw.HandedOver}
	}
	o.c.mu.Unlock()
	if ev != nil {
		o.announceSwitch(*ev)
	}
}

func (o *Orchestrator) runSwitch(id string, to roles.Role, reason string) {
	ctx, cancel := context.WithTimeout(o.ctx, o.cfg.DrainTimeout)
	defer cancel()
	handOver := o.startHandOver(id, to)
	// Drain: the node is out of routing while switching; wait for the work
	// the router sent it (handed over, a decode's claim ends when its peer
	// answers).
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		o.c.mu.Lock()
		n := o.c.nodes[id]
		busy := n != nil && n.inFlight > 0 && n.state != StateDown
		down := n == nil || n.state == StateDown
		o.c.mu.Unlock()
		// The requests other routers sent it too (they stop routing to
		// it when the switch is announced).
		busy = busy || (!down && o.remoteOn(id) > 0)
		if !busy {
			break
		}
		select {
		case <-ctx.Done():
			o.log.Warn("drain timed out; switching with requests in flight (they finish where they are)", "id", id)
			busy = false
		case <-tick.C:
		}
		if !busy {
			break
		}
	}
	o.phase(id, "offloading")
	if _, err := o.control(id, protocol.ControlRequest{Op: protocol.OpOffload}); err != nil {
		o.log.Warn("offload before switch failed", "id", id, "err", err)
	}
	o.phase(id, "flipping")
	_, err := o.control(id, protocol.ControlRequest{Op: protocol.OpSetRole, Role: to.String()})
	done := switchEvent{Node: id, To: to.String(), Done: true, Reason: reason}
	if err != nil {
		done.Failed = err.Error()
	}
	defer func() { o.announceSwitch(done) }()
	o.c.mu.Lock()
	defer o.c.mu.Unlock()
	n := o.c.nodes[id]
	if n == nil {
		return
	}
	from, handed := n.role, n.sw.HandedOver
	done.HandedOver = handed
	n.sw, n.handingOver = nil, false
	if n.state == StateSwitching {
		n.state = StateServing
	}
	if err != nil {
		if handOver {
			// The engine keeps its role: it must stop handing its decodes
			// over (set_role would have ended that).
			go o.control(id, protocol.ControlRequest{Op: protocol.OpResume})
		}
		o.log.Error("role switch failed; the node keeps its role", "id", id, "err", err)
		n.history = appendHistory(n.history, roles.Change{Time: time.Now(), From: from.String(), To: from.String(), Reason: "switch failed: " + err.Error()})
	} else {
		n.role = to
		n.history = appendHistory(n.history, roles.Change{Time: time.Now(), From: from.String(), To: to.String(), Reason: reason, HandedOver: handed})
		o.met.switches.WithLabelValues(to.String()).Inc()
		o.log.Info("role switched", "id", id, "from", from.String(), "to", to.String(), "reason", reason, "handed_over", handed)
	}
	o.c.changed(id)
}

func appendHistory(h []roles.Change, c roles.Change) []roles.Change {
	h = append(h, c)
	if len(h) > 20 {
		h = h[len(h)-20:]
	}
	return h
}

// startHandOver asks a decode node switching to prefill to hand its
// decodes over to peers rather than finish them (they can run for
// minutes on reasoning work), when its engine can and a peer decode node
// serves. It reports whether the engine took it on.
func (o *Orchestrator) startHandOver(id string, to roles.Role) bool {
	o.c.mu.Lock()
	n := o.c.nodes[id]
	ok := n != nil && n.role == roles.Decode && to == roles.Prefill && n.reg.CanHandOver && n.inFlight > 0
	peers := 0
	for pid, p := range o.c.nodes {
		if pid != id && p.role == roles.Decode && p.state == StateServing {
			peers++
		}
	}
	o.c.mu.Unlock()
	if !ok || peers == 0 {
		return false
	}
	o.phase(id, "handing over")
	if _, err := o.control(id, protocol.ControlRequest{Op: protocol.OpHandOver}); err != nil {
		o.log.Warn("hand over failed; draining instead", "id", id, "err", err)
		o.phase(id, "draining")
		return false
	}
	o.c.mu.Lock()
	if n := o.c.nodes[id]; n != nil && n.sw != nil {
		n.handingOver = true
	}
	o.c.mu.Unlock()
	o.log.Info("handing decodes over to peers", "id", id, "peers", peers)
	return true
}

// handedOver counts an answer node id handed over to a peer, which went
// on with it.
func (o *Orchestrator) handedOver(id string) {
	o.c.mu.Lock()
	defer o.c.mu.Unlock()
	if n := o.c.nodes[id]; n != nil && n.sw != nil {
		n.sw.HandedOver++
		o.c.changed(id)
	}
}

// handingOver reports whether node id hands its decodes over.
func (o *Orchestrator) handingOver(id string) bool {
	o.c.mu.Lock()
	defer o.c.mu.Unlock()
	n := o.c.nodes[id]
	return n != nil && n.handingOver
}

// claimDecodePeer picks the serving decode node, not in exclude, with the
// fewest requests the router sent it (then the fewest its engine last
// reported, then by id), and claims it for a request: the node a
// handed-over decode continues on, as the simulator picks it. It returns
// "" when no decode node serves.
func (o *Orchestrator) claimDecodePeer(exclude map[string]bool) (id, url string) {
	return o.claimPeer(exclude, func(n *node) bool { return n.role == roles.Decode }, nil)
}

// claimResumer picks and claims a serving node not in exclude that can
// continue an answer from its output so far (evolve's engines), which
// pulls from peers or recomputes what it lacks of the prompt's KV (chain,
// see placeResume) and recomputes the output's, or has a prefill node do
// so: a
// decode node if one serves, else a prefill node, which takes a whole
// request too; of those the one that holds the longest prefix of the
// prompt (on GPU or host), then as claimDecodePeer picks.
func (o *Orchestrator) claimResumer(exclude map[string]bool, chain []kv.BlockHash) (id, url string) {
	held := lastIfSuspect(o.heldOf(chain))
	if id, url = o.claimPeer(exclude, func(n *node) bool { return n.role == roles.Decode && n.reg.CanHandOver }, held); id != "" {
		return id, url
	}
	return o.claimPeer(exclude, func(n *node) bool { return n.reg.CanHandOver }, held)
}

// claimVLLMResumer picks and claims a serving vLLM engine of backend,
// not in exclude, to go on with an answer another vLLM engine streamed
// (resumeVLLM): the one holding most of chain's KV, a decode node among
// equals. With roles given (only), only engines of those count. It returns how
// many leading tokens of chain's prompt the engine holds, in whole blocks.
func (o *Orchestrator) claimVLLMResumer(exclude map[string]bool, chain []kv.BlockHash, backend string, only ...roles.Role) (id, url string, heldTokens int) {
	heldBy := o.heldOf(chain)
	fits := func(n *node) bool {
		return isVLLM(n, backend) && (len(only) == 0 || slices.Contains(only, n.role))
	}
	id, url = o.claimPeer(exclude, fits, lastIfSuspect(func(n *node) int {
		h := 2 * heldBy(n)
		if n.role == roles.Decode {
			h++
		}
		return h
	}))
	if id != "" {
		o.c.mu.Lock()
		if n := o.c.nodes[id]; n != nil {
			heldTokens = heldBy(n) * o.blockSize
		}
		o.c.mu.Unlock()
	}
	return id, url, heldTokens
}

// isVLLM says whether n is a vLLM engine of backend.
func isVLLM(n *node, backend string) bool {
	return n.reg.Backend == backend && n.reg.Tokenizer == "engine" && !n.reg.CanHandOver
}

// vllmPrefillServes says whether a vLLM engine of backend, not in
// exclude, serves as prefill: a decode engine can then pull a resumed
// answer's KV from it rather than compute it.
func (o *Orchestrator) vllmPrefillServes(exclude map[string]bool, backend string) bool {
	o.c.mu.Lock()
	defer o.c.mu.Unlock()
	for id, n := range o.c.nodes {
		if !exclude[id] && n.state == StateServing && n.role == roles.Prefill && isVLLM(n, backend) {
			return true
		}
	}
	return false
}

// claimResumePrefill picks and claims a serving prefill node not in
// exclude that can compute a resumed answer's KV for its decode node
// (evolve's engines take evolve_resume on a prefill leg): the one that
// holds the longest prefix of the prompt (m, the directory's match of
// it, on GPU or host), then as claimDecodePeer picks. It returns "" when
// none serves.
func (o *Orchestrator) claimResumePrefill(exclude map[string]bool, m *kv.Match) (id, url string) {
	return o.claimPeer(exclude, func(n *node) bool { return n.role == roles.Prefill && n.reg.CanHandOver },
		func(n *node) int { return m.For(n.dir).Local })
}

// heldOf says how many leading blocks of chain a node holds (GPU and
// host), as the directory knows now.
func (o *Orchestrator) heldOf(chain []kv.BlockHash) func(*node) int {
	var m kv.Match
	o.c.mu.Lock()
	o.c.dir.Match(chain, &m)
	o.c.mu.Unlock()
	return func(n *node) int { return m.For(n.dir).Local }
}

// claimPeer claims a serving node, not in exclude, that fits: the one
// holding the most of the request's KV by held (nil: none counts), then
// the least claimed.
func (o *Orchestrator) claimPeer(exclude map[string]bool, fits func(*node) bool, held func(*node) int) (id, url string) {
	o.c.mu.Lock()
	defer o.c.mu.Unlock()
	var best *node
	bestHeld := 0
	for nid, n := range o.c.nodes {
		if exclude[nid] || n.state != StateServing || n.reg.URL == "" || !fits(n) {
			continue
		}
		h := 0
		if held != nil {
			h = held(n)
		}
		if best == nil || h > bestHeld || h == bestHeld && (n.inFlight < best.inFlight ||
			n.inFlight == best.inFlight && (n.hb.Running+n.hb.Waiting < best.hb.Running+best.hb.Waiting ||
				n.hb.Running+n.hb.Waiting == best.hb.Running+best.hb.Waiting && nid < id)) {
			best, id, bestHeld = n, nid, h
		}
	}
	if best == nil {
		return "", ""
	}
	best.inFlight++
	return id, best.reg.URL
}
