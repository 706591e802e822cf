// Package live serves running simulations through evolve's control API, so
// that evolve top watches a paper-scale simulated cluster move as it would
// watch a live one. Each policy's cluster lives under its own path:
// http://ADDR/<policy>/api/v1/... (cluster, nodes, the watch stream,
// planner, branches, kv); http://ADDR/ lists them. The simulations are
// read-only: a request to switch a node is refused.
//
// The server is the simulations' watcher (sim.Hooks.Watch): each state a
// simulation reports updates its policy's feed, and the call sleeps as
// long as it takes to hold the pace (modelled seconds per wall second).
package live

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"reflect"
	"sort"
	"sync"
	"time"

	"github.com/evolvellm/evolve/controlapi"
	"github.com/evolvellm/evolve/planner"
	"github.com/evolvellm/evolve/sim"
)

// Server serves the feeds of a comparison's simulations.
type Server struct {
	// Pace is how many modelled seconds pass per wall second; 0 runs as
	// fast as the simulations go.
	Pace float64
	// Model names the served model in the cluster summary.
	Model string
	// Now and Sleep are the wall clock (tests replace them).
	Now   func() time.Time
	Sleep func(time.Duration)

	mu    sync.Mutex
	feeds map[string]*feed
	names []string
}

// feed is one simulation's latest state as the control API shows it.
type feed struct {
	started  time.Time // wall time of the first state
	gen      uint64
	nodes    map[string]nodeJSON
	order    []string
	subs     map[chan watchEvent]struct{}
	cluster  controlapi.Cluster
	planner  *planner.Status
	kv       controlapi.KV
	branches []branchJSON
	wantBr   time.Time // wall time branches were last asked for
	brAt     time.Time // wall time they were last computed
	done     bool
}

// New returns a server for the named policies' simulations.
func New(policies []string, model string, pace float64) *Server {
	s := &Server{Pace: pace, Model: model, Now: time.Now, Sleep: time.Sleep, feeds: map[string]*feed{}}
	for _, p := range policies {
		if s.feeds[p] != nil {
			continue
		}
		s.names = append(s.names, p)
		s.feeds[p] = &feed{nodes: map[string]nodeJSON{}, subs: map[chan watchEvent]struct{}{}, branches: []branchJSON{},
			cluster: controlapi.Cluster{Policy: p, Model: model, Simulation: &controlapi.Simulation{}, Recent: &controlapi.Recent{}}}
	}
	return s
}

// Path is where a policy's control API is served, relative to the server.
func Path(policy string) string { return "/" + url.PathEscape(policy) }

// The control API's JSON (controlapi: what evolve top reads).
type (
	nodeJSON   = controlapi.Node
	watchEvent = controlapi.WatchEvent
	branchJSON = controlapi.Branch
)

// Branches are computed (a walk over every branch's blocks) only while
// someone asks for them: for branchesFresh after a request, at most every
// branchesEvery of wall time.
const (
	branchesFresh = 10 * time.Second
	branchesEvery = 2 * time.Second
)

// Watch takes a simulation's state (it is sim.Hooks.Watch) and holds the
// pace.
func (s *Server) Watch(st *sim.State) {
	s.mu.Lock()
	f := s.feeds[st.Policy]
	if f == nil {
		s.mu.Unlock()
		return
	}
	now := s.Now()
	if f.started.IsZero() {
		f.started = now.Add(-s.wallFor(st.Elapsed))
	}
	s.update(f, st)
	want := !f.wantBr.IsZero() && now.Sub(f.wantBr) < branchesFresh && (now.Sub(f.brAt) >= branchesEvery || st.Final)
	wait := f.started.Add(s.wallFor(st.Elapsed)).Sub(now)
	s.mu.Unlock()
	if want {
		// A walk over every branch's blocks: not under the lock, which
		// the handlers and the other simulations share.
		br := branchesOf(st.Branches())
		s.mu.Lock()
		f.branches, f.brAt = br, now
		s.mu.Unlock()
	}
	if wait > 0 {
		s.Sleep(wait)
	}
}

// wallFor is the wall time a stretch of modelled time takes at the pace.
func (s *Server) wallFor(d time.Duration) time.Duration {
	if s.Pace <= 0 {
		return 0
	}
	return time.Duration(float64(d) / s.Pace)
}

