// Package roles names what work an engine takes: prefill, decode or both.
// It is the one definition of a role that the engines, the router, the
// planner, the simulator and the wire protocol share; in JSON, YAML and on
// the command line a role is its name.
package roles

import (
	"fmt"
	"time"
)

// Role is what work an engine takes. Nothing restarts when it changes:
// sequences in flight finish where they are. The router routes every
// serving node as Prefill or Decode; an engine that takes both is routed
// as a decode node (it serves whole requests).
type Role uint8

// Roles. The zero value is Both, an engine that was not given one.
const (
	Both    Role = iota // prefill and decode: whole requests
	Prefill             // prefill only (remote-decode legs and whole requests)
	Decode              // decode: no remote-decode (prefill-only) legs
)

// String returns "both", "prefill" or "decode".
func (r Role) String() string {
	switch r {
	case Prefill:
		return "prefill"
	case Decode:
		return "decode"
	}
	return "both"
}

// Parse reads a role name: prefill (p), decode (d) or both (or empty).
func Parse(s string) (Role, error) {
	switch s {
	case "both", "":
		return Both, nil
	case "prefill", "p", "P":
		return Prefill, nil
	case "decode", "d", "D":
		return Decode, nil
	}
	return Both, fmt.Errorf("unknown role %q (want prefill, decode or both)", s)
}

// Other is the role a node switching away from r takes: decode for
// prefill, prefill for decode and both.
func (r Role) Other() Role {
	if r == Prefill {
		return Decode
	}
	return Prefill
}

// MarshalText writes the role's name.
func (r Role) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

// UnmarshalText reads a role's name (see Parse).
func (r *Role) UnmarshalText(b []byte) error {
	v, err := Parse(string(b))
	if err != nil {
		return err
	}
	*r = v
	return nil
}

// Change is one entry of a node's role history: a change of its role or
// of its state (From and To are role names, or states such as "down").
// Time is wall time live and modelled time in the simulator.
type Change struct {
	Time   time.Time `json:"time"`
	From   string    `json:"from"`
	To     string    `json:"to"`
	Reason string    `json:"reason"`
	// HandedOver: answers the node handed to peer decode nodes on the way.
	HandedOver int `json:"handed_over,omitempty"`
}
