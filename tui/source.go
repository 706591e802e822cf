// Package tui is evolve top: a live terminal monitor of a cluster, fed by
// the orchestrator's control API (the watch stream for nodes, polls for
// the planner, branches and KV), where operators switch nodes by hand.
//
// It depends on the control API's JSON only: the types below decode the
// fields it shows, so the monitor works against any orchestrator that
// speaks the API.
package tui

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/evolvellm/evolve/controlapi"
)

// Node is a node as the control API reports it.
type Node struct {
	ID          string       `json:"id"`
	Role        string       `json:"role"`
	Mode        string       `json:"mode"`
	State       string       `json:"state"`
	Address     string       `json:"address"`
	Waiting     int          `json:"waiting"`
	Running     int          `json:"running"`
	InFlight    int          `json:"in_flight"`
	GPUKVUsage  float64      `json:"gpu_kv_usage"`
	HostKVUsage float64      `json:"host_kv_usage"`
	GPUBlocks   int          `json:"gpu_blocks_cached"`
	HostBlocks  int          `json:"host_blocks_cached"`
	Switch      *Switch      `json:"switch,omitempty"`
	Reason      string       `json:"reason,omitempty"`
	History     []RoleChange `json:"history,omitempty"`
}

// Switch is a role switch in progress.
type Switch struct {
	To    string `json:"to"`
	Phase string `json:"phase"`
}

// RoleChange is one entry of a node's role history.
type RoleChange struct {
	Time   time.Time `json:"time"`
	From   string    `json:"from"`
	To     string    `json:"to"`
	Reason string    `json:"reason"`
}

// WatchEvent is one message of the watch stream.
type WatchEvent struct {
	Type       string `json:"type"` // snapshot, node
	Generation uint64 `json:"generation"`
	Nodes      []Node `json:"nodes,omitempty"`
	Node       *Node  `json:"node,omitempty"`
}

// Cluster is the control API's cluster summary.
type Cluster struct {
	RouterURL string `json:"router_url"`
	Policy    string `json:"policy"`
	Model     string `json:"model"`
	// Recent: requests measured over the last minute.
	Recent *Recent `json:"recent,omitempty"`
	// Simulation is set when the cluster is a simulation (evolve sim
	// --live): its modelled clock.
	Simulation *Simulation `json:"simulation,omitempty"`
}

// Recent is what requests measured over the last window.
type Recent = controlapi.Recent

// Simulation is a simulated cluster's progress.
type Simulation struct {
	ModelledTime time.Time `json:"modelled_time"`
	ElapsedSec   float64   `json:"elapsed_s"`
	TotalSec     float64   `json:"total_s"`
	Pace         float64   `json:"pace"`
	Done         bool      `json:"done"`
	Requests     int       `json:"requests_completed"`
	Sessions     int       `json:"sessions_completed"`
}

// Planner is the part of the planner's status the monitor shows.
type Planner struct {
	State      string     `json:"state"`
	Reason     string     `json:"reason"`
	Enabled    bool       `json:"enabled"`
	PrefillFit Fit        `json:"prefill_cost"`
	DecodeFit  Fit        `json:"decode_cost"`
	Short      Demand     `json:"demand_short"`
	Long       Demand     `json:"demand_long"`
	Prefill    int        `json:"prefill"`
	Decode     int        `json:"decode"`
	Recommend  int        `json:"recommended_prefill"`
	Current    Pred       `json:"current"`
	Best       Pred       `json:"best"`
	GainSec    float64    `json:"gain_s"`
	CostSec    float64    `json:"cost_s"`
	HeldSec    float64    `json:"held_s"`
	ActsInSec  float64    `json:"acts_in_s"`
	Decisions  []Decision `json:"decisions"`
}

// Decision is one of the planner's decisions.
type Decision struct {
	Time   time.Time `json:"time"`
	Action string    `json:"action"`
	Reason string    `json:"reason"`
	Moves  []Move    `json:"moves"`
}

// Move is one node moved by the planner.
type Move struct {
	Node string `json:"node"`
	To   string `json:"to"`
}

