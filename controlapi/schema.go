package controlapi

import (
	"time"

	"github.com/evolvellm/evolve/roles"
)

// The control API's JSON, as its clients read it and as evolve sim --live
// writes it (the orchestrator's own types carry more fields under the
// same names).

// Node is a node as the control API reports it (the orchestrator's status
// of a node, and evolve sim --live's of a simulated engine). Field names
// are stable: scripts depend on them.
type Node struct {
	ID           string         `json:"id"`
	Role         string         `json:"role"`
	Mode         string         `json:"mode"`
	State        string         `json:"state"`
	Address      string         `json:"address"`
	Model        string         `json:"model,omitempty"`
	Profile      string         `json:"profile,omitempty"`
	Waiting      int            `json:"waiting"`
	Running      int            `json:"running"`
	InFlight     int            `json:"in_flight"`
	TokensPerSec float64        `json:"tokens_per_s"` // processed, per second of model time
	GPUKVUsage   float64        `json:"gpu_kv_usage"`
	HostKVUsage  float64        `json:"host_kv_usage"`
	GPUBlocks    int            `json:"gpu_blocks_cached"`
	HostBlocks   int            `json:"host_blocks_cached"`
	LastSeen     time.Time      `json:"last_seen,omitzero"`
	Switch       *Switch        `json:"switch,omitempty"`
	Reason       string         `json:"reason,omitempty"`
	History      []roles.Change `json:"history,omitempty"`
	// Answers it was streaming when it failed (since it last joined),
	// which went on on other nodes, and those that could not.
	Interrupted int `json:"answers_interrupted,omitempty"`
	Lost        int `json:"answers_lost,omitempty"`
	// TokenRequired: the engine's port answers only with the engine token
	// (false: anyone who reaches it may use it).
	TokenRequired bool `json:"token_required"`
	// Passes: pass records the node has sent the planner.
	Passes uint64 `json:"passes"`
	// KVBlocksLeftOut: blocks whose KV events its engine could not pass
	// on (missing from the directory), and why, for the last.
	KVBlocksLeftOut uint64 `json:"kv_blocks_left_out,omitempty"`
	KVLeftOutWhy    string `json:"kv_left_out_why,omitempty"`
}

// Switch is a role switch in progress.
type Switch struct {
	To      string    `json:"to"`
	Phase   string    `json:"phase"` // draining or handing over, offloading, flipping
	Started time.Time `json:"started,omitzero"`
	// HandedOver: answers handed to peer decode nodes so far.
	HandedOver int `json:"handed_over,omitempty"`
}

// WatchEvent is one message of the watch stream.
type WatchEvent struct {
	Type       string `json:"type"` // snapshot, node, event
	Generation uint64 `json:"generation"`
	Nodes      []Node `json:"nodes,omitempty"`
	Node       *Node  `json:"node,omitempty"`
	// A snapshot's Events are the server's record of what happened
	// before it, oldest first, complete from HistorySince on; an "event"
	// message carries one new Event. A server that keeps no record (a
	// simulation, an older orchestrator) sends neither, and no
	// HistorySince.
	Events       []Event   `json:"events,omitempty"`
	Event        *Event    `json:"event,omitempty"`
	HistorySince time.Time `json:"history_since,omitzero"`
}

// Cluster is the control API's cluster summary.
type Cluster struct {
	RouterURL string `json:"router_url"`
	Policy    string `json:"policy"`
	Model     string `json:"model"`
	// Recent: requests measured over the last minute.
	Recent *Recent `json:"recent,omitempty"`
	// Counts, as the orchestrator reports them.
	NodeCount  int            `json:"node_count,omitempty"`
	ByRole     map[string]int `json:"by_role,omitempty"`
	ByState    map[string]int `json:"by_state,omitempty"`
	Generation uint64         `json:"generation,omitempty"`
	// Simulation is set when the cluster is a simulation (evolve sim
	// --live): its modelled clock.
	Simulation *Simulation `json:"simulation,omitempty"`
	// Speedup: the engines run this many modelled seconds per wall second
	// (0 or 1: real time). Recent's latencies are wall-clock.
	Speedup float64 `json:"speedup,omitempty"`
	// KeyLimits are the API key names with a max-concurrency and how near
	// they run to it.
	KeyLimits []KeyLimit `json:"key_limits,omitempty"`
	// Leader names the orchestrator whose planner acts, and
	// Orchestrators lists every orchestrator on the event plane, when
	// several share it.
	Leader        string         `json:"leader,omitempty"`
	Orchestrators []Orchestrator `json:"orchestrators,omitempty"`
}

