package vllm

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"sync"
	"time"

	"github.com/evolvellm/evolve/engine"
	"github.com/evolvellm/evolve/kv"
	"github.com/evolvellm/evolve/protocol"
)

// DefaultPrefillUsPerToken is the router's prefill cost hint for a vLLM
// engine until its own metrics have measured one.
const DefaultPrefillUsPerToken = 100

// scrapeEvery is how often vLLM's metrics are read for heartbeats.
const scrapeEvery = time.Second

// unreachableAfter is how long vLLM may fail to answer before Run gives up:
// an agent whose engine is gone must not keep announcing it.
const unreachableAfter = 15 * time.Second

// Config configures a Replica.
type Config struct {
	ID  string // engine id (a NATS subject token)
	URL string // vLLM's base URL as routers reach it, e.g. http://10.0.0.5:8000
	// LocalURL is where the agent reads vLLM's metrics and models; default URL.
	LocalURL string
	Events   string // vLLM's KV event endpoint, e.g. tcp://10.0.0.5:5557
	Replay   string // its replay endpoint; "" for none
	Topic    string // KV event topic prefix; "" for all
	// EventsBind listens on Events for a publisher that connects
	// (Subscriber.Bind).
	EventsBind bool
	// PassMetrics is where vLLM publishes its forward-pass metrics
	// (--forward-pass-metrics-port), e.g. tcp://10.0.0.5:20380; "" for
	// none. Each pass goes to the planner as a pass record.
	PassMetrics string
	Role        string // initial role: prefill, decode or both (default both)
	// ServedModelName overrides the model name vLLM reports.
	ServedModelName string
	// BlockSize is used when vLLM's metrics do not say (vllm:cache_config_info).
	BlockSize int
	GPUs      int
	// PrefillUsPerToken is the router's prefill cost hint until measured;
	// 0 for DefaultPrefillUsPerToken.
	PrefillUsPerToken float64
	HTTP              *http.Client
	// Token is the engine token the agent sends vLLM (protocol's "The
	// engine token"); the registration says whether vLLM requires it.
	Token  string
	Logger *slog.Logger
	// Changed, if set, is called when the registration changed (a measured
	// prefill cost moved): the caller publishes it again.
	Changed func()
	// MaxNumSeqs and MaxNumBatchedTokens are vLLM's scheduler limits
	// (--max-num-seqs, --max-num-batched-tokens) when known, for the
	// planner; 0: not known.
	MaxNumSeqs, MaxNumBatchedTokens int
	// PriorityScheduling: vLLM runs with --scheduling-policy priority
	// (protocol.Registration.PriorityScheduling).
	PriorityScheduling bool
	// SilentAfter is how long vLLM may serve prompts without a KV event
	// reaching the agent before it warns that events are not configured
	// or not reachable; default 30 s.
	SilentAfter time.Duration
	// Launched says the agent started vLLM itself, with the KV events
	// configured: a silence then has other causes than a missing flag.
	Launched bool
}

// Replica is a vLLM server seen as an evolve engine (engine.Replica): its
// registration, heartbeats and KV events come from vLLM's own interfaces,
// and routers send inference straight to vLLM's OpenAI server. vLLM's
// NixlConnector with kv_role kv_both lets any instance prefill or decode
// per request, so a role is the router's decision: set_role and drain
// change what the agent reports, nothing in vLLM. vLLM manages its own KV
// tiers (SelfManagedKV): offload has nothing to do, fetch and eviction
// hints are refused. Tokens come from vLLM's POST /tokenize (Tokenizer
// "engine"), since its KV events are hashed over its vocabulary.
type Replica struct {
	cfg   Config
	log   *slog.Logger
	start time.Time

	mu sync.Mutex // guards everything below
	tr *Translator
	// leftOutWarned: when blocks left out of the directory were last
	// logged.
	leftOutWarned time.Time
	sink          engine.EventSink
	info          ModelInfo
	load          Load
	base          Load // the first scrape: sums before the agent started
	prefillUs     float64
	role          string
	draining      bool
	lastOK        time.Time
	batches       int // batches handled
	warned        bool
	// tokenRequired: vLLM refused a request without the engine token.
	tokenRequired bool
	// passes counts vLLM's forward passes (heartbeats aside); passWarned:
	// their absence while vLLM served was logged.
	passes     int
	passWarned bool
}

