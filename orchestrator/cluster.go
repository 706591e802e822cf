package orchestrator

import (
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/evolvellm/evolve/controlapi"
	"github.com/evolvellm/evolve/kv"
	"github.com/evolvellm/evolve/protocol"
	"github.com/evolvellm/evolve/roles"
)

// Node states.
const (
	StateServing   = "serving"
	StateSwitching = "switching" // draining its old role, then flipping
	StateDraining  = "draining"  // its engine takes no new requests (it is stopping)
	StateDown      = "down"
	StateRejected  = "rejected" // registered, but cannot serve this cluster (other model or block size)
)

// Node modes.
const (
	ModeAuto   = "auto"   // the planner may move it
	ModePinned = "pinned" // only the operator may
)

// node is the orchestrator's record of one engine.
type node struct {
	reg      protocol.Registration
	hb       protocol.Heartbeat
	dir      kv.NodeID
	role     roles.Role
	mode     string
	state    string
	lastSeen time.Time
	downAt   time.Time // when it was last marked down
	inFlight int
	sw       *controlapi.Switch
	// handingOver: the node's engine hands its decodes to peers (a
	// switch away from decode); new decode legs go elsewhere.
	handingOver bool
	history     []roles.Change
	// Answers it was streaming when it failed, since it last joined, and
	// of those the ones no node could continue (NodeStatus).
	interrupted, lost int
	// failedAt is when the router last saw the node fail a request (a
	// stream cut, a tokenize call refused): until its agent reports it
	// down, calls that may go anywhere go elsewhere first.
	failedAt time.Time
	resyncAt time.Time // when a resync was last asked for
	// clearedAt is when the node's events last began a resync (an
	// AllCleared), whoever asked for it: another orchestrator's serves
	// this one's directory too.
	clearedAt time.Time
	reason    string
	// silent: the node is down because it went silent, not because it
	// said goodbye; its next heartbeat asks it to register again.
	silent bool
	// Copies of blocks a live branch referenced that the node evicted,
	// per tier, and of those the last copy anywhere (context lost).
	refEvicted [2]int64
	refLost    int64
	// Tokens processed, as the engine's pass records arrive (wall time).
	tokens []tokenSample
	passes uint64 // pass records received since its engine started
}

type tokenSample struct {
	at time.Time
	n  int
}

// tokenWindow is how far back a node's tokens per second look.
const tokenWindow = 10 * time.Second

// noteTokens records n tokens processed at now and forgets old samples.
func (n *node) noteTokens(now time.Time, tokens int) {
	n.tokens = append(n.tokens, tokenSample{now, tokens})
	k := 0
	for k < len(n.tokens) && now.Sub(n.tokens[k].at) > tokenWindow {
		k++
	}
	n.tokens = append(n.tokens[:0], n.tokens[k:]...)
}

// tokensPerSec is the node's tokens per second of model time over the
// last window (a simulated engine at speedup x does x times the work per
// wall second).
func (n *node) tokensPerSec(now time.Time) float64 {
	sum := 0
	for _, s := range n.tokens {
		if now.Sub(s.at) <= tokenWindow {
			sum += s.n
		}
	}
	speedup := n.reg.Speedup
	if speedup <= 0 {
		speedup = 1
	}
	return float64(sum) / tokenWindow.Seconds() / speedup
}

// cluster is the shared state, guarded by mu.
type cluster struct {
	mu    sync.Mutex
	nodes map[string]*node
	dir   *kv.Directory
	gen   uint64 // bumped on every change the watch stream reports
	subs  map[chan watchEvent]struct{}
	// Agent branches and the blocks they reference; blocks stored lately
	// (for lost KV reuse, with those the directory holds).
	branches *kv.Branches
	ever     *kv.RecentSet
	// pendingHints: hints for blocks no engine was known to hold when
	// their reference count changed; sent when a store event names one.
	pendingHints *kv.RecentTable[int8]
}

// newCluster is an empty cluster whose branches end idle past idle
// (0: BranchTTL).
func newCluster(idle time.Duration) *cluster {
	if idle <= 0 {
		idle = BranchTTL
	}
	c := &cluster{nodes: map[string]*node{}, dir: kv.NewDirectory(), subs: map[chan watchEvent]struct{}{},
		branches: kv.NewBranches(idle), ever: kv.NewRecentSet(everRecent), pendingHints: kv.NewRecentTable[int8](pendingRecent)}
	// The directory counts each node's referenced copies as they change
	// (hintsLocked marks the blocks whose references crossed zero).
	c.dir.SetReferencedSource(func(h kv.BlockHash) bool { return c.branches.Refs(h) > 0 })
	return c
}

// status is a snapshot of the node that shares no memory with it: the
// watch stream marshals it after the lock is released, while a switch
// goes on changing n.sw and n.history.
func (n *node) status(id string, d *kv.Directory) controlapi.Node {
	g, h := d.NodeReplicas(n.dir)
	var sw *controlapi.Switch
	if n.sw != nil {
		sw = ptr(*n.sw)
	}
	st := controlapi.Node{
		ID: id, Role: n.role.String(), Mode: n.mode, State: n.state, Address: n.reg.URL, Model: n.reg.Model,
		Profile: n.reg.Profile, Waiting: n.hb.Waiting, Running: n.hb.Running, InFlight: n.inFlight,
		GPUKVUsage: n.hb.GPUKVUsage, HostKVUsage: n.hb.HostKVUsage, GPUBlocks: g, HostBlocks: h, TokensPerSec: n.tokensPerSec(time.Now()),
		LastSeen: n.lastSeen, Switch: sw, History: slices.Clone(n.history), Reason: n.reason,
		Interrupted: n.interrupted, Lost: n.lost, TokenRequired: n.reg.TokenRequired, Passes: n.passes,
		KVBlocksLeftOut: n.hb.KVBlocksLeftOut, KVLeftOutWhy: n.hb.KVLeftOutWhy,
	}
	if n.state == StateDown {
		// Its last heartbeat's load is no longer true (a killed engine's
		// requests failed with it), and nothing is routed to it.
		st.Waiting, st.Running, st.GPUKVUsage, st.HostKVUsage, st.TokensPerSec = 0, 0, 0, 0, 0
	}
	return st
}

// statuses lists every node, sorted by id. Call with mu held.
func (c *cluster) statuses() []controlapi.Node {
	out := make([]controlapi.Node, 0, len(c.nodes))
	for id, n := range c.nodes {
		out = append(out, n.status(id, c.dir))
	}
	sort.Slice(out, func(i, j int) bool { return controlapi.CompareIDs(out[i].ID, out[j].ID) < 0 })
	return out
}

// changed records a change to node id and tells the watchers. Call with mu
// held.
func (c *cluster) changed(id string) {
	c.gen++
	n := c.nodes[id]
	if n == nil {
		return
	}
	ev := watchEvent{Type: "node", Generation: c.gen, Node: ptr(n.status(id, c.dir))}
	for ch := range c.subs {
		select {
		case ch <- ev:
		default: // a slow watcher is dropped, never waited for
			delete(c.subs, ch)
			close(ch)
		}
	}
}

func ptr[T any](v T) *T { return &v }

// watchEvent is one message of the watch stream.
type watchEvent struct {
	Type       string            `json:"type"` // snapshot, node
	Generation uint64            `json:"generation"`
	Nodes      []controlapi.Node `json:"nodes,omitempty"`
	Node       *controlapi.Node  `json:"node,omitempty"`
}
