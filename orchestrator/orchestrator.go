package orchestrator

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/evolvellm/evolve/orchestrator/apikeys"
	"github.com/evolvellm/evolve/orchestrator/certreload"
	"github.com/evolvellm/evolve/orchestrator/routing"
	"github.com/evolvellm/evolve/planner"
	"github.com/evolvellm/evolve/protocol"
	"github.com/evolvellm/evolve/protocol/natsconn"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Config configures an orchestrator.
type Config struct {
	RouterAddr  string // OpenAI and Anthropic APIs for agents, e.g. 127.0.0.1:8000 (port 0: any)
	ControlAddr string // control API, e.g. 127.0.0.1:8001
	// ControlToken, when set, is required as a bearer token by the control
	// API. It must be set when ControlAddr is not a loopback address.
	ControlToken string
	// NATSURL joins an existing NATS server; empty embeds one listening on
	// NATSListen with JetStream data under DataDir.
	NATSURL    string
	NATSListen string // default 127.0.0.1:4222
	// NATSToken, when set, is required of every client of the embedded
	// NATS server (engines put it in their URL: nats://TOKEN@host:port).
	NATSToken string
	// NATSCreds is a NATS user credentials file (a user JWT and its
	// nkey seed, as nsc writes them) presented to NATSURL's servers.
	NATSCreds string
	// Name tells orchestrators apart: it names this one's NATS server in
	// a cluster, and the planner's leader in status. Default: the host
	// name and the control port.
	Name string
	// ClusterListen, when set, is where the embedded NATS server takes
	// routes from its peers (ClusterPeers, HOST:PORT each): orchestrators
	// so joined share one event plane, one JetStream (3 replicas of roles,
	// pins and the planner's lease), and each routes agents' requests;
	// one planner leads at a time.
	ClusterListen string
	ClusterPeers  []string
	// EngineToken is the token the router sends engines (see protocol's
	// "The engine token"); empty: the event plane's, NATSToken or the
	// token in NATSURL.
	EngineToken      string
	DataDir          string
	Policy           string        // evolve, dynamo, round-robin
	MissedHeartbeats int           // default 3
	DrainTimeout     time.Duration // longest wait for a switching node's requests; default 5 min
	// SessionIdle is how long an agent's branch may wait for its next
	// request before it ends (its context no longer referenced); default
	// BranchTTL.
	SessionIdle time.Duration
	// StreamIdle is how long a leg that has begun its answer may send
	// nothing before the router takes the answer elsewhere, as for an
	// engine that died (default DefaultStreamIdle; see legwatch.go).
	StreamIdle time.Duration
	// PlannerMode: auto (default), recommend or off; Planner tunes it.
	PlannerMode string
	Planner     planner.Config
	// ServedModel, when set, is the model the cluster serves: engines of
	// another are rejected. Empty: the model most of its engines serve
	// (electModelLocked).
	ServedModel string
	// ModelAliases are other names (or path.Match patterns) clients may
	// give the served model: requests for them are served as its.
	ModelAliases []string
	// APIKeys, when set, are the keys the agents' API (/v1/) requires,
	// as a bearer token or in x-api-key: each KEY, or NAME KEY to label
	// the key's requests and tokens in the metrics (see apikeys.go).
	APIKeys []string
	// APIKeyFile, when set, is a file of more entries (apikeys.ReadFile),
	// read again when it changes.
	APIKeyFile string
	// ShutdownGrace is how long Run, once its context ends, lets the
	// answers the router is writing finish (no new connection is taken
	// meanwhile); default 30 s.
	ShutdownGrace time.Duration
	// TLSCertFile and TLSKeyFile, when set, make the router and the control
	// API serve HTTPS with that PEM certificate (chain) and key, read again
	// when the files change.
	TLSCertFile, TLSKeyFile string
	// Limits bound what slow or hostile clients can hold of the router
	// and the control API (zero: the defaults).
	Limits HTTPLimits
	// RecordDir, when set, is where the router records every request it
	// serves: rotating gzipped JSONL, a row each (record.go).
	RecordDir string
	// MaxConnectionsPerClient is the most connections one client address
	// holds of the router's and the control API's (0: a quarter of
	// Limits.MaxConnections, at least 256; below 0: no cap; see
	// clientlimits.go).
	MaxConnectionsPerClient int
	Logger                  *slog.Logger
}

