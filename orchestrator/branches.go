package orchestrator

import (
	"fmt"
	"net/http"
	"slices"
	"sort"
	"time"

	"github.com/evolvellm/evolve/controlapi"
	"github.com/evolvellm/evolve/kv"
	"github.com/evolvellm/evolve/openaiapi"
	"github.com/evolvellm/evolve/protocol"
)

// Agent-aware KV management, live: the front door tells the branch tracker
// (kv.Branches, guarded by the cluster lock with the directory) which
// session and branch every request belongs to; when a block's count of
// live branches referencing it crosses zero, the engines holding it get an
// eviction hint: copies no live branch references go first (see sim's
// kvrefs.go for the measurements behind the choice of priorities).

// Eviction priorities sent to engines (0 clears a hint).
const (
	hintReferenced   int8 = 0
	hintUnreferenced int8 = -1
)

// BranchTTL is how long a branch may stay idle before it ends.
const BranchTTL = 10 * time.Minute

// agentOf reads what the request says of its agent: its identity in any
// of the forms agents send (protocol.AgentOf), and its hints.
func agentOf(r *http.Request, p *openaiapi.Parsed) protocol.Agent {
	return protocol.AgentOf(r.Header, protocol.AgentBody{Metadata: p.Req.Metadata, Nvext: p.Req.Nvext})
}

// branchBegin records a request's turn: the session (the root of the
// agent's tree), the agent and the branch it belongs to (named by the
// agent, or inferred).
func (o *Orchestrator) branchBegin(id kv.Identity, chain []kv.BlockHash) kv.Turn {
	if id.Session == "" {
		return kv.Turn{}
	}
	o.c.mu.Lock()
	turn := o.c.branches.Begin(time.Now(), id, chain)
	o.sendHints(o.hintsLocked())
	o.c.mu.Unlock()
	return turn
}

// branchFinish records that a request of the turn's branch ended; final
// (the agent said so) ends the turn's agent: a sub-agent's branches, or
// for the root agent the whole session.
func (o *Orchestrator) branchFinish(turn kv.Turn, final bool) {
	if turn.Session == "" {
		return
	}
	o.c.mu.Lock()
	o.c.branches.Finish(time.Now(), turn.Session, turn.Branch)
	if final && o.c.branches.EndAgent(turn.Session, turn.Agent) > 0 {
		o.sendHints(o.hintsLocked())
	}
	o.c.mu.Unlock()
}

// hintsLocked turns the tracker's changes into hints per node. Call with
// mu held.
func (o *Orchestrator) hintsLocked() map[string][]protocol.Hint {
	changes := o.c.branches.Changes()
	if len(changes) == 0 {
		return nil
	}
	// Holders are engines with live replicas: a node that went down left
	// the directory, a rejected one never fed it. The directory names its
	// nodes by engine id.
	out := map[string][]protocol.Hint{}
	var holders []kv.Replica
	// Deepest first: an engine moves a re-prioritised block to the
	// recent end of its list, and a chain's tail must stay ahead of its
	// prefix for eviction.
	for _, h := range slices.Backward(changes) {
		prio := hintUnreferenced
		if o.c.branches.Refs(h) > 0 {
			prio = hintReferenced
		}
		o.c.dir.SetReferenced(h, prio == hintReferenced)
		holders = o.c.dir.Holders(h, holders[:0])
		if len(holders) == 0 && prio != hintReferenced {
			// Its store events have not arrived yet: hint it when they do.
			o.c.pendingHints.Put(h, prio)
		}
		seen := kv.NodeID(0xffff)
		for _, rep := range holders {
			if rep.Node() != seen { // a node's GPU and host copies: one hint
				id := o.c.dir.NodeName(rep.Node())
				if n := o.c.nodes[id]; n != nil && n.reg.SelfManagedKV {
					continue // its engine evicts by its own policy
				}
				out[id] = append(out[id], protocol.Hint{Hash: h, Priority: prio})
				seen = rep.Node()
			}
		}
	}
	return out
}

// sendHints sends each node its hints in the background; hintsPending
// counts them until the engine answers (it has applied them then). The
// caller holds c.mu, so that the count has the hints before anyone sees
// the state they follow from.
func (o *Orchestrator) sendHints(hints map[string][]protocol.Hint) {
	for id, hs := range hints {
		o.hintsPending.Add(1)
		go func() {
			defer o.hintsPending.Add(-1)
			if _, err := o.control(id, protocol.ControlRequest{Op: protocol.OpHints, Hints: hs}); err != nil {
				o.met.hints.WithLabelValues("failed").Inc()
				o.log.Debug("eviction hints not delivered", "id", id, "err", err)
				return
			}
			o.met.hints.WithLabelValues("delivered").Inc()
		}()
	}
}

// expireBranches ends branches idle past the TTL.
func (o *Orchestrator) expireBranches(now time.Time) {
	o.c.mu.Lock()
	if o.c.branches.Expire(now) > 0 {
		o.sendHints(o.hintsLocked())
	}
	o.c.mu.Unlock()
}

// serveEndSession ends a session (DELETE /v1/sessions/{s}) or one of its
// branches (DELETE /v1/sessions/{s}/branches/{b}): the agent says it will
// not come back, so its context goes first when memory is needed.
func (o *Orchestrator) serveEndSession(w http.ResponseWriter, r *http.Request) {
	s, b := r.PathValue("session"), r.PathValue("branch")
	o.c.mu.Lock()
	n := o.c.branches.End(s, b)
	o.sendHints(o.hintsLocked())
	o.c.mu.Unlock()
	if n == 0 {
		what := "session " + s
		if b != "" {
			what = fmt.Sprintf("branch %s of session %s", b, s)
		}
		(&openaiapi.Error{Status: 404, Type: "invalid_request_error", Code: "not_found",
			Message: "no live " + what}).Write(w)
		return
	}
	openaiapi.WriteJSON(w, 200, map[string]any{"session": s, "branch": b, "branches_ended": n})
}

// Residency is where a branch's blocks live.
type Residency struct {
	Node string `json:"node"`
	GPU  int    `json:"gpu_blocks"`
	Host int    `json:"host_blocks"`
}

// BranchStatus is a branch as the control API reports it.
type BranchStatus struct {
	kv.BranchInfo
	Residency []Residency `json:"residency"`
}

// Branches lists the agent branches of a session (all when empty), with
// where their blocks live.
func (o *Orchestrator) Branches(session string) []BranchStatus {
	o.c.mu.Lock()
	defer o.c.mu.Unlock()
	out := []BranchStatus{}
	for _, b := range o.c.branches.List(session) {
		st := BranchStatus{BranchInfo: b, Residency: []Residency{}}
		for _, c := range o.c.dir.Residency(b.Chain) {
			st.Residency = append(st.Residency, Residency{Node: o.c.dir.NodeName(c.Node), GPU: c.GPU, Host: c.Host})
		}
		sort.Slice(st.Residency, func(i, j int) bool { return controlapi.CompareIDs(st.Residency[i].Node, st.Residency[j].Node) < 0 })
		out = append(out, st)
	}
	return out
}
