// Package tui is evolve top: a live terminal monitor of a cluster, fed by
// the orchestrator's control API (the watch stream for nodes, polls for
// the planner, branches and KV), where operators switch nodes by hand.
//
// It depends on the control API's JSON only: the types below decode the
// fields it shows, so the monitor works against any orchestrator that
// speaks the API.
package tui

import (
	"context"
	"net/http"
	"time"

	"github.com/evolvellm/evolve/controlapi"
	"github.com/evolvellm/evolve/roles"
)

// The control API's JSON, shared with its servers (see controlapi).
type (
	Node       = controlapi.Node
	Switch     = controlapi.Switch
	RoleChange = roles.Change
	WatchEvent = controlapi.WatchEvent
	Cluster    = controlapi.Cluster
	Simulation = controlapi.Simulation
	Recent     = controlapi.Recent
	KeyLimit   = controlapi.KeyLimit
	Branch     = controlapi.Branch
	Residency  = controlapi.Residency
	KV         = controlapi.KV
	KVNode     = controlapi.KVNode
	// RecordedEvent is an event of the orchestrator's record.
	RecordedEvent = controlapi.Event
)

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
	Avoided    []string   `json:"avoided"`
	Speedup    float64    `json:"speedup"` // set when the engines run faster than the wall clock
	Limits     Limits     `json:"limits"`
}

// Limits are the engine limits the planner's predictions assume.
type Limits struct {
	MaxBatchedTokens int `json:"max_batched_tokens"`
	MaxSeqs          int `json:"max_seqs"` // 0: none known
	GPUKVTokens      int `json:"gpu_kv_tokens"`
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
	PrefillTok float64 `json:"prefill_tokens_per_s"` // on prefill nodes
	OutputTok  float64 `json:"output_tokens_per_s"`
	// LocalTok is prefilled on decode nodes: the short uncached parts of
	// prompts that skip the prefill nodes.
	LocalTok float64 `json:"local_prefill_tokens_per_s"`
	// Of PrefillTok, what arrivals did not show; and the prefill queue.
	HiddenTok    float64 `json:"hidden_prefill_tokens_per_s"`
	PrefillQueue float64 `json:"prefill_queue"`
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
	// A role switch asked while the planner's lease moves to another
	// orchestrator is asked again (a 503 with Retry-After) within the
	// action's time, not shown as a failure.
	return &HTTPSource{controlapi.Client{Base: base, Token: token, HTTP: &http.Client{Timeout: 5 * time.Second}, RetryFor: 15 * time.Second}}
}

// Addr is the control API's address.
func (s *HTTPSource) Addr() string { return s.Base }

func (s *HTTPSource) do(ctx context.Context, method, path string, in, out any) error {
	return s.Do(ctx, method, path, in, out)
}

// Watch reads the server-sent events of /api/v1/watch.
func (s *HTTPSource) Watch(ctx context.Context, out chan<- WatchEvent) error {
	return s.Client.Watch(ctx, "/api/v1/watch", out)
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
