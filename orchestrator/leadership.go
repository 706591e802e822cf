package orchestrator

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/evolvellm/evolve/controlapi"
	"github.com/evolvellm/evolve/protocol"
	"github.com/evolvellm/evolve/roles"
	"github.com/nats-io/nats.go"
)

// Several orchestrators on one event plane each route agents' requests,
// but only the planner's leader (see lease.go) changes roles: its planner
// moves nodes, it runs switches, and an operator's role change made on
// any orchestrator's control API is sent to it (subjectRoleRequests).
// The others follow the roles engines report.

// subjectRoleRequests carries operators' role changes to the leader.
const subjectRoleRequests = "evolve.orchestrator.role"

// ErrNotLeader is a role change asked of an orchestrator that does not
// lead while no leader answers for it.
var ErrNotLeader = errors.New("no orchestrator leads the planner now (its lease moves within 5 s of a leader's loss): try again")

// leads says whether this orchestrator changes roles now, and the fence
// its role commands carry (nil alone, without a lease).
func (o *Orchestrator) leads() (*protocol.Fence, bool) {
	if o.lease == nil {
		return nil, true
	}
	return o.lease.fence()
}

// leading says whether this orchestrator changes roles now.
func (o *Orchestrator) leading() bool {
	_, ok := o.leads()
	return ok
}

// followRole takes the role an engine reports as its node's, on an
// orchestrator that does not lead (the leader switched it). Call with
// c.mu held.
func (o *Orchestrator) followRole(id string, n *node, reported string) {
	if n.sw != nil || o.leading() {
		return
	}
	r, ok := parseRole(reported)
	if !ok || r == n.role {
		return
	}
	n.history = appendHistory(n.history, roles.Change{Time: time.Now(), From: n.role.String(), To: r.String(), Reason: "switched by the planner's leader"})
	n.role = r
	o.c.changed(id)
}

// roleRequest is an operator's role change sent to the leader.
type roleRequest struct {
	Node   string `json:"node"`
	Unpin  bool   `json:"unpin,omitempty"` // else set Role
	Role   string `json:"role,omitempty"`
	Pin    bool   `json:"pin,omitempty"`
	Reason string `json:"reason,omitempty"`
}

// roleReply is the leader's answer: the node's status, or why not.
type roleReply struct {
	Node      controlapi.Node `json:"node"`
	Error     string          `json:"error,omitempty"`
	Unknown   bool            `json:"unknown,omitempty"`    // no such node
	NotLeader bool            `json:"not_leader,omitempty"` // it lost the lease meanwhile
	NotStored bool            `json:"not_stored,omitempty"` // the store refused it: nothing changed
}

// serveRoleRequests answers operators' role changes while leading.
func (o *Orchestrator) serveRoleRequests() error {
	sub, err := o.nc.Subscribe(subjectRoleRequests, func(m *nats.Msg) {
		if !o.leading() {
			return // the leader answers; a request nobody answers times out
		}
		var req roleRequest
		var rep roleReply
		if err := json.Unmarshal(m.Data, &req); err != nil {
			rep.Error = fmt.Sprintf("malformed role request: %v", err)
		} else {
			var err error
			if req.Unpin {
				rep.Node, err = o.Unpin(req.Node)
			} else {
				rep.Node, err = o.SetRole(req.Node, req.Role, req.Pin, req.Reason)
			}
			var unknown ErrUnknownNode
			rep.Unknown = errors.As(err, &unknown)
			rep.NotLeader = errors.Is(err, ErrNotLeader)
			rep.NotStored = errors.As(err, new(*NotStoredError))
			if err != nil {
				rep.Error = err.Error()
			}
		}
		b, _ := json.Marshal(rep)
		m.Respond(b)
	})
	if err != nil {
		return fmt.Errorf("subscribe %s: %w", subjectRoleRequests, err)
	}
	o.subs = append(o.subs, sub)
	return nil
}