// Orchestrator is one orchestrator of those sharing the event plane.
type Orchestrator struct {
	Name       string    `json:"name"`
	RouterURL  string    `json:"router_url"`
	ControlURL string    `json:"control_url"`
	NATSURL    string    `json:"nats_url"`
	Leader     bool      `json:"leader"`         // leads the planner
	Term       uint64    `json:"term,omitempty"` // its leadership term
	StartedAt  time.Time `json:"started_at"`
	// NATSPeers is how many other NATS servers its embedded one has
	// routes to (-1: not embedded).
	NATSPeers int `json:"nats_peers"`
	// State: up, or silent (not heard for 3 s: stopped, or cut off).
	State    string  `json:"state"`
	HeardAgo float64 `json:"heard_s_ago"`
	Self     bool    `json:"self,omitempty"` // the orchestrator answering
}

// KeyLimit is an API key name's limit and its requests now.
type KeyLimit struct {
	Name           string  `json:"name"`
	MaxConcurrency int     `json:"max_concurrency"`
	MaxWaitSec     float64 `json:"max_wait_s"`
	InFlight       int     `json:"in_flight"`
	Waiting        int     `json:"waiting"`
}

// Simulation is a simulated cluster's progress.
type Simulation struct {
	ModelledTime time.Time `json:"modelled_time"`
	ElapsedSec   float64   `json:"elapsed_s"`
	TotalSec     float64   `json:"total_s"`
	Pace         float64   `json:"pace"`
	Done         bool      `json:"done"`
	Requests     int       `json:"requests_completed"`
	Sessions     int       `json:"sessions_completed"`
	OutputTokSec float64   `json:"last_minute_output_tokens_per_s"`
}

// Branch is an agent branch with where its blocks live.
type Branch struct {
	Session   string      `json:"session"`
	Branch    string      `json:"branch"`
	Parent    string      `json:"parent"`
	State     string      `json:"state"`
	Blocks    int         `json:"blocks"`
	Turns     int         `json:"turns"`
	LastUsed  time.Time   `json:"last_used"`
	Residency []Residency `json:"residency"`
}

// Residency is how many of a branch's blocks a node holds per tier.
type Residency struct {
	Node string `json:"node"`
	GPU  int    `json:"gpu_blocks"`
	Host int    `json:"host_blocks"`
}

// KV is the cluster's KV summary.
type KV struct {
	PromptTokens int64    `json:"prompt_tokens"`
	GPUHitRate   float64  `json:"gpu_hit_rate"`
	HostHitRate  float64  `json:"host_hit_rate"`
	LostReuse    int64    `json:"lost_kv_reuse_tokens"`
	LiveBranches int      `json:"live_branches"`
	Nodes        []KVNode `json:"nodes,omitempty"` // absent: not reported
}

// KVNode is one node's KV as the monitor shows it.
type KVNode struct {
	ID              string  `json:"id"`
	ReferencedShare float64 `json:"referenced_share"`
	// Copies of referenced blocks evicted (counters since the node
	// joined), and those that were the last copy in the cluster.
	RefEvictedGPU  int64 `json:"referenced_evicted_gpu_blocks"`
	RefEvictedHost int64 `json:"referenced_evicted_host_blocks"`
	RefLost        int64 `json:"referenced_lost_blocks"`
}