// Orchestrator is a running orchestrator.
type Orchestrator struct {
	cfg Config
	log *slog.Logger
	ctx context.Context

	ns    *server.Server
	nc    *nats.Conn
	subs  []*nats.Subscription
	hbSub *nats.Subscription // the engines' heartbeats
	live  liveness           // when each engine was last heard from
	store *roleStore
	lease *lease // the planner's leadership; nil: no JetStream, this orchestrator plans alone
	peers peers  // the other orchestrators on the event plane
	// natsFrom records the local address of the connection to an
	// existing NATS (--nats): the address other orchestrators and
	// Prometheus reach this host at, for a router on every interface.
	natsFrom *localAddrDialer
	// remote: requests other routers placed that the policy counts;
	// guarded by policyMu.
	remote remoteLoads

	c        *cluster
	policyMu sync.Mutex
	policy   routing.Policy
	queue    *routerQueue // new requests wait here while a queueing policy finds the engines busy
	http     *http.Client
	recent   latencyWindow // the last minute of requests, for the control API
	legs     *legWatch     // the legs in flight, and the hung ones ended
	shadow   *roleShadow   // the copy of the role overrides in the data directory
	rec      *recorder     // the recording of every request (Config.RecordDir), or nil
	// recCtx ends the recording once the answers in flight are done;
	// recDone closes when its last rows are written.
	recCtx    context.Context
	recCancel context.CancelFunc
	recDone   chan struct{}
	met       *metrics
	plan      *planning // nil when the planner is off
	kvc       kvCounters

	blockSize int    // guarded by c.mu
	model     string // guarded by c.mu

	started                        time.Time
	routerURL, controlURL, natsURL string
	routerLn, controlLn            net.Listener
	certs                          *certreload.Reloader // nil: plain HTTP
	keys                           *apikeys.Set         // the agents' API keys (none: open) and limits
	keyPeers                       remoteKeys           // other routers' requests in flight per limited name
	inFlight                       atomic.Int64         // answers the router is writing
	storeFailed                    atomic.Int64         // unix ns of the last store write that failed (diskfull.go)
	bodies                         *largeBodies         // the budget for large request bodies
	resyncs                        *resyncQueue         // KV resyncs, one engine at a time
	hintsPending                   atomic.Int64         // eviction hint messages sent, not yet answered
	noTokenIDs                     sync.Map             // vLLM nodes seen streaming without token ids (warnNoTokenIDs)
}

type metrics struct {
	reg      *prometheus.Registry
	requests *prometheus.CounterVec
	// keyRequests and keyTokens: per API key (its label), requests by
	// outcome and tokens served by kind.
	keyRequests, keyTokens *prometheus.CounterVec
	decisions              *prometheus.CounterVec
	// routerQueued: requests the router's queue held before routing
	// (a queueing policy: Dynamo's).
	routerQueued prometheus.Counter
	hitTokens    *prometheus.CounterVec
	switches     *prometheus.CounterVec
	handOvers    *prometheus.CounterVec
	resumed      *prometheus.CounterVec
	// resumePulled: prompt blocks resuming nodes were asked to pull
	// from peers rather than recompute.
	resumePulled prometheus.Counter
	// resumePrefilled: resumed answers whose KV a prefill node computed
	// for their decode node (attempt.resumePrefill).
	resumePrefilled  prometheus.Counter
	resyncs          *prometheus.CounterVec // KV resyncs by outcome
	legsEnded        prometheus.Counter     // legs the leg watch ended as hung
	perClientRefused prometheus.Counter     // connections closed for their client's share
	hints            *prometheus.CounterVec // eviction hint messages by outcome
	ttft, e2e        prometheus.Histogram
	// The planner's view, as of its last step.
	planSplit     *prometheus.GaugeVec // role, kind (current, recommended)
	planCost      *prometheus.GaugeVec // model, coefficient
	planPredicted *prometheus.GaugeVec // split (current, best), metric
	planGain      prometheus.Gauge
	planMoves     prometheus.Counter
}

