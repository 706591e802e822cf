package orchestrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/evolvellm/evolve/kv"
	"github.com/evolvellm/evolve/protocol"
	"github.com/evolvellm/evolve/roles"
	"github.com/nats-io/nats.go"
)

// subscribe listens to the engines on the event plane.
func (o *Orchestrator) subscribe() error {
	subs := []struct {
		subject string
		handle  func(*nats.Msg)
	}{
		{protocol.SubjectRegister, o.onRegister},
		{protocol.SubjectAllHeartbeats, o.onHeartbeat},
		{protocol.SubjectAllKV, o.onKV},
		{protocol.SubjectDeregister, o.onDeregister},
		{protocol.SubjectAllStats, o.onStats},
	}
	for _, s := range subs {
		sub, err := o.nc.Subscribe(s.subject, s.handle)
		if err != nil {
			return fmt.Errorf("subscribe %s: %w", s.subject, err)
		}
		// KV events arrive in bursts: never let NATS drop them for a slow
		// consumer; the directory keeps up (millions of events a second).
		_ = sub.SetPendingLimits(-1, -1)
		o.subs = append(o.subs, sub)
		if s.subject == protocol.SubjectAllHeartbeats {
			o.hbSub = sub
		}
	}
	if err := o.nc.Flush(); err != nil {
		return err
	}
	// Engines already running register again.
	return o.nc.Publish(protocol.SubjectAnnounce, nil)
}

func (o *Orchestrator) onRegister(m *nats.Msg) {
	var reg protocol.Registration
	err := json.Unmarshal(m.Data, &reg)
	if err == nil {
		err = protocol.ValidateEngineID(reg.ID)
	}
	if err != nil {
		o.log.Warn("registration refused", "err", err, "data", truncate(m.Data, 512))
		return
	}
	// A registration a router cannot use joins as rejected, with why, as
	// one of another model does: dropped, its engine's heartbeats (from a
	// node never seen) would ask every engine to register again, every
	// second, and the operator would find it in no node list.
	invalid := reg.Validate()
	o.c.mu.Lock()
	n := o.c.nodes[reg.ID]
	fresh := n == nil || n.state == StateDown || !n.reg.StartedAt.Equal(reg.StartedAt)
	if n == nil {
		dir, err := o.c.dir.Node(reg.ID)
		if err != nil {
			o.c.mu.Unlock()
			o.log.Error("node not added", "id", reg.ID, "err", err)
			return
		}
		n = &node{dir: dir, mode: ModeAuto}
		o.c.nodes[reg.ID] = n
		n.role = o.initialRole(reg)
	}
	n.reg = reg
	n.lastSeen = time.Now()
	if n.state == "" || n.state == StateDown {
		n.state = StateRejected // judged below, with the engines present
	}
	o.electModelLocked()
	if invalid != nil || reg.Model != o.model || reg.BlockSize != o.blockSize {
		// Routing one model's prompts to another, hashing blocks of
		// another size, or trusting sizes below zero would be wrong:
		// keep it out.
		n.state = StateRejected
		n.reason = rejection(reg, o.model, o.blockSize)
		if invalid != nil {
			n.reason = invalid.Error()
		}
		o.c.changed(reg.ID)
		reason := n.reason
		o.c.mu.Unlock()
		o.log.Error("engine rejected", "id", reg.ID, "reason", reason)
		o.tellRegistration(reg.ID, reason)
		return
	}
	if n.state == StateRejected {
		// Accepted now (the cluster's model followed the engines, or the
		// engine was fixed): its KV is learned from scratch.
		n.state, n.reason = StateServing, ""
		fresh = true
		defer o.tellRegistration(reg.ID, "")
	}
	if fresh {
		// Whatever it holds now, learn it from scratch.
		o.c.dir.DropNode(n.dir)
		n.resyncAt = time.Time{}
		n.interrupted, n.lost, n.passes = 0, 0, 0
	}
	o.applyStoredRole(reg.ID, n)
	leading := o.leading()
	if !leading {
		// The leader sets roles; this orchestrator takes the engine's.
		if r, ok := parseRole(reg.Role); ok {
			n.role = r
		}
	}
	want := n.role.String()
	o.c.changed(reg.ID)
	o.c.mu.Unlock()
	o.planLimits(reg)
	if fresh {
		o.log.Info("engine registered", "id", reg.ID, "url", reg.URL, "role", want, "model", reg.Model, "token_required", reg.TokenRequired)
		if !reg.TokenRequired && o.cfg.engineToken() != "" {
			o.log.Warn("engine serves its port to anyone who reaches it, past the router's API keys: give it the engine token (evolve engine --nats nats://TOKEN@..., or --token)",
				"id", reg.ID, "url", reg.URL)
		}
		go o.resync(reg.ID)
	}
	if reg.Role != want && leading {
		go o.control(reg.ID, protocol.ControlRequest{Op: protocol.OpSetRole, Role: want})
	}
}