// Fit is a learned cost model.
type Fit struct {
	Ready   bool    `json:"ready"`
	Samples int     `json:"samples"`
	RelErr  float64 `json:"relative_error"`
	Note    string  `json:"note"`
	Coefs   []Coef  `json:"coefficients"`
}

// Coef is a learned coefficient with its standard error.
type Coef struct {
	Name   string  `json:"name"`
	Value  float64 `json:"value"`
	StdErr float64 `json:"stderr"`
}

// Demand is the planner's demand over one horizon.
type Demand struct {
	HorizonSec float64 `json:"horizon_s"`
	Requests   float64 `json:"requests_per_s"`
	PrefillTok float64 `json:"prefill_tokens_per_s"`
	OutputTok  float64 `json:"output_tokens_per_s"`
}

// Pred is a predicted split.
type Pred struct {
	Prefill   int     `json:"prefill"`
	Decode    int     `json:"decode"`
	TTFT      float64 `json:"ttft_s"`
	ITL       float64 `json:"itl_s"`
	E2E       float64 `json:"e2e_s"`
	Saturated bool    `json:"saturated"`
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
	Nodes        []KVNode `json:"nodes"`
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

// Source is where the monitor's data comes from and where its actions go.
type Source interface {
	// Watch streams node events until ctx ends or the stream breaks.
	Watch(ctx context.Context, out chan<- WatchEvent) error
	Cluster(ctx context.Context) (Cluster, error)
	Planner(ctx context.Context) (Planner, error)
	Branches(ctx context.Context) ([]Branch, error)
	KV(ctx context.Context) (KV, error)
	SetRole(ctx context.Context, node, role string) error // pinned
	Unpin(ctx context.Context, node string) error
	Addr() string
}

// HTTPSource talks to an orchestrator's control API.
type HTTPSource struct {
	controlapi.Client
}

// NewHTTPSource returns a source for the control API at base.
func NewHTTPSource(base, token string) *HTTPSource {
	return &HTTPSource{controlapi.Client{Base: base, Token: token, HTTP: &http.Client{Timeout: 5 * time.Second}}}
}

// Addr is the control API's address.
func (s *HTTPSource) Addr() string { return s.Base }

func (s *HTTPSource) do(ctx context.Context, method, path string, in, out any) error {
	return s.Do(ctx, method, path, in, out)
}

// Watch reads the server-sent events of /api/v1/watch.
func (s *HTTPSource) Watch(ctx context.Context, out chan<- WatchEvent) error {
	req, err := s.NewRequest(ctx, "GET", "/api/v1/watch", nil)
	if err != nil {
		return err
	}
	resp, err := (&http.Client{}).Do(req) // no timeout: the stream is long-lived
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return fmt.Errorf("watch: %s", resp.Status)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var ev WatchEvent
		if json.Unmarshal([]byte(line), &ev) != nil || ev.Type == "" {
			continue
		}
		select {
		case out <- ev:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return io.EOF
}

// Cluster fetches the cluster summary.
func (s *HTTPSource) Cluster(ctx context.Context) (c Cluster, err error) {
	return c, s.do(ctx, "GET", "/api/v1/cluster", nil, &c)
}

// Planner fetches the planner's status (an error when it is off).
func (s *HTTPSource) Planner(ctx context.Context) (p Planner, err error) {
	return p, s.do(ctx, "GET", "/api/v1/planner", nil, &p)
}

// Branches fetches the agent branches.
func (s *HTTPSource) Branches(ctx context.Context) (b []Branch, err error) {
	return b, s.do(ctx, "GET", "/api/v1/branches", nil, &b)
}

// KV fetches the KV summary.
func (s *HTTPSource) KV(ctx context.Context) (k KV, err error) {
	return k, s.do(ctx, "GET", "/api/v1/kv", nil, &k)
}

// SetRole switches a node and pins it.
func (s *HTTPSource) SetRole(ctx context.Context, node, role string) error {
	return s.do(ctx, "POST", "/api/v1/nodes/"+node+"/role", map[string]any{"role": role, "pin": true}, nil)
}

// Unpin hands a node back to the planner.
func (s *HTTPSource) Unpin(ctx context.Context, node string) error {
	return s.do(ctx, "DELETE", "/api/v1/nodes/"+node+"/pin", nil, nil)
}