func newMetrics() *metrics {
	m := &metrics{reg: prometheus.NewRegistry()}
	buckets := []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320}
	m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "evolve_router_requests_total", Help: "Requests by policy and outcome: ok; bad_request (the router or an engine refused the request itself); client_gone (the client left first); no_engine; failed (engines failed it); unauthorized (no valid API key, with --api-key)."}, []string{"policy", "outcome"})
	m.keyRequests = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "evolve_router_key_requests_total", Help: "Requests by API key (its name, or sha256: and the start of its fingerprint) and outcome, as evolve_router_requests_total counts them."}, []string{"key", "outcome"})
	m.keyTokens = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "evolve_router_key_tokens_total", Help: "Tokens served by API key and kind: prompt (of requests an engine took) and completion (the output the client got)."}, []string{"key", "kind"})
	m.decisions = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "evolve_router_decisions_total", Help: "Routing decisions by policy and whether disaggregated."}, []string{"policy", "disaggregated"})
	m.routerQueued = prometheus.NewCounter(prometheus.CounterOpts{Name: "evolve_router_queued_total", Help: "Requests the router held in its queue, first come first served, before routing them: with --policy dynamo, while every prefilling engine holds more than 16 times its max_num_batched_tokens of prefill, as Dynamo's router queues."})
	m.hitTokens = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "evolve_router_prompt_tokens_total", Help: "Prompt tokens by where their KV came from at routing: gpu, local_host, remote_host, recomputed."}, []string{"source"})
	m.switches = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "evolve_role_switches_total", Help: "Completed role switches by new role."}, []string{"to"})
	m.handOvers = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "evolve_router_handovers_total", Help: "Requests a switching decode node handed over, by outcome: continued on a peer, or failed (no peer went on)."}, []string{"outcome"})
	m.ttft = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "evolve_router_time_to_first_token_seconds", Help: "Wall time from arrival to the first token passing the router.", Buckets: buckets})
	m.e2e = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "evolve_router_e2e_request_latency_seconds", Help: "Wall time from arrival to the last byte.", Buckets: buckets})
	m.planSplit = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "evolve_planner_nodes", Help: "Nodes per role: the current split and the planner's recommendation."}, []string{"role", "kind"})
	m.planCost = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "evolve_planner_cost_coefficient", Help: "Learned pass-cost coefficients, in the unit their name ends with."}, []string{"model", "coefficient"})
	m.planPredicted = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "evolve_planner_predicted_seconds", Help: "Predicted latency of the current and the best split."}, []string{"split", "metric"})
	m.planGain = prometheus.NewGauge(prometheus.GaugeOpts{Name: "evolve_planner_gain_seconds", Help: "Predicted request-seconds a move saves over the gain horizon."})
	m.planMoves = prometheus.NewCounter(prometheus.CounterOpts{Name: "evolve_planner_moves_total", Help: "Role moves the planner asked for."})
	m.resumed = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "evolve_router_resumed_answers_total", Help: "Answers continued on another node from the output the client had read, by cause (engine_failed: the engine died mid-stream; no_peer: a handed-over answer no peer took, finished where its KV was) and outcome (continued, or failed: no node could)."}, []string{"cause", "outcome"})
	m.resumePulled = prometheus.NewCounter(prometheus.CounterOpts{Name: "evolve_router_resume_fetched_blocks_total", Help: "KV blocks of resumed answers' prompts that the node continuing them, or the prefill node computing their KV, was asked to pull from live peers rather than recompute."})
	m.resumePrefilled = prometheus.NewCounter(prometheus.CounterOpts{Name: "evolve_router_resume_prefilled_total", Help: "Resumed answers whose KV (the prompt's missing part and the output so far) a prefill node computed for the decode node that went on with them, rather than that decode node recomputing it while it decodes other streams."})
	m.resyncs = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "evolve_kv_resyncs_total", Help: "Engines' KV resyncs (each engine sends its whole KV again, one at a time, after it registers or loses events), by outcome: applied (the directory took it all), shared (another orchestrator's resync of it had begun: its events serve this directory too), failed (the engine did not answer), gone (it went down or restarted first), timeout (not applied within 30 s; the next began anyway)."}, []string{"outcome"})
	m.hints = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "evolve_kv_eviction_hints_total", Help: "Eviction hint messages sent to engines (which blocks live agent branches reference, and which an ended branch left: those go first), by outcome: delivered (the engine applied them), failed (it did not answer; its blocks keep their last priorities)."}, []string{"outcome"})
	m.legsEnded = prometheus.NewCounter(prometheus.CounterOpts{Name: "evolve_router_hung_legs_total", Help: "Legs the router ended because their engine hung: its node went down (no heartbeats) while the leg waited, or the leg sent nothing for --stream-idle-timeout after it began; their answers go on elsewhere, as for an engine that died."})
	m.perClientRefused = prometheus.NewCounter(prometheus.CounterOpts{Name: "evolve_router_connections_refused_total", Help: "Connections to the router or the control API closed at once because their client address held its share already (--max-connections-per-client)."})
	// The process's own: memory, goroutines, file descriptors, CPU.
	m.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.reg.MustRegister(m.requests, m.keyRequests, m.keyTokens, m.decisions, m.routerQueued, m.hitTokens, m.switches, m.handOvers, m.resumed, m.resumePulled, m.resumePrefilled, m.resyncs, m.hints, m.ttft, m.e2e, m.legsEnded, m.perClientRefused,
		m.planSplit, m.planCost, m.planPredicted, m.planGain, m.planMoves)
	return m
}