// initialRole is a new node's role: the one it was started with, or
// decode for an engine that takes both.
func (o *Orchestrator) initialRole(reg protocol.Registration) roles.Role {
	if reg.Role == "prefill" {
		return roles.Prefill
	}
	return roles.Decode
}

func (o *Orchestrator) onHeartbeat(m *nats.Msg) {
	var hb protocol.Heartbeat
	if err := json.Unmarshal(m.Data, &hb); err != nil || protocol.ValidateEngineID(hb.ID) != nil {
		return
	}
	now := time.Now()
	o.live.heard(hb.ID, now) // before the lock: waiting for it is not silence
	o.c.mu.Lock()
	defer o.c.mu.Unlock()
	n := o.c.nodes[hb.ID]
	if n == nil {
		// Heartbeats from an engine we have not seen register: ask it.
		go o.nc.Publish(protocol.SubjectAnnounce, nil)
		return
	}
	if prev := n.hb.TokensTotal; hb.TokensTotal > prev && !n.hb.Time.IsZero() {
		// An engine without pass records counts its tokens itself (from
		// the second heartbeat on: the first brings its whole past).
		n.noteTokens(time.Now(), int(hb.TokensTotal-prev))
	}
	n.hb, n.lastSeen = hb, now
	o.followRole(hb.ID, n, hb.Role)
	if n.state == StateDown {
		// It must register again, and resync its KV, which the directory
		// dropped. One that said goodbye is asked nothing: it is stopping.
		// One marked down for its silence (stopped by SIGSTOP, a stalled
		// host, a partition) is back: ask it.
		if n.silent && o.live.askAgain(hb.ID, now) {
			o.log.Info("engine beats again after it was marked down; asking it to register", "id", hb.ID, "down_for", n.reason)
			go o.nc.Publish(protocol.SubjectAnnounce, nil)
		}
		return
	}
	// An engine draining (stopping, or told to) takes no new requests:
	// nothing is routed to it until it says otherwise.
	switch {
	case hb.Draining && n.state == StateServing:
		n.state = StateDraining
	case !hb.Draining && n.state == StateDraining:
		n.state = StateServing
	}
	o.c.changed(hb.ID)
}

func (o *Orchestrator) onKV(m *nats.Msg) {
	var b protocol.KVEventBatch
	if err := json.Unmarshal(m.Data, &b); err != nil {
		o.log.Warn("bad KV event batch", "err", err)
		return
	}
	o.live.heard(b.Engine, time.Now()) // events flowing are a sign of life too
	o.c.mu.Lock()
	n := o.c.nodes[b.Engine]
	if n == nil || n.state == StateDown || n.state == StateRejected {
		o.c.mu.Unlock()
		return
	}
	n.lastSeen = time.Now()
	for _, e := range b.Events {
		if e.Kind == kv.AllCleared {
			n.clearedAt = n.lastSeen
		}
	}
	err := o.c.dir.ApplyBatch(n.dir, b.Events)
	o.noteReferencedEvictionsLocked(n, b.Events)
	hints := o.noteStoredLocked(b.Events)
	if len(hints) > 0 && !n.reg.SelfManagedKV { // a self-managed engine takes no hints
		slices.Reverse(hints) // deepest first, as hintsLocked sends them
		o.sendHints(map[string][]protocol.Hint{b.Engine: hints})
	}
	ask := false
	if errors.Is(err, kv.ErrGap) || (o.c.dir.NeedsResync(n.dir) && time.Since(n.resyncAt) > 5*time.Second) {
		ask = true
		n.resyncAt = time.Now()
	}
	o.c.mu.Unlock()
	if ask {
		o.log.Warn("KV events lost; resyncing the engine", "id", b.Engine, "err", err)
		go o.resync(b.Engine)
	}
}