// New returns a replica for the vLLM server of cfg. Call Probe before
// publishing its registration, then Run.
func New(cfg Config) (*Replica, error) {
	if err := protocol.ValidateEngineID(cfg.ID); err != nil {
		return nil, err
	}
	if cfg.URL == "" || cfg.Events == "" {
		return nil, errors.New("vllm: the server's URL and KV event endpoint are both needed")
	}
	cfg.Role = cmp.Or(cfg.Role, "both")
	cfg.LocalURL = cmp.Or(cfg.LocalURL, cfg.URL)
	switch cfg.Role {
	case "prefill", "decode", "both":
	default:
		return nil, fmt.Errorf("role %q: want prefill, decode or both", cfg.Role)
	}
	if cfg.HTTP == nil {
		cfg.HTTP = &http.Client{Timeout: 10 * time.Second}
	}
	if cfg.Token != "" {
		open := *cfg.HTTP
		cfg.HTTP = &open
		cfg.HTTP.Transport = &protocol.BearerTransport{Token: cfg.Token, Base: open.Transport}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.PrefillUsPerToken <= 0 {
		cfg.PrefillUsPerToken = DefaultPrefillUsPerToken
	}
	if cfg.SilentAfter <= 0 {
		cfg.SilentAfter = 30 * time.Second
	}
	return &Replica{cfg: cfg, log: cfg.Logger.With("engine", cfg.ID), start: time.Now(), role: cfg.Role,
		prefillUs: cfg.PrefillUsPerToken}, nil
}

// Probe waits until vLLM answers /v1/models and /metrics and its block
// size is known, or ctx ends. progress, if set, hears each failed try.
func (r *Replica) Probe(ctx context.Context, progress func(err error)) error {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		err := r.probeOnce(ctx)
		if err == nil {
			r.warnIfTooOld(ctx)
			return nil
		}
		if errors.Is(err, ErrUnauthorized) {
			return err // waiting will not change its key
		}
		if progress != nil {
			progress(err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("vLLM at %s is not ready: %w", r.cfg.LocalURL, err)
		case <-tick.C:
		}
	}
}

func (r *Replica) probeOnce(ctx context.Context) error {
	info, err := Models(ctx, r.cfg.HTTP, r.cfg.LocalURL)
	if err != nil {
		return err
	}
	// Whether vLLM requires the token: it refuses a request without.
	required := false
	if r.cfg.Token != "" {
		plain := &http.Client{Timeout: 10 * time.Second}
		_, err := Models(ctx, plain, r.cfg.LocalURL)
		required = errors.Is(err, ErrUnauthorized)
	}
	l, err := ScrapeMetrics(ctx, r.cfg.HTTP, r.cfg.LocalURL)
	if err != nil {
		return err
	}
	bs := cmp.Or(l.BlockSize, r.cfg.BlockSize)
	if bs <= 0 {
		return errors.New("vLLM does not export vllm:cache_config_info with a block size yet; pass the block size")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.info, r.load, r.base, r.lastOK, r.tokenRequired = info, l, l, time.Now(), required
	if r.tr == nil {
		r.tr = NewTranslator(bs)
	}
	return nil
}

// warnIfTooOld says when vLLM's release names no token ids in its
// streams: a router cannot continue its answers elsewhere.
func (r *Replica) warnIfTooOld(ctx context.Context) {
	if version := Version(ctx, r.cfg.HTTP, r.cfg.LocalURL); versionBefore(version, TokenIDsSince) {
		r.log.Warn(fmt.Sprintf("vLLM %s names no token ids in its streams (return_token_ids needs %d.%d.%d or later): should it die mid-stream, its answers end with an error event instead of going on on another engine",
			version, TokenIDsSince[0], TokenIDsSince[1], TokenIDsSince[2]), "vllm_version", version)
	}
}

// SetSink sets where KV events and pass records go (engine.Replica);
// pass records come only with Config.PassMetrics.
func (r *Replica) SetSink(s engine.EventSink) {
	r.mu.Lock()
	r.sink = s
	r.mu.Unlock()
}

// ID returns the engine id.
func (r *Replica) ID() string { return r.cfg.ID }

// Logger returns the replica's logger.
func (r *Replica) Logger() *slog.Logger { return r.log }

// Registration describes the vLLM engine for the orchestrator.
func (r *Replica) Registration(version string) protocol.Registration {
	r.mu.Lock()
	defer r.mu.Unlock()
	var seq uint64
	if r.tr != nil {
		seq = r.tr.LastSeq()
	}
	return protocol.Registration{
		ID: r.cfg.ID, URL: r.cfg.URL, Backend: "vllm", Model: cmp.Or(r.cfg.ServedModelName, r.info.ID),
		GPUs: r.cfg.GPUs, Role: r.role, BlockSize: cmp.Or(r.load.BlockSize, r.cfg.BlockSize),
		GPUBlocks: r.load.GPUBlocks, HostBlocks: r.load.CPUBlocks, MaxModelLen: r.info.MaxModelLen, Speedup: 1,
		Version: version, StartedAt: r.start, LastKVSeq: seq, PrefillUsPerToken: r.prefillUs,
		Tokenizer: "engine", SelfManagedKV: true, TokenRequired: r.tokenRequired,
		PriorityScheduling: r.cfg.PriorityScheduling, MaxNumSeqs: r.cfg.MaxNumSeqs, MaxNumBatchedTokens: r.cfg.MaxNumBatchedTokens,
	}
}

// Heartbeat reports vLLM's load as last scraped.
func (r *Replica) Heartbeat() protocol.Heartbeat {
	r.mu.Lock()
	defer r.mu.Unlock()
	hb := protocol.Heartbeat{ID: r.cfg.ID, Time: time.Now(), Role: r.role, Draining: r.draining,
		Waiting: r.load.Waiting, Running: r.load.Running, GPUKVUsage: r.load.GPUKVUsage,
		TokensTotal: uint64(max(0, r.load.PrefillTokens+r.load.GeneratedTokens))}
	if r.tr != nil {
		hb.LastKVSeq = r.tr.LastSeq()
		hb.KVBlocksLeftOut, hb.KVLeftOutWhy = uint64(r.tr.Ignored+r.tr.Orphans), r.tr.LastLeftOut
		if r.load.CPUBlocks > 0 {
			_, host := r.tr.Blocks()
			hb.HostKVUsage = min(1, float64(host)/float64(r.load.CPUBlocks))
		}
	}
	return hb
}

// Control answers the orchestrator's control requests.
func (r *Replica) Control(_ context.Context, req protocol.ControlRequest) protocol.ControlReply {
	var rep protocol.ControlReply
	err := r.control(req, &rep)
	r.mu.Lock()
	rep.Role, rep.Draining, rep.InFlight = r.role, r.draining, r.load.Running+r.load.Waiting
	r.mu.Unlock()
	if err != nil {
		rep.Error = err.Error()
	} else {
		rep.OK = true
	}
	return rep
}

func (r *Replica) control(req protocol.ControlRequest, rep *protocol.ControlReply) error {
	switch req.Op {
	case protocol.OpStatus:
		return nil
	case protocol.OpSetRole:
		switch req.Role {
		case "prefill", "decode", "both":
		default:
			return fmt.Errorf("role %q: want prefill, decode or both", req.Role)
		}
		r.mu.Lock()
		old := r.role
		r.role, r.draining = req.Role, false
		r.mu.Unlock()
		r.log.Info("role changed", "from", old, "to", req.Role)
		return nil
	case protocol.OpDrain, protocol.OpResume:
		r.mu.Lock()
		r.draining = req.Op == protocol.OpDrain
		r.mu.Unlock()
		return nil
	case protocol.OpOffload:
		return nil // vLLM keeps its KV where its connector puts it; the role change needs no move
	case protocol.OpFetch, protocol.OpHints:
		return fmt.Errorf("%s: vLLM manages its own KV cache", req.Op)
	case protocol.OpResync:
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.tr == nil {
			return errors.New("not probed yet")
		}
		events := r.tr.Snapshot(nil)
		r.publishLocked(events)
		rep.Blocks = len(events) - 1 // all but the AllCleared that opens it
		rep.Seq = events[len(events)-1].Seq
		return nil
	}
	return fmt.Errorf("unknown control op %q", req.Op)
}

func (r *Replica) publishLocked(events []kv.Event) {
	if len(events) > 0 && r.sink != nil {
		r.sink.KVEvents(events)
	}
}

// Run follows vLLM's KV events and metrics until ctx ends. It fails when
// the event stream breaks or vLLM stops answering for 15 s. Call Probe
// first.
func (r *Replica) Run(ctx context.Context) error {
	r.mu.Lock()
	probed := r.tr != nil
	r.mu.Unlock()
	if !probed {
		return errors.New("vllm: Run before a successful Probe")
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	subErr := make(chan error, 1)
	sub := &Subscriber{Endpoint: r.cfg.Events, Replay: r.cfg.Replay, Topic: r.cfg.Topic, Bind: r.cfg.EventsBind, Log: r.log}
	go func() { subErr <- sub.Run(ctx, r.handle) }()
	if r.cfg.PassMetrics != "" {
		ps := &PassSubscriber{Endpoint: r.cfg.PassMetrics, Log: r.log}
		go ps.Run(ctx, r.pass)
	} else {
		r.log.Info("vLLM's forward-pass metrics are not followed, so the planner cannot learn this engine's pass costs and keeps the split: " +
			"start vLLM with --forward-pass-metrics-port PORT (releases that have it; the agent's --pass-metrics-port adds it) " +
			"or give the agent the endpoint with --pass-metrics")
	}
	tick := time.NewTicker(scrapeEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-subErr:
			if err != nil {
				return err
			}
			return nil
		case <-tick.C:
			if err := r.scrape(ctx); err != nil {
				return err
			}
		}
	}
}

// silenceCause is the likely cause of KV events that never arrived.
func (r *Replica) silenceCause() string {
	if r.cfg.Launched {
		return "The agent started vLLM with its KV events on " + r.cfg.Events + ": does this release publish them " +
			"(vLLM's log names the publisher at start), and is nothing else bound to that port?"
	}
	return "Was the server started with --kv-events-config " +
		`'{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5558"}'` +
		" (or its own equivalent), and is that the endpoint the agent was given (--kv-events " + r.cfg.Events + ")? " +
		"The agent connects to it: a publisher must bind its endpoint, and one that connects instead (as llm-d-inference-sim's does) never meets the agent"
}

// handle applies one batch of vLLM's events.
func (r *Replica) handle(b Batch, lost bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.batches++
	var out []kv.Event
	if lost {
		out = r.tr.Clear(out)
	}
	before := r.tr.Ignored + r.tr.Orphans
	for _, ev := range b.Events {
		out = r.tr.Apply(ev, out)
	}
	r.publishLocked(out)
	if left := r.tr.Ignored + r.tr.Orphans; left > before && time.Since(r.leftOutWarned) > time.Minute {
		// Once a minute at most: the router cannot route to what these
		// blocks hold, and nothing else would say so.
		r.leftOutWarned = time.Now()
		r.log.Warn("KV blocks left out of the router's directory", "blocks", left-before, "total", left,
			"orphans", r.tr.Orphans, "why", r.tr.LastLeftOut)
	}
}

// pass hands one forward pass of vLLM's to the planner, as a pass record.
func (r *Replica) pass(fp ForwardPass, at time.Time) {
	rec, ok := fp.Record(at)
	r.mu.Lock()
	first := ok && r.passes == 0
	if ok {
		r.passes++
	}
	sink := r.sink
	r.mu.Unlock()
	if first {
		r.log.Info("vLLM's forward passes are arriving: the planner learns this engine's costs from them", "endpoint", r.cfg.PassMetrics)
	}
	if ok && sink != nil {
		sink.Pass(rec)
	}
}

// scrape refreshes the load and the measured prefill cost.
func (r *Replica) scrape(ctx context.Context) error {
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	l, err := ScrapeMetrics(sctx, r.cfg.HTTP, r.cfg.LocalURL)
	r.mu.Lock()
	if err != nil {
		since := time.Since(r.lastOK)
		r.mu.Unlock()
		if ctx.Err() != nil {
			return nil
		}
		if since > unreachableAfter {
			return fmt.Errorf("vLLM at %s has not answered for %s: %w", r.cfg.LocalURL, since.Round(time.Second), err)
		}
		r.log.Warn("vLLM metrics unreadable", "err", err)
		return nil
	}
	r.load, r.lastOK = l, time.Now()
	if bs := max(l.BlockSize, r.cfg.BlockSize, 1); !r.warned && r.batches == 0 && l.PrefillTokens-r.base.PrefillTokens >= float64(2*bs) &&
		time.Since(r.start) > r.cfg.SilentAfter {
		// Serving prompts that filled blocks, without events: the router
		// cannot see this engine's cache. (A prompt shorter than a block
		// stores none, and says nothing.)
		r.warned = true
		r.log.Warn("vLLM serves requests but no KV event has reached the agent; until one does, routing cannot use this engine's prefix cache. "+r.silenceCause(),
			"kv_events", r.cfg.Events, "url", r.cfg.LocalURL)
	}
	if r.cfg.PassMetrics != "" && !r.passWarned && r.passes == 0 && time.Since(r.start) > r.cfg.SilentAfter &&
		l.PrefillTokens+l.GeneratedTokens > r.base.PrefillTokens+r.base.GeneratedTokens {
		// Serving, yet no pass has come.
		r.passWarned = true
		r.log.Warn("vLLM serves requests but none of its forward passes has reached the agent: is vLLM started with --forward-pass-metrics-port on that port, and does its release have it? "+
			"Until they arrive the planner cannot learn this engine's pass costs", "endpoint", r.cfg.PassMetrics)
	}
	changed := false
	if tok := l.PrefillTokens - r.base.PrefillTokens; tok >= 10000 {
		us := (l.PrefillSeconds - r.base.PrefillSeconds) / tok * 1e6
		if us > 0 && math.Abs(us-r.prefillUs) > 0.25*r.prefillUs {
			r.log.Info("prefill cost measured", "us_per_token", fmt.Sprintf("%.1f", us), "was", fmt.Sprintf("%.1f", r.prefillUs))
			r.prefillUs, changed = us, true
		}
	}
	r.mu.Unlock()
	if changed && r.cfg.Changed != nil {
		r.cfg.Changed()
	}
	return nil
}