// New checks the configuration; Start does the work.
func New(cfg Config) (*Orchestrator, error) {
	if cfg.MissedHeartbeats <= 0 {
		cfg.MissedHeartbeats = 3
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = 5 * time.Minute
	}
	if cfg.NATSListen == "" {
		cfg.NATSListen = "127.0.0.1:4222"
	}
	if cfg.Policy == "" {
		cfg.Policy = "evolve"
	}
	switch cfg.PlannerMode {
	case "":
		cfg.PlannerMode = PlannerAuto
	case PlannerAuto, PlannerRecommend, PlannerOff:
	default:
		return nil, fmt.Errorf("planner mode %q: want auto, recommend or off", cfg.PlannerMode)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if err := checkAliases(cfg.ModelAliases); err != nil {
		return nil, err
	}
	keys, err := apikeys.NewSet(cfg.APIKeys, cfg.APIKeyFile, cfg.Logger.With("component", "orchestrator"))
	if err != nil {
		return nil, err
	}
	p, err := routing.New(cfg.Policy)
	if err != nil {
		return nil, err
	}
	certs, err := certreload.New(cfg.TLSCertFile, cfg.TLSKeyFile, cfg.Logger.With("component", "orchestrator"))
	if err != nil {
		return nil, err
	}
	if cfg.ControlToken == "" && !isLoopback(cfg.ControlAddr) {
		return nil, fmt.Errorf("control address %s is not loopback: set a control token", cfg.ControlAddr)
	}
	if cfg.NATSURL == "" && cfg.NATSToken == "" && !isLoopback(cfg.NATSListen) {
		// Anyone who reached it could drain or deregister engines, or join
		// as an engine and receive users' prompts.
		return nil, fmt.Errorf("embedded NATS on %s is not loopback: set a NATS token (--nats-token-file, or $EVOLVE_ORCHESTRATOR_NATS_TOKEN), which engines present", cfg.NATSListen)
	}
	if cfg.NATSURL == "" && cfg.DataDir == "" {
		return nil, errors.New("an embedded NATS server needs a data directory")
	}
	if err := cfg.checkCluster(); err != nil {
		return nil, err
	}
	o := &Orchestrator{cfg: cfg, log: cfg.Logger.With("component", "orchestrator"), c: newCluster(cfg.SessionIdle), policy: p, queue: newRouterQueue(),
		// Buffers of 64 KiB (not 4): a leg carries an agent's prompt, a
		// megabyte of token ids at 128K tokens, in 16 writes, not 256.
		http: &http.Client{Transport: &protocol.BearerTransport{Token: cfg.engineToken(),
			Base: &http.Transport{MaxIdleConnsPerHost: 256, IdleConnTimeout: 90 * time.Second, WriteBufferSize: 64 << 10, ReadBufferSize: 64 << 10}}},
		met: newMetrics(), started: time.Now(), certs: certs, keys: keys,
		bodies: newLargeBodies(cfg.Limits.withDefaults().LargeBodyBudget), resyncs: newResyncQueue(), legs: newLegWatch(cfg.StreamIdle)}
	if cfg.PlannerMode != PlannerOff {
		o.plan = newPlanning(cfg)
	}
	o.shadow = o.openRoleShadow(cfg.DataDir)
	o.met.reg.MustRegister(keyLimitCollector{keys}, clusterCollector{o},
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "evolve_router_in_flight",
			Help: "Answers (completions, chats, messages) the router is writing now."}, func() float64 { return float64(o.inFlight.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "evolve_router_large_body_bytes",
			Help: "Bytes of large request bodies (over 1 MiB) the router is reading and parsing now, out of its budget (--large-body-budget)."}, func() float64 { return float64(o.bodies.inWork.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "evolve_router_large_body_waits_total",
			Help: "Requests with a large body that waited for room in the router's budget for them."}, func() float64 { return float64(o.bodies.waits.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "evolve_router_memory_returns_total",
			Help: "Times the router gave the memory of huge requests (8 MiB bodies and more) back to the system."}, func() float64 { return float64(o.bodies.freed.Load()) }))
	if cfg.RecordDir != "" {
		rows := func(pick func(*recorder) int64) func() float64 {
			return func() float64 {
				if o.rec == nil {
					return 0
				}
				return float64(pick(o.rec))
			}
		}
		help := "Rows of the recording (--record) by outcome: written, or dropped (the queue was full, or the disk failed or filled: requests are served all the same)."
		o.met.reg.MustRegister(
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "evolve_record_rows_total", Help: help, ConstLabels: prometheus.Labels{"outcome": "written"}},
				rows(func(r *recorder) int64 { return r.written.Load() })),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "evolve_record_rows_total", Help: help, ConstLabels: prometheus.Labels{"outcome": "dropped"}},
				rows(func(r *recorder) int64 { return r.dropped.Load() })))
	}
	if certs != nil {
		o.met.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "evolve_tls_certificate_expiry_seconds",
			Help: "When the certificate the router serves ends, in Unix seconds: alert well before it (it is read again when its file changes)."}, certs.Expiry))
	}
	return o, nil
}