func (o *Orchestrator) onDeregister(m *nats.Msg) {
	var d protocol.Deregistration
	if json.Unmarshal(m.Data, &d) != nil {
		return
	}
	o.markDown(d.ID, "deregistered", false)
}

// modelStickiness is how long an engine of the model served counts for
// it after it went down.
const modelStickiness = 5 * time.Minute

// electModelLocked sets the model the cluster serves, and its block size,
// from the engines present: the orchestrator's --served-model when given,
// else the one the most engines that are not down serve (the one served
// now on a tie, then the first registered). Engines of another model are
// rejected; when the choice changes, every engine is asked to register
// again, so that those of the new model are judged anew. Before, the
// first engine's model held for good: one started with a mistyped
// --served-model-name made every other engine rejected until the
// orchestrator restarted, even after it left. Call with mu held.
func (o *Orchestrator) electModelLocked() {
	type key struct {
		model string
		bs    int
	}
	count, first := map[key]int{}, map[key]time.Time{}
	now := time.Now()
	for _, n := range o.c.nodes {
		if n.reg.Validate() != nil {
			continue
		}
		if n.state == StateDown {
			// An engine of the model served, down lately (restarting, a
			// rolling upgrade), still counts for it: the cluster does not
			// go to whatever engine is left while its own come back.
			if n.reg.Model != o.model || n.reg.BlockSize != o.blockSize || now.Sub(n.downAt) > modelStickiness {
				continue
			}
		}
		if o.cfg.ServedModel != "" && n.reg.Model != o.cfg.ServedModel {
			continue
		}
		k := key{n.reg.Model, n.reg.BlockSize}
		count[k]++
		if t, ok := first[k]; !ok || n.reg.StartedAt.Before(t) {
			first[k] = n.reg.StartedAt
		}
	}
	cur := key{o.model, o.blockSize}
	best, bestN := cur, count[cur]
	for k, c := range count {
		// More engines win; on a tie the model served now stays, and
		// between others the one whose engine started first.
		if c > bestN || (c == bestN && best != cur && first[k].Before(first[best])) {
			best, bestN = k, c
		}
	}
	if o.cfg.ServedModel != "" && best.model == "" {
		best.model = o.cfg.ServedModel // no engine of it yet: the name stands
	}
	if best == cur {
		return
	}
	if o.model != "" {
		o.log.Warn("the cluster's model follows its engines", "was", o.model, "now", best.model, "engines", bestN)
	}
	o.model, o.blockSize = best.model, best.bs
	for id, n := range o.c.nodes {
		if n.state != StateDown && n.state != StateRejected && (n.reg.Model != o.model || n.reg.BlockSize != o.blockSize) {
			n.state = StateRejected
			n.reason = rejection(n.reg, o.model, o.blockSize)
			o.c.dir.DropNode(n.dir)
			o.c.changed(id)
		}
	}
	if o.nc != nil {
		go o.nc.Publish(protocol.SubjectAnnounce, nil) // the rejected ones of the model chosen register again
	}
}

// rejection says why an engine of reg is not one the cluster serves.
func rejection(reg protocol.Registration, model string, bs int) string {
	if bs == 0 {
		return fmt.Sprintf("serves %s; this cluster serves %s", reg.Model, model)
	}
	return fmt.Sprintf("serves %s with %d-token blocks; this cluster serves %s with %d-token blocks", reg.Model, reg.BlockSize, model, bs)
}

// tellRegistration tells engine id, when this orchestrator leads, whether
// it was rejected and why ("": accepted), so that it says so in its own
// log (and exits, if it was told to when rejected).
func (o *Orchestrator) tellRegistration(id, reason string) {
	if !o.leading() || o.nc == nil {
		return
	}
	go func() {
		if _, err := o.control(id, protocol.ControlRequest{Op: protocol.OpRegistered, Reason: reason}); err != nil {
			o.log.Debug("registration verdict not delivered", "id", id, "err", err)
		}
	}()
}