// Done marks a policy's simulation finished: its last state stays served.
func (s *Server) Done(policy string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if f := s.feeds[policy]; f != nil {
		// A copy: handlers marshal the last one outside the lock.
		done := *f.cluster.Simulation
		done.Done = true
		f.done, f.cluster.Simulation = true, &done
	}
}

func (s *Server) update(f *feed, st *sim.State) {
	c := &f.cluster
	c.NodeCount = len(st.Nodes)
	c.ByRole, c.ByState = map[string]int{}, map[string]int{}
	lm := st.LastMinute
	c.Simulation = &controlapi.Simulation{ModelledTime: st.Now, ElapsedSec: st.Elapsed.Seconds(), TotalSec: st.Total.Seconds(), Pace: s.Pace,
		Requests: st.Requests, Sessions: st.Sessions, OutputTokSec: lm.OutputTokensPerSec}
	c.Recent = &controlapi.Recent{WindowSec: 60, Requests: lm.Requests, RequestsSec: float64(lm.Requests) / 60,
		TTFTP50: lm.TTFTP50, TTFTP95: lm.TTFTP95, E2EP50: lm.E2EP50, E2EP95: lm.E2EP95}
	mode := "static"
	if st.Auto {
		mode = "auto"
	}
	for _, n := range st.Nodes {
		c.ByState[n.State]++
		if n.State == "serving" {
			c.ByRole[n.Role]++
		}
		j := nodeJSON{ID: n.ID, Role: n.Role, Mode: mode, State: n.State, Address: "simulated", Model: s.Model,
			Waiting: n.Waiting, Running: n.Running, InFlight: n.Waiting + n.Running, TokensPerSec: n.TokensPerSec,
			GPUKVUsage: ratio(n.GPUUsed, n.GPUCapacity), HostKVUsage: ratio(n.HostBlocks, n.HostCapacity),
			GPUBlocks: n.GPUBlocks, HostBlocks: n.HostBlocks, Passes: n.Passes}
		if n.SwitchTo != "" {
			j.Switch = &controlapi.Switch{To: n.SwitchTo, Phase: "draining"}
		}
		j.History = append(j.History, n.History...)
		if k := len(n.History); k > 0 && (n.State == "down" || n.State == "draining") {
			j.Reason = n.History[k-1].Reason
		}
		old, seen := f.nodes[n.ID]
		if !seen {
			f.order = append(f.order, n.ID)
		}
		if seen && reflect.DeepEqual(old, j) {
			continue
		}
		f.nodes[n.ID] = j
		f.gen++
		ev := watchEvent{Type: "node", Generation: f.gen, Node: &j}
		for ch := range f.subs {
			select {
			case ch <- ev:
			default: // too slow: dropped, it resyncs on reconnect
				delete(f.subs, ch)
				close(ch)
			}
		}
	}
	c.Generation = f.gen
	f.planner = st.Planner
	f.kv = controlapi.KV{PromptTokens: st.PromptTokens, LostReuse: st.LostReuse, LiveBranches: st.LiveBranches,
		GPUHitRate: ratio64(st.GPUHitTokens, st.PromptTokens), HostHitRate: ratio64(st.HostHit, st.PromptTokens)}
	if st.TracksBranches {
		for _, n := range st.Nodes {
			f.kv.Nodes = append(f.kv.Nodes, controlapi.KVNode{ID: n.ID, ReferencedShare: n.ReferencedShare})
		}
	}
}

func ratio(a, b int) float64 {
	if b <= 0 {
		return 0
	}
	return float64(a) / float64(b)
}

func ratio64(a, b int64) float64 {
	if b <= 0 {
		return 0
	}
	return float64(a) / float64(b)
}

func branchesOf(bs []sim.BranchState) []branchJSON {
	out := make([]branchJSON, 0, len(bs))
	for _, b := range bs {
		j := branchJSON{Session: b.Session, Branch: b.Branch, Parent: b.Parent, State: b.State, Blocks: b.Blocks,
			Turns: b.Turns, LastUsed: b.LastUsed, Residency: []controlapi.Residency{}}
		for _, r := range b.Residency {
			j.Residency = append(j.Residency, controlapi.Residency{Node: r.Node, GPU: r.GPU, Host: r.Host})
		}
		out = append(out, j)
	}
	return out
}