// engineToken is the token engines require of routers: the one given,
// else the event plane's.
func (c Config) engineToken() string {
	switch {
	case c.EngineToken != "":
		return c.EngineToken
	case c.NATSURL == "":
		return c.NATSToken
	}
	return protocol.EngineToken(c.NATSURL)
}

// natsTLS says whether the embedded NATS server serves TLS: with a
// certificate, when it listens beyond loopback.
func (o *Orchestrator) natsTLS() bool {
	return o.certs != nil && o.cfg.NATSURL == "" && !isLoopback(o.cfg.NATSListen)
}

// IsLoopback reports whether addr (HOST:PORT) listens on loopback only.
func IsLoopback(addr string) bool { return isLoopback(addr) }

func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// RouterURL is where the running orchestrator's router serves agents.
func (o *Orchestrator) RouterURL() string { return o.routerURL }

// ControlURL is where its control API serves.
func (o *Orchestrator) ControlURL() string { return o.controlURL }

// NATSURL is its event plane's URL.
func (o *Orchestrator) NATSURL() string { return o.natsURL }

// Run starts the event plane and the HTTP servers and serves until ctx
// ends. ready is called once everything listens.
func (o *Orchestrator) Run(ctx context.Context, ready func()) error {
	o.ctx = ctx
	o.recCtx, o.recCancel = context.WithCancel(context.Background())
	defer o.recCancel()
	if err := o.startNATS(ctx); err != nil {
		return err
	}
	defer o.stopNATS()
	var err error
	if o.routerLn, err = net.Listen("tcp", o.cfg.RouterAddr); err != nil {
		return fmt.Errorf("router listen on %s: %w", o.cfg.RouterAddr, err)
	}
	if o.controlLn, err = net.Listen("tcp", o.cfg.ControlAddr); err != nil {
		o.routerLn.Close()
		return fmt.Errorf("control listen on %s: %w", o.cfg.ControlAddr, err)
	}
	// A control API on loopback stays plain HTTP: its traffic never leaves
	// the machine, and its clients reach it as 127.0.0.1, a name that
	// certificates seldom carry.
	controlTLS := o.certs != nil && !isLoopback(o.cfg.ControlAddr)
	scheme := func(tls bool) string {
		if tls {
			return "https://"
		}
		return "http://"
	}
	o.routerURL = scheme(o.certs != nil) + o.routerLn.Addr().String()
	if !isLoopback(o.cfg.RouterAddr) {
		if o.keys.Get(time.Now()).Empty() {
			o.log.Warn("the agents' API takes requests from anyone who reaches it; give it API keys (--api-key-file)", "router_addr", o.cfg.RouterAddr)
		} else if o.certs == nil {
			o.log.Warn("the agents' API keys cross the network in the clear; serve HTTPS (--tls-cert-file, --tls-key-file) or put a TLS proxy in front", "router_addr", o.cfg.RouterAddr)
		}
	}
	o.controlURL = scheme(controlTLS) + o.controlLn.Addr().String()
	if err := o.subscribe(); err != nil {
		return err
	}
	if err := o.serveRoleRequests(); err != nil {
		return err
	}
	if err := o.announcePresence(ctx); err != nil {
		return err
	}
	if err := o.followSwitches(); err != nil {
		return err
	}
	if err := o.followLoads(); err != nil {
		return err
	}
	if err := o.shareKeyLoads(ctx); err != nil {
		return err
	}
	if o.lease != nil {
		o.lease.me = leaseHolder{Name: o.cfg.Name, ControlURL: o.controlURL, RouterURL: o.routerURL}
		o.lease.step(ctx) // alone, it leads from the start
		leaseCtx, stopLease := context.WithCancel(ctx)
		leaseDone := make(chan struct{})
		go func() { o.lease.run(leaseCtx); close(leaseDone) }()
		// Stopping, it gives the lease up while it can still reach NATS:
		// another leads at once rather than when the lease expires.
		defer func() { stopLease(); <-leaseDone }()
	}
	go o.followPins(ctx)
	go o.watchHeartbeats(ctx)
	go o.watchLegs(ctx)
	go o.watchJetStream(ctx, o.ns)
	go o.runPlanner(ctx)
	limits := o.cfg.Limits.withDefaults()
	router, control := limits.server(o.routerHandler()), limits.server(o.controlHandler())
	perClient := o.cfg.MaxConnectionsPerClient
	if perClient == 0 {
		// A quarter, but never so few that one host's agents (a local
		// fleet, all on 127.0.0.1) are held to it.
		perClient = max(limits.MaxConnections/4, 256)
	}
	refused := func() { o.met.perClientRefused.Inc() }
	o.routerLn = limits.limitListener(limitPerClient(o.routerLn, perClient, refused))
	o.controlLn = limits.limitListener(limitPerClient(o.controlLn, perClient, refused))
	serve := func(srv *http.Server, ln net.Listener, tls bool) error {
		if !tls {
			return srv.Serve(ln)
		}
		srv.TLSConfig = o.certs.Config()
		return srv.ServeTLS(ln, "", "")
	}
	errs := make(chan error, 2)
	go func() { errs <- serve(router, o.routerLn, o.certs != nil) }()
	go func() { errs <- serve(control, o.controlLn, controlTLS) }()
	if ready != nil {
		ready()
	}
	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-errs:
	}
	// The control API has nothing to finish (its watch streams never
	// end by themselves): it closes at once.
	control.Close()
	grace := cmp.Or(o.cfg.ShutdownGrace, 30*time.Second)
	if n := o.inFlight.Load(); n > 0 {
		o.log.Info("orchestrator stopping: no new connections; waiting for the answers in flight", "in_flight", n, "grace", grace)
	}
	shut, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	if err := router.Shutdown(shut); err != nil {
		o.log.Warn("shutdown grace over; cutting the answers still in flight", "in_flight", o.inFlight.Load(), "grace", grace)
		router.Close()
	}
	o.stopRecording()
	if serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
		return serveErr
	}
	return nil
}