// markDown takes a node out of routing and its KV out of the directory;
// silent says it went silent rather than said goodbye, so that its next
// heartbeat asks it to register again.
func (o *Orchestrator) markDown(id, why string, silent bool) {
	o.c.mu.Lock()
	n := o.c.nodes[id]
	if n == nil || n.state == StateDown {
		o.c.mu.Unlock()
		return
	}
	if n.state == StateRejected {
		// Gone too: it no longer counts among the engines present (the
		// model the cluster serves follows those).
		n.state, n.reason, n.silent, n.downAt = StateDown, "rejected, then "+why, silent, time.Now()
		o.c.changed(id)
		o.electModelLocked()
		o.c.mu.Unlock()
		return
	}
	n.state, n.reason, n.silent, n.downAt = StateDown, why, silent, time.Now()
	dropped := o.c.dir.DropNode(n.dir)
	o.c.changed(id)
	o.electModelLocked() // the last engine of the model served may have gone
	o.c.mu.Unlock()
	o.log.Warn("engine down", "id", id, "why", why, "kv_replicas_dropped", dropped)
}

// watchHeartbeats marks nodes down when they miss their heartbeats.
func (o *Orchestrator) watchHeartbeats(ctx context.Context) {
	t := time.NewTicker(protocol.HeartbeatInterval / 4)
	defer t.Stop()
	var lastExpire time.Time // idle branches are ended every few seconds
	lastTick := time.Now()
	var held time.Time // since when silence has not been judged
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		limit := time.Duration(o.cfg.MissedHeartbeats) * protocol.HeartbeatInterval
		now := time.Now()
		gap := now.Sub(lastTick)
		lastTick = now
		if !o.mayJudgeSilence(gap) {
			if held.IsZero() {
				held = now
			}
			// A backlog that never clears is an orchestrator too slow to
			// keep up at all: judge after a while anyway (a node wrongly
			// marked down is asked back by its next heartbeat).
			if now.Sub(held) < 3*limit {
				continue
			}
		}
		held = time.Time{}
		var late []string
		o.c.mu.Lock()
		for id, n := range o.c.nodes {
			if n.state != StateDown && silentSince(n.lastSeen, o.live.last(id), now, limit) {
				late = append(late, id)
			}
		}
		o.c.mu.Unlock()
		for _, id := range late {
			o.markDown(id, fmt.Sprintf("no heartbeat for %v", limit), true)
		}
		if now := time.Now(); now.Sub(lastExpire) >= 5*time.Second {
			lastExpire = now
			o.expireBranches(now)
		}
	}
}

// mayJudgeSilence reports whether the orchestrator itself kept up well
// enough to call an engine silent: not when its own watcher woke late
// (gap since its last tick; the process was short of CPU, or stopped) nor
// while heartbeats wait unread in its subscription. Those are its own
// slowness, not the engines', and marking nodes down for them turns an
// overloaded orchestrator into an outage.
func (o *Orchestrator) mayJudgeSilence(gap time.Duration) bool {
	if gap > protocol.HeartbeatInterval {
		return false
	}
	if o.hbSub != nil {
		if pending, _, err := o.hbSub.Pending(); err == nil && pending > 0 {
			return false
		}
	}
	return true
}

// control sends a control request to an engine and waits for its reply.
func (o *Orchestrator) control(id string, req protocol.ControlRequest) (protocol.ControlReply, error) {
	var rep protocol.ControlReply
	if protocol.RoleOp(req.Op) {
		// Role commands carry the leader's term; an orchestrator that no
		// longer leads sends none.
		f, ok := o.leads()
		if !ok {
			return rep, fmt.Errorf("%s on %s: %w", req.Op, id, ErrNotLeader)
		}
		req.Fence = f
	}
	b, _ := json.Marshal(req)
	msg, err := o.nc.Request(protocol.ControlSubject(id), b, 10*time.Second)
	if err != nil {
		o.log.Warn("control request failed", "id", id, "op", req.Op, "err", err)
		return rep, fmt.Errorf("%s on %s: %w", req.Op, id, err)
	}
	if err := json.Unmarshal(msg.Data, &rep); err != nil {
		return rep, fmt.Errorf("%s on %s: bad reply: %w", req.Op, id, err)
	}
	if !rep.OK {
		return rep, fmt.Errorf("%s on %s: %s", req.Op, id, rep.Error)
	}
	return rep, nil
}

// truncate is b as a string for a log line, cut after n bytes.
func truncate(b []byte, n int) string {
	if len(b) <= n {
		return string(b)
	}
	return fmt.Sprintf("%s... (%d bytes)", b[:n], len(b))
}