// askLeader sends an operator's role change to the leader.
func (o *Orchestrator) askLeader(req roleRequest) (controlapi.Node, error) {
	b, _ := json.Marshal(req)
	msg, err := o.nc.Request(subjectRoleRequests, b, 5*time.Second)
	if err != nil {
		// The operator gets what to do; the log keeps the cause.
		o.log.Warn("role change not sent to the planner's leader", "node", req.Node, "err", err)
		return controlapi.Node{}, ErrNotLeader
	}
	var rep roleReply
	if err := json.Unmarshal(msg.Data, &rep); err != nil {
		o.log.Warn("the planner leader's answer to a role change is unreadable", "node", req.Node, "err", err)
		return controlapi.Node{}, fmt.Errorf("the planner's leader answered the role change unreadably; see this orchestrator's log, and check that every orchestrator runs the same evolve version")
	}
	switch {
	case rep.Unknown:
		return controlapi.Node{}, ErrUnknownNode(req.Node)
	case rep.NotLeader:
		o.log.Warn("the planner's leader lost its lease while changing a role", "node", req.Node, "err", rep.Error)
		return controlapi.Node{}, ErrNotLeader
	case rep.NotStored:
		return controlapi.Node{}, &NotStoredError{Err: errors.New(rep.Error)} // the leader's words
	case rep.Error != "":
		return controlapi.Node{}, errors.New(rep.Error)
	}
	return rep.Node, nil
}

// subjectSwitches carries the leader's role switches as they go, so that
// every orchestrator shows them and routes around a switching node.
const subjectSwitches = "evolve.orchestrator.switch"

// switchEvent is a step of a role switch the leader runs.
type switchEvent struct {
	By     string `json:"by"` // the leader's name
	Node   string `json:"node"`
	To     string `json:"to"`
	Phase  string `json:"phase"`
	Reason string `json:"reason,omitempty"`
	// Done: the switch ended, to To unless Failed says why not.
	Done       bool   `json:"done,omitempty"`
	Failed     string `json:"failed,omitempty"`
	HandedOver int    `json:"handed_over,omitempty"`
}

// announceSwitch tells the other orchestrators how node id's switch goes.
func (o *Orchestrator) announceSwitch(ev switchEvent) {
	if o.nc == nil {
		return
	}
	ev.By = o.cfg.Name
	b, _ := json.Marshal(ev)
	o.nc.Publish(subjectSwitches, b)
}

// followSwitches mirrors the leader's switches on this orchestrator.
func (o *Orchestrator) followSwitches() error {
	sub, err := o.nc.Subscribe(subjectSwitches, func(m *nats.Msg) {
		var ev switchEvent
		if json.Unmarshal(m.Data, &ev) != nil || ev.By == o.cfg.Name || o.leading() {
			return
		}
		to, ok := parseRole(ev.To)
		if !ok {
			return
		}
		o.c.mu.Lock()
		defer o.c.mu.Unlock()
		n := o.c.nodes[ev.Node]
		if n == nil || n.state == StateDown || n.state == StateRejected {
			return
		}
		if !ev.Done {
			if n.sw == nil {
				n.sw = &controlapi.Switch{To: ev.To, Started: time.Now()}
			}
			n.sw.Phase, n.sw.HandedOver = ev.Phase, ev.HandedOver
			n.state = StateSwitching
			o.c.changed(ev.Node)
			return
		}
		from := n.role
		n.sw = nil
		if n.state == StateSwitching {
			n.state = StateServing
		}
		if ev.Failed != "" {
			n.history = appendHistory(n.history, roles.Change{Time: time.Now(), From: from.String(), To: from.String(), Reason: "switch failed: " + ev.Failed})
		} else {
			n.role = to
			n.history = appendHistory(n.history, roles.Change{Time: time.Now(), From: from.String(), To: ev.To, Reason: ev.Reason, HandedOver: ev.HandedOver})
		}
		o.c.changed(ev.Node)
	})
	if err != nil {
		return fmt.Errorf("subscribe %s: %w", subjectSwitches, err)
	}
	o.subs = append(o.subs, sub)
	return nil
}