func (o *Orchestrator) startNATS(ctx context.Context) error {
	url := o.cfg.NATSURL
	if url == "" {
		host, portStr, err := net.SplitHostPort(o.cfg.NATSListen)
		if err != nil {
			return fmt.Errorf("--nats-listen %q: %w", o.cfg.NATSListen, err)
		}
		port := 0
		fmt.Sscan(portStr, &port)
		ns, err := o.startEmbeddedNATS(ctx, host, port)
		if err != nil {
			return err
		}
		o.ns = ns
		url = ns.ClientURL()
	}
	opts := []nats.Option{nats.Name("evolve-orchestrator"), nats.MaxReconnects(-1)}
	if o.cfg.NATSToken != "" && o.cfg.NATSURL == "" {
		opts = append(opts, nats.Token(o.cfg.NATSToken))
	}
	if o.cfg.NATSURL != "" {
		var auth []nats.Option
		url, auth = natsconn.Options(url, o.cfg.NATSCreds)
		o.natsFrom = &localAddrDialer{}
		opts = append(append(opts, auth...), nats.SetCustomDialer(o.natsFrom))
	}
	connectURL := url
	if o.ns != nil && o.natsTLS() {
		// Its own connection stays in the process, where the server asks
		// for no TLS: no name of the certificate need be this machine's.
		opts = append(opts, nats.InProcessServer(o.ns))
		connectURL = "nats://" + strings.TrimPrefix(url, "tls://")
	}
	nc, err := nats.Connect(connectURL, append(opts,
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil { // nil: a clean close, no news
				o.log.Warn("NATS disconnected", "err", err)
			}
		}),
		nats.ReconnectHandler(func(*nats.Conn) { o.log.Info("NATS reconnected") }))...)
	if err != nil {
		o.stopNATS()
		if errors.Is(err, nats.ErrAuthorization) && o.cfg.NATSURL != "" {
			return fmt.Errorf("connect to NATS at %s: %w: it wants other credentials (--nats-creds FILE, or a token in $EVOLVE_ORCHESTRATOR_NATS)", url, err)
		}
		return fmt.Errorf("connect to NATS at %s: %w", url, err)
	}
	o.nc, o.natsURL = nc, url
	js, err := jetstream.New(nc)
	if err == nil {
		err = o.openStores(ctx, js)
	}
	if err != nil {
		if o.cfg.ClusterListen != "" || nc.ConnectedClusterName() != "" {
			// Several orchestrators may share it: without the lease each
			// would plan and switch nodes on its own.
			o.stopNATS()
			return fmt.Errorf("the NATS cluster's JetStream (which keeps the planner's lease, roles and pins): %w", err)
		}
		o.log.Warn("no JetStream: role overrides will not survive a restart, and this orchestrator plans alone (no leader lease)", "err", err)
		o.store, o.lease = nil, nil
	}
	if o.cfg.RecordDir != "" {
		return o.startRecording(ctx, js)
	}
	return nil
}

