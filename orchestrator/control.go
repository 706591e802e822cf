package orchestrator

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/pprof"
	"strings"
	"time"

	"github.com/evolvellm/evolve/controlapi"
	"github.com/evolvellm/evolve/monitoring"
	"github.com/evolvellm/evolve/openaiapi"
	"github.com/evolvellm/evolve/protocol"
)

// ClusterStatus is the control API's summary of the cluster. Field names
// are stable: scripts depend on them.
type ClusterStatus struct {
	RouterURL  string         `json:"router_url"`
	ControlURL string         `json:"control_url"`
	NATSURL    string         `json:"nats_url"`
	Policy     string         `json:"policy"`
	Model      string         `json:"model"`
	NodeCount  int            `json:"node_count"`
	ByRole     map[string]int `json:"by_role"`  // serving nodes per role
	ByState    map[string]int `json:"by_state"` // nodes per state
	KVBlocks   int            `json:"kv_blocks"`
	KVReplicas int            `json:"kv_replicas"`
	Generation uint64         `json:"generation"`
	StartedAt  time.Time      `json:"started_at"`
	Recent     Recent         `json:"recent"` // requests over the last minute
	// Speedup is the serving engines' modelled seconds per wall second,
	// when it is not 1 (simulated engines run faster for demos and
	// tests): measured latencies are then wall-clock, the planner's
	// predictions modelled. 0 when 1, or when engines differ.
	Speedup float64 `json:"speedup,omitempty"`
	// APIKeys is how many keys the agents' API takes (0: it is open).
	APIKeys int `json:"api_keys"`
	// KeyLimits are the names with a max-concurrency and how near they
	// run to it, by name.
	KeyLimits []KeyLimitStatus `json:"key_limits,omitempty"`
	// TLSNotAfter is when the certificate the router serves ends; nil
	// without TLS.
	TLSNotAfter *time.Time `json:"tls_not_after,omitempty"`
	// Name is the answering orchestrator's; Orchestrators lists every
	// orchestrator on the event plane (one, unless several share it),
	// and Leader names the one whose planner acts ("" while none does).
	Name          string                    `json:"name"`
	Leader        string                    `json:"leader"`
	Orchestrators []controlapi.Orchestrator `json:"orchestrators"`
}

// controlHandler serves the control API (see the package comment of cmd
// evolve for the commands that use it).
func (o *Orchestrator) controlHandler() http.Handler {
	// The control API's record of what happened to the nodes, served to
	// each new watcher: fed from the start of Run, while it runs.
	events := newEventLog(time.Now(), eventHistory)
	if o.ctx != nil {
		go o.recordEvents(o.ctx, events)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/v1/cluster", func(w http.ResponseWriter, r *http.Request) { openaiapi.WriteJSON(w, 200, o.Status()) })
	mux.HandleFunc("GET /api/v1/nodes", func(w http.ResponseWriter, r *http.Request) { openaiapi.WriteJSON(w, 200, o.Nodes()) })
	mux.HandleFunc("GET /api/v1/nodes/{id}", func(w http.ResponseWriter, r *http.Request) {
		st, ok := o.NodeStatus(r.PathValue("id"))
		if !ok {
			o.noSuchNode(w, r.PathValue("id"))
			return
		}
		openaiapi.WriteJSON(w, 200, st)
	})
	mux.HandleFunc("POST /api/v1/nodes/{id}/role", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Role string `json:"role"`
			Pin  bool   `json:"pin"`
		}
		if err := json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&req); err != nil {
			apiError(w, 400, "body must be JSON like {\"role\": \"decode\", \"pin\": true}: %v", err)
			return
		}
		st, err := o.SetRole(r.PathValue("id"), req.Role, req.Pin, "operator")
		o.roleAnswer(w, st, err, 202)
	})
	mux.HandleFunc("DELETE /api/v1/nodes/{id}/pin", func(w http.ResponseWriter, r *http.Request) {
		st, err := o.Unpin(r.PathValue("id"))
		o.roleAnswer(w, st, err, 200)
	})
	mux.HandleFunc("GET /api/v1/watch", func(w http.ResponseWriter, r *http.Request) { o.serveWatch(w, r, events) })
	mux.HandleFunc("GET /api/v1/events", func(w http.ResponseWriter, r *http.Request) { openaiapi.WriteJSON(w, 200, events.history()) })
	mux.HandleFunc("GET /api/v1/branches", func(w http.ResponseWriter, r *http.Request) {
		openaiapi.WriteJSON(w, 200, o.Branches(r.URL.Query().Get("session")))
	})
	mux.HandleFunc("GET /api/v1/kv", func(w http.ResponseWriter, r *http.Request) { openaiapi.WriteJSON(w, 200, o.KV()) })
	mux.HandleFunc("GET /api/v1/planner", func(w http.ResponseWriter, r *http.Request) {
		st, ok := o.PlannerStatus()
		if !ok {
			apiError(w, 404, "the planner is off (orchestrator --planner off)")
			return
		}
		openaiapi.WriteJSON(w, 200, st)
	})
	mux.HandleFunc("GET "+monitoring.TargetsPath, o.servePrometheusTargets)
	// Go's profiler, for an operator chasing memory or CPU: behind the
	// control API's token, like everything here.
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { apiError(w, 404, "no route %s %s", r.Method, r.URL.Path) })
	if o.cfg.ControlToken == "" {
		return mux
	}
	want := []byte("Bearer " + o.cfg.ControlToken)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			// The realm tells a client that took this for the router
			// (evolve bench --url) what it reached.
			w.Header().Set("WWW-Authenticate", `Bearer realm="`+protocol.ControlRealm+`"`)
			apiError(w, 401, "missing or wrong bearer token")
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// roleAnswer answers a role change or an unpin: the node's status with
// status ok; a 404 for a node there is not; a 503 asking to try again
// soon while no orchestrator leads the planner (its lease is moving); a
// 400 for the rest (a role that is not one, a switch refused).
func (o *Orchestrator) roleAnswer(w http.ResponseWriter, st controlapi.Node, err error, ok int) {
	var unknown ErrUnknownNode
	switch {
	case errors.As(err, &unknown):
		o.noSuchNode(w, string(unknown))
	case errors.Is(err, ErrNotLeader):
		w.Header().Set("Retry-After", "2")
		apiError(w, 503, "%v", err)
	case errors.As(err, new(*NotStoredError)):
		apiError(w, 503, "%v", err)
	case err != nil:
		apiError(w, 400, "%v", err)
	default:
		openaiapi.WriteJSON(w, ok, st)
	}
}

