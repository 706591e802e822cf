package orchestrator

import (
	"errors"
	"net"
	"time"
)

// A node that failed a request lately is a suspect: a dead engine stays
// listed as serving until its agent reports it down (up to 15 s after a
// crash), looks idle and may hold most of a prompt, so for suspectFor
// routing leaves it out while another node serves, and tokenizing and
// continuing an answer try it last.

// suspectFor is how long a node that failed a request stays a suspect.
const suspectFor = 30 * time.Second

// suspect says whether the node failed a request within suspectFor of now.
func (n *node) suspect(now time.Time) bool { return now.Sub(n.failedAt) < suspectFor }

// suspects are the serving nodes that are suspects, for routing to leave
// out; none when every serving node is one, so that requests still go
// somewhere.
func (o *Orchestrator) suspects() map[string]bool {
	o.c.mu.Lock()
	defer o.c.mu.Unlock()
	out := map[string]bool{}
	now, serving := time.Now(), 0
	for id, n := range o.c.nodes {
		if n.state != StateServing {
			continue
		}
		serving++
		if n.suspect(now) {
			out[id] = true
		}
	}
	if len(out) == serving {
		return map[string]bool{}
	}
	return out
}

// suspectNode notes that node id failed a request.
func (o *Orchestrator) suspectNode(id string) {
	o.c.mu.Lock()
	defer o.c.mu.Unlock()
	if n := o.c.nodes[id]; n != nil {
		n.failedAt = time.Now()
	}
}

// suspectURL notes that the node at url failed a call.
func (o *Orchestrator) suspectURL(url string) {
	o.c.mu.Lock()
	defer o.c.mu.Unlock()
	for _, n := range o.c.nodes {
		if n.reg.URL == url {
			n.failedAt = time.Now()
		}
	}
}

// unreachable says whether err is an engine that could not be reached
// (refused, reset, timed out), rather than one that answered.
func unreachable(err error) bool {
	var op *net.OpError
	return errors.As(err, &op)
}

// lastIfSuspect ranks a suspect after every other node, whatever it
// holds (held ranks the others).
func lastIfSuspect(held func(*node) int) func(*node) int {
	now := time.Now()
	return func(n *node) int {
		if n.suspect(now) {
			return -1
		}
		return held(n)
	}
}