// stopRecording writes the recording's last rows and closes its file.
func (o *Orchestrator) stopRecording() {
	if o.rec == nil {
		return
	}
	o.recCancel()
	<-o.recDone
}

// startRecording starts the recorder of Config.RecordDir, with the
// cluster's salt (a random one when there is no JetStream: ids then agree
// within this router's files only).
func (o *Orchestrator) startRecording(ctx context.Context, js jetstream.JetStream) error {
	var salt uint64
	var err error
	if js != nil && o.store != nil {
		salt, err = recordSalt(ctx, js, o.replicas())
	}
	if js == nil || o.store == nil || err != nil {
		if err != nil {
			o.log.Warn("the recording's block ids are salted for this router alone", "err", err)
		}
		var b [8]byte
		rand.Read(b[:])
		salt = binary.LittleEndian.Uint64(b[:])
	}
	rec, err := newRecorder(o.cfg.RecordDir, o.cfg.Name, salt, o.log)
	if err != nil {
		return err
	}
	o.rec = rec
	o.recDone = make(chan struct{})
	go func() { rec.run(o.recCtx); close(o.recDone) }()
	o.log.Info("recording every request", "dir", o.cfg.RecordDir)
	return nil
}

func (o *Orchestrator) stopNATS() {
	for _, s := range o.subs {
		s.Unsubscribe()
	}
	if o.nc != nil {
		o.nc.Close()
	}
	if o.ns != nil {
		o.ns.Shutdown()
		o.ns.WaitForShutdown()
	}
}
