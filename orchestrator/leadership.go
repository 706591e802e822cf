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
	Node    controlapi.Node `json:"node"`
	Error   string          `json:"error,omitempty"`
	Unknown bool            `json:"unknown,omitempty"` // no such node
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
		return controlapi.Node{}, fmt.Errorf("%w (%v)", ErrNotLeader, err)
	}
	var rep roleReply
	if err := json.Unmarshal(msg.Data, &rep); err != nil {
		return controlapi.Node{}, fmt.Errorf("the leader's answer: %w", err)
	}
	switch {
	case rep.Unknown:
		return controlapi.Node{}, ErrUnknownNode(req.Node)
	case rep.Error != "":
		return controlapi.Node{}, errors.New(rep.Error)
	}
	return rep.Node, nil
}
