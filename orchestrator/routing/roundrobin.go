package routing

import "time"

// RoundRobin sends prefills and decodes to the serving nodes of each role in
// turn, ignoring load and cache. For reference only.
type RoundRobin struct {
	p, d int
}

// Name is "round-robin".
func (*RoundRobin) Name() string { return "round-robin" }

// Route picks the next prefill node and the next decode node. With no
// prefill node it serves whole requests on decode nodes, and the reverse.
func (rr *RoundRobin) Route(_ time.Time, _ *Request, v *View) (Decision, error) {
	ps, ds, err := candidates(v)
	if err != nil {
		return Decision{}, err
	}
	p := ps[rr.p%len(ps)]
	d := ds[rr.d%len(ds)]
	rr.p++
	rr.d++
	return Decision{Prefill: p.ID, Decode: d.ID, Disaggregated: p.ID != d.ID, Reason: "round-robin"}, nil
}

// FirstToken does nothing.
func (*RoundRobin) FirstToken(time.Time, string) {}

// Finished does nothing.
func (*RoundRobin) Finished(time.Time, string) {}