// Handler serves the control API of every policy's simulation.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		type entry struct {
			Policy string `json:"policy"`
			Path   string `json:"path"`
			Done   bool   `json:"done"`
		}
		s.mu.Lock()
		out := []entry{}
		for _, n := range s.names {
			out = append(out, entry{Policy: n, Path: Path(n), Done: s.feeds[n].done})
		}
		s.mu.Unlock()
		writeJSON(w, 200, map[string]any{"simulations": out})
	})
	route := func(pattern string, h func(http.ResponseWriter, *http.Request, *feed)) {
		mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			f := s.feeds[r.PathValue("policy")]
			if f == nil {
				apiError(w, 404, "no simulation of policy %q here (GET / lists them)", r.PathValue("policy"))
				return
			}
			h(w, r, f)
		})
	}
	route("GET /{policy}/api/v1/cluster", func(w http.ResponseWriter, _ *http.Request, f *feed) {
		s.mu.Lock()
		c := f.cluster
		s.mu.Unlock()
		writeJSON(w, 200, c)
	})
	route("GET /{policy}/api/v1/nodes", func(w http.ResponseWriter, _ *http.Request, f *feed) {
		s.mu.Lock()
		nodes := f.list()
		s.mu.Unlock()
		writeJSON(w, 200, nodes)
	})
	route("GET /{policy}/api/v1/nodes/{id}", func(w http.ResponseWriter, r *http.Request, f *feed) {
		s.mu.Lock()
		n, ok := f.nodes[r.PathValue("id")]
		s.mu.Unlock()
		if !ok {
			apiError(w, 404, "no node %q", r.PathValue("id"))
			return
		}
		writeJSON(w, 200, n)
	})
	readOnly := func(w http.ResponseWriter, _ *http.Request, _ *feed) {
		apiError(w, 403, "a simulation is read-only: its policy decides the roles (watch with evolve top --readonly)")
	}
	route("POST /{policy}/api/v1/nodes/{id}/role", readOnly)
	route("DELETE /{policy}/api/v1/nodes/{id}/pin", readOnly)
	route("GET /{policy}/api/v1/planner", func(w http.ResponseWriter, _ *http.Request, f *feed) {
		s.mu.Lock()
		p := f.planner
		s.mu.Unlock()
		if p == nil {
			apiError(w, 404, "policy %s has no evolve planner", f.cluster.Policy)
			return
		}
		writeJSON(w, 200, p)
	})
	route("GET /{policy}/api/v1/branches", func(w http.ResponseWriter, r *http.Request, f *feed) {
		s.mu.Lock()
		f.wantBr = s.Now()
		out := []branchJSON{}
		for _, b := range f.branches {
			if sess := r.URL.Query().Get("session"); sess == "" || b.Session == sess {
				out = append(out, b)
			}
		}
		s.mu.Unlock()
		writeJSON(w, 200, out)
	})
	route("GET /{policy}/api/v1/kv", func(w http.ResponseWriter, _ *http.Request, f *feed) {
		s.mu.Lock()
		k := f.kv
		s.mu.Unlock()
		writeJSON(w, 200, k)
	})
	route("GET /{policy}/api/v1/watch", s.serveWatch)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		apiError(w, 404, "no route %s %s (GET / lists the simulations)", r.Method, r.URL.Path)
	})
	return mux
}

// list is the feed's nodes in the order they first appeared.
func (f *feed) list() []nodeJSON {
	out := make([]nodeJSON, 0, len(f.order))
	for _, id := range f.order {
		out = append(out, f.nodes[id])
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// serveWatch streams server-sent events as the orchestrator does: a
// snapshot, then a node event per change, with generation numbers.
func (s *Server) serveWatch(w http.ResponseWriter, r *http.Request, f *feed) {
	ch := make(chan watchEvent, 1024)
	s.mu.Lock()
	snap := watchEvent{Type: "snapshot", Generation: f.gen, Nodes: f.list()}
	f.subs[ch] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		if _, ok := f.subs[ch]; ok {
			delete(f.subs, ch)
			close(ch)
		}
		s.mu.Unlock()
	}()
	controlapi.Stream(w, r, snap, ch)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func apiError(w http.ResponseWriter, status int, format string, args ...any) {
	writeJSON(w, status, map[string]any{"error": map[string]any{"message": fmt.Sprintf(format, args...), "status": status}})
}