func apiError(w http.ResponseWriter, status int, format string, args ...any) {
	openaiapi.WriteJSON(w, status, map[string]any{"error": map[string]any{"message": fmt.Sprintf(format, args...), "status": status}})
}

// Status summarises the cluster.
func (o *Orchestrator) Status() ClusterStatus {
	recent := o.recent.recent(time.Now(), o.started) // sorts: not under the cluster's lock
	keys := o.keys.Get(time.Now())
	orchs := o.Orchestrators()
	o.c.mu.Lock()
	defer o.c.mu.Unlock()
	st := ClusterStatus{RouterURL: o.routerURL, ControlURL: o.controlURL, NATSURL: o.natsURL, Policy: o.policy.Name(),
		Model: o.model, NodeCount: len(o.c.nodes), ByRole: map[string]int{}, ByState: map[string]int{},
		KVBlocks: o.c.dir.Blocks(), KVReplicas: o.c.dir.Replicas(), Generation: o.c.gen, StartedAt: o.started,
		Recent: recent, APIKeys: keys.Len(), KeyLimits: keys.Status(o.othersInFlight), Name: o.cfg.Name, Orchestrators: orchs}
	for _, x := range orchs {
		if x.Leader {
			st.Leader = x.Name
		}
	}
	if o.certs != nil {
		end := o.certs.NotAfter().UTC()
		st.TLSNotAfter = &end
	}
	speedups := map[float64]bool{}
	for _, n := range o.c.nodes {
		st.ByState[n.state]++
		if n.state == StateServing {
			st.ByRole[n.role.String()]++
			x := n.reg.Speedup
			if x <= 0 { // real engines do not say
				x = 1
			}
			speedups[x] = true
		}
	}
	if len(speedups) == 1 {
		for x := range speedups {
			if x != 1 {
				st.Speedup = x
			}
		}
	}
	return st
}

// noSuchNode answers 404 for a node id the orchestrator has not seen, and
// names those it has: a mistyped id is then plain to see.
func (o *Orchestrator) noSuchNode(w http.ResponseWriter, id string) {
	var ids []string
	for _, n := range o.Nodes() {
		ids = append(ids, n.ID)
	}
	known := "none has registered"
	if len(ids) > 0 {
		known = "nodes: " + strings.Join(ids, ", ")
	}
	apiError(w, 404, "no node %q (%s)", id, known)
}

// Nodes lists the nodes, in the order of their ids (engine-2 before
// engine-10).
func (o *Orchestrator) Nodes() []controlapi.Node {
	o.c.mu.Lock()
	defer o.c.mu.Unlock()
	return o.c.statuses()
}

// NodeStatus reports one node.
func (o *Orchestrator) NodeStatus(id string) (controlapi.Node, bool) {
	o.c.mu.Lock()
	defer o.c.mu.Unlock()
	n := o.c.nodes[id]
	if n == nil {
		return controlapi.Node{}, false
	}
	return n.status(id, o.c.dir), true
}

// serveWatch streams server-sent events: a snapshot (the nodes, and the
// record of what happened to them before), then a node event for every
// change, each with a generation number, and an event message for each
// thing recorded; a comment every few seconds keeps idle connections
// alive. A client too slow to keep up is dropped.
func (o *Orchestrator) serveWatch(w http.ResponseWriter, r *http.Request, events *eventLog) {
	history, evs := events.watch(256)
	defer events.unwatch(evs)
	ch := make(chan watchEvent, 256)
	o.c.mu.Lock()
	snap := controlapi.WatchEvent{Type: "snapshot", Generation: o.c.gen, Nodes: o.c.statuses(),
		Events: history.Events, HistorySince: history.Since}
	o.c.subs[ch] = struct{}{}
	o.c.mu.Unlock()
	defer func() {
		o.c.mu.Lock()
		if _, ok := o.c.subs[ch]; ok {
			delete(o.c.subs, ch)
			close(ch)
		}
		o.c.mu.Unlock()
	}()
	out := make(chan controlapi.WatchEvent, 256)
	go forwardWatch(r.Context(), ch, evs, out)
	controlapi.Stream(w, r, snap, out)
}

// forwardWatch merges a watcher's node changes and recorded events into
// out, until ctx ends; when either source dropped the watcher for being
// slow, it closes out, which tells the client so.
func forwardWatch(ctx context.Context, nodes <-chan watchEvent, evs <-chan controlapi.Event, out chan<- controlapi.WatchEvent) {
	for {
		var msg controlapi.WatchEvent
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-nodes:
			if !ok {
				close(out)
				return
			}
			msg = controlapi.WatchEvent{Type: ev.Type, Generation: ev.Generation, Nodes: ev.Nodes, Node: ev.Node}
		case e, ok := <-evs:
			if !ok {
				close(out)
				return
			}
			msg = controlapi.WatchEvent{Type: "event", Event: &e}
		}
		select {
		case out <- msg:
		case <-ctx.Done():
			return
		}
	}
}
