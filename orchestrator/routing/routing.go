// Package routing holds the router's decision code: given a request (its
// block chain and where the cluster holds it) and a read-only view of the
// nodes, pick the node that prefills and the node that decodes. It is pure:
// no clock reads, no I/O; the orchestrator and the simulator call it alike.
//
// Policies:
//   - evolve: least estimated time to first token, counting queued prefill
//     work and this request's uncached part at the cost of where each block
//     is (GPU free, own host at host bandwidth, a peer's host at network
//     bandwidth, else recompute); fetches from peers start at once; decode by
//     load, preferring the node that holds the context; short uncached parts
//     prefill on the decode node.
//   - dynamo: NVIDIA Dynamo's KV router cost function, with its bookkeeping
//     (see docs/baselines.md).
//   - round-robin: for reference.
package routing

import (
	"errors"
	"fmt"
	"time"

	"github.com/evolvellm/evolve/kv"
	"github.com/evolvellm/evolve/roles"
)

// Node is one engine as the router sees it.
type Node struct {
	ID      string
	Dir     kv.NodeID  // the node's id in the KV directory
	Role    roles.Role // a node that takes both is routed as a decode node
	Serving bool       // false while down or draining away from its role

	// Load, from heartbeats and the router's own bookkeeping.
	Running          int
	Waiting          int
	MaxSeqs          int
	MaxBatchedTokens int // the engine's max_num_batched_tokens; 0 if unknown
	GPUBlocks        int // KV capacity
	GPUBlocksUse     int // blocks in use by sequences

	// Costs, learned or from the profile.
	PrefillSecPerToken float64 // marginal prefill time per uncached token
	HostSecPerBlock    float64 // loading one block from its own host tier
	NetSecPerBlock     float64 // pulling one block from a peer

	// SelfManagedKV: the node's engine keeps its own KV tiers (vLLM): it
	// neither fetches blocks from peers nor serves them to evolve's fetches.
	SelfManagedKV bool
}

// View is the cluster as the router sees it at one moment.
type View struct {
	Nodes     []Node
	BlockSize int
}

// Request is what the router knows of a request.
type Request struct {
	ID        string
	Tokens    int            // prompt length
	Chain     []kv.BlockHash // full-block hashes of the prompt
	Match     *kv.Match      // the directory's answer for Chain
	MaxTokens int
	// ExpectedOutput is the output length the agent expects (Dynamo's
	// agent hint osl), in tokens; 0: not said, MaxTokens bounds it.
	ExpectedOutput int
}

// output is the output the request is expected to write: what its agent
// said, within MaxTokens.
func (r *Request) output() int {
	if r.ExpectedOutput > 0 && (r.MaxTokens <= 0 || r.ExpectedOutput < r.MaxTokens) {
		return r.ExpectedOutput
	}
	return r.MaxTokens
}

// Fetch asks node To to pull blocks [From, End) of the request's chain from
// node Src while the request waits in To's queue.
type Fetch struct {
	To, Src    string
	From, End  int
	SrcTier    kv.Tier
	EstSeconds float64
}

// Decision is where a request goes.
type Decision struct {
	Prefill string // node that prefills
	Decode  string // node that decodes; equal to Prefill when not disaggregated
	// Disaggregated: prefill on Prefill with do_remote_decode, then decode on
	// Decode with the returned kv_transfer_params.
	Disaggregated bool
	Fetches       []Fetch
	// EstTTFT is the policy's estimate of time to first token, and
	// ComputeTokens of the prompt tokens the prefill will compute after
	// cache hits and fetches (evolve only).
	EstTTFT       time.Duration
	ComputeTokens int
	Reason        string
}

// ErrNoNode is returned when no serving node can take the request.
var ErrNoNode = errors.New("no serving engine can take the request")

// Policy decides where requests go. Route is called once per request;
// FirstToken and Finished let stateful policies keep their bookkeeping.
type Policy interface {
	Name() string
	Route(now time.Time, r *Request, v *View) (Decision, error)
	FirstToken(now time.Time, reqID string)
	Finished(now time.Time, reqID string)
}

// Queuer is a policy that holds new requests at the router while every
// engine is busy (Dynamo's router queue): the caller asks Busy before
// Route, keeps the request in arrival order while it is true, and asks
// again whenever load leaves an engine (a first token, a finish).
type Queuer interface {
	Busy(v *View) bool
}

// New returns the named policy: evolve, dynamo or round-robin.
func New(name string) (Policy, error) {
	switch name {
	case "evolve":
		return NewEvolve(EvolveConfig{}), nil
	case "dynamo":
		return NewDynamo(), nil
	case "round-robin":
		return &RoundRobin{}, nil
	}
	return nil, fmt.Errorf("unknown routing policy %q (want evolve, dynamo or round-robin)", name)
}

// Names lists the policies New knows.
func Names() []string { return []string{"evolve", "dynamo", "round-robin"} }

func serving(v *View, role roles.Role) []*Node {
	var out []*Node
	for i := range v.Nodes {
		if n := &v.Nodes[i]; n.Serving && (n.Role == role || role == roles.Decode && n.Role == roles.Both) {
			out = append(out, n)
		}
	}
	return out
}

// candidates returns the serving prefill and decode nodes. With no prefill
// node, decode nodes serve whole requests, and the reverse.
func candidates(v *View) (ps, ds []*Node, err error) {
	ps, ds = serving(v, roles.Prefill), serving(v, roles.Decode)
	switch {
	case len(ps) == 0 && len(ds) == 0:
		return nil, nil, ErrNoNode
	case len(ps) == 0:
		ps = ds
	case len(ds) == 0:
		ds = ps
	}
	return ps, ds, nil
}
