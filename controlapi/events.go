package controlapi

import (
	"fmt"
	"time"
)

// Event is one thing that happened to a node, in words an operator reads:
// it joined, went down or came back, began a role switch or ended one,
// lost answers it was streaming. The orchestrator records them as it sees
// its nodes change, keeps a bounded history, and serves it to each new
// watcher (the watch stream's snapshot) and at /api/v1/events.
type Event struct {
	Time time.Time `json:"time"`
	Kind string    `json:"kind"` // up, down, switch, lost
	Node string    `json:"node,omitempty"`
	Text string    `json:"text"`
}

// Events is the control API's record of events: what it keeps, oldest
// first, and when the record begins (the orchestrator's start, or the
// time of the newest event it has forgotten since).
type Events struct {
	Since  time.Time `json:"since"`
	Events []Event   `json:"events"`
}

// NodeEvents are the events that node n's change from old implies (old
// nil: n is seen for the first time), at now. A role change is dated by
// the node's own history, a switch by its start, when they say.
func NodeEvents(old, n *Node, now time.Time) []Event {
	var out []Event
	add := func(at time.Time, kind, text string) {
		if at.IsZero() {
			at = now
		}
		out = append(out, Event{Time: at, Kind: kind, Node: n.ID, Text: text})
	}
	switch {
	case old == nil:
		if n.State != "" {
			add(now, "up", fmt.Sprintf("%s joined as %s (%s)", n.ID, n.Role, n.State))
		}
	case old.State != n.State && n.State == "down":
		text := fmt.Sprintf("%s is down: %s", n.ID, n.Reason)
		switch {
		case n.Interrupted == 1:
			text += "; the answer it was streaming goes on on another node"
		case n.Interrupted > 1:
			text += fmt.Sprintf("; the %d answers it was streaming go on on other nodes", n.Interrupted)
		}
		add(now, "down", text)
	case old.State == "down" && n.State != "down":
		add(now, "up", fmt.Sprintf("%s is back as %s", n.ID, n.Role))
	case old.Switch == nil && n.Switch != nil:
		add(n.Switch.Started, "switch", fmt.Sprintf("%s switching %s -> %s", n.ID, n.Role, n.Switch.To))
	case old.Role != n.Role:
		reason, at := "", time.Time{}
		if len(n.History) > 0 {
			last := n.History[len(n.History)-1]
			reason, at = last.Reason, last.Time
			switch {
			case last.HandedOver == 1:
				reason += "; handed 1 answer over"
			case last.HandedOver > 1:
				reason += fmt.Sprintf("; handed %d answers over", last.HandedOver)
			}
		}
		add(at, "switch", fmt.Sprintf("%s is now %s (%s)", n.ID, n.Role, reason))
	}
	if old != nil && n.Lost > old.Lost {
		add(now, "lost", fmt.Sprintf("%s: %d of the answers it was streaming when it failed could not go on on another node (%d so far)", n.ID, n.Lost-old.Lost, n.Lost))
	}
	return out
}
