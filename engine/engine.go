// Package engine is the engine agent: the process that serves one model
// replica. It speaks OpenAI's HTTP API to clients and routers, vLLM's
// kv_transfer_params flow for disaggregated prefill and decode, and the engine
// protocol (package protocol) over NATS to the orchestrator.
//
// Simulated is the "sim" backend: the step model of package engine/stepmodel run
// against the wall clock, sped up by Config.Speedup. Times that the engine
// reports (latency histograms, usage, pass records) are the model's
// (virtual) times, so a sped-up engine reports what the hardware would see.
// The "vllm" backend (package engine/vllm) is another Replica on the same
// event plane.
package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/evolvellm/evolve/engine/stepmodel"
	"github.com/evolvellm/evolve/kv"
	"github.com/evolvellm/evolve/protocol"
	"github.com/evolvellm/evolve/roles"
)

// Config configures an engine agent.
type Config struct {
	ID               string             // engine id (a NATS subject token)
	Profile          *stepmodel.Profile // hardware and model
	Sim              stepmodel.Config   // scheduler overrides
	ServedModelName  string             // default: the profile's model
	Role             roles.Role
	Speedup          float64 // modelled seconds per wall second; default 1
	AdvertiseURL     string  // base URL peers and routers use to reach this engine
	DefaultMaxTokens int     // for requests without max_tokens; default 256 (chat) / 16 (completions, as OpenAI)
	// Token, when set, is required of requests to /v1/ and /evolve/v1/
	// (Authorization: Bearer TOKEN), and sent to the peers it pulls KV
	// from: see protocol's "The engine token".
	Token  string
	Logger *slog.Logger
}

// Simulated is a running simulated engine. Create it with NewSimulated,
// start its loop with Run, and serve Handler over HTTP.
type Simulated struct {
	cfg   Config
	log   *slog.Logger
	clock *virtualClock

	mu      sync.Mutex // guards model, pending and the fields below
	model   *stepmodel.Model
	pending map[string]*pending
	wake    chan struct{}
	nextID  uint64
	snap    snapshot

	// passEnd is where the model's timeline stands while the loop is busy:
	// the end of the pass in progress. Passes run back to back on that
	// timeline even when the loop wakes a little late (see Run), so what
	// the model is told happened in between is dated no later than this.
	passEnd time.Time
	busy    bool
	// handingOver: told to hand its decodes over (protocol.OpHandOver),
	// the engine ends each movable request as soon as it has output.
	handingOver bool
	// orphanHoldWait is how long a draining engine with nothing in
	// flight but KV held for peers waits for them to pull it.
	orphanHoldWait time.Duration

	sink  EventSink
	met   *metrics
	start time.Time
	peers *http.Client // to other engines, with the engine token
}

// EventSink receives what the engine publishes: KV events and pass records
// after every pass. Calls come from the engine loop and must not block.
type EventSink interface {
	KVEvents(events []kv.Event)
	Pass(rec protocol.PassRecord)
}

// snapshot is the state last reported, for metrics and heartbeats.
type snapshot struct {
	stats    stepmodel.PassStats
	counters stepmodel.Counters
}

// NewSimulated builds a simulated engine; it serves nothing until Run is
// called.
func NewSimulated(cfg Config) (*Simulated, error) {
	if cfg.Profile == nil {
		return nil, errors.New("engine: no profile")
	}
	if err := protocol.ValidateEngineID(cfg.ID); err != nil {
		return nil, err
	}
	if cfg.Speedup <= 0 {
		cfg.Speedup = 1
	}
	if cfg.ServedModelName == "" {
		cfg.ServedModelName = cfg.Profile.Model
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	e := &Simulated{
		cfg:     cfg,
		log:     cfg.Logger.With("engine", cfg.ID),
		clock:   newVirtualClock(time.Now(), cfg.Speedup),
		model:   stepmodel.NewModel(cfg.Profile, cfg.Sim),
		pending: map[string]*pending{},
		wake:    make(chan struct{}, 1),
		start:   time.Now(),
		peers:   &http.Client{Timeout: 30 * time.Second, Transport: &protocol.BearerTransport{Token: cfg.Token}},

		orphanHoldWait: orphanHoldWait,
	}
	e.model.SetRole(cfg.Role)
	e.met = newMetrics(e)
	return e, nil
}

// SetSink sets where KV events and pass records go (nil: nowhere). Call it
// before Run.
func (e *Simulated) SetSink(s EventSink) { e.sink = s }

// Logger returns the engine's logger.
func (e *Simulated) Logger() *slog.Logger { return e.log }

// ID returns the engine id.
func (e *Simulated) ID() string { return e.cfg.ID }

// Model returns the served model name.
func (e *Simulated) Model() string { return e.cfg.ServedModelName }

// Registration describes this engine for the orchestrator.
func (e *Simulated) Registration(version string) protocol.Registration {
	e.mu.Lock()
	defer e.mu.Unlock()
	p := e.model.Profile()
	c := e.model.Config()
	return protocol.Registration{
		ID: e.cfg.ID, URL: e.cfg.AdvertiseURL, Backend: "sim", Model: e.cfg.ServedModelName,
		Profile: p.Name, GPUs: p.GPUs, Role: e.model.Role().String(), BlockSize: p.BlockSize,
		GPUBlocks: c.GPUBlocks, HostBlocks: c.HostBlocks, KVBytesPerToken: p.KVBytesPerToken,
		MaxModelLen: p.MaxModelLen, Speedup: e.cfg.Speedup, Version: version, StartedAt: e.start,
		LastKVSeq: e.model.LastEventSeq(), PrefillUsPerToken: p.PrefillTokenSec(1) * 1e6, HostGBps: p.HostGBps,
		NetworkGBps: p.NetworkGBps, MaxNumSeqs: c.MaxNumSeqs, MaxNumBatchedTokens: c.MaxNumBatchedTokens, CanHandOver: true, PromptTokens: true, TokenRequired: e.cfg.Token != "",
	}
}

// Heartbeat reports the engine's current load.
func (e *Simulated) Heartbeat() protocol.Heartbeat {
	e.mu.Lock()
	defer e.mu.Unlock()
	st := e.snap.stats
	return protocol.Heartbeat{
		ID: e.cfg.ID, Time: time.Now(), Role: e.model.Role().String(), Draining: e.model.Draining(),
		Waiting: st.Waiting, Running: st.Running, Held: st.Held,
		GPUKVUsage: ratio(st.GPUBlocksUsed, st.GPUBlocks), HostKVUsage: ratio(st.HostBlocksUsed, st.HostBlocks),
		LastKVSeq: e.model.LastEventSeq(),
	}
}

func ratio(a, b int) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

func (e *Simulated) poke() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// maxLag is how far (in modelled time) an engine may run behind the wall
// clock before it gives up catching up and resynchronises.
const maxLag = 200 * time.Millisecond

// Run steps the model until ctx ends: one forward pass at a time, each taking
// its modelled duration divided by the speedup in wall time. Tokens are
// delivered when their pass ends.
func (e *Simulated) Run(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var (
		tokens   []stepmodel.Token
		finished []stepmodel.Finished
		events   []kv.Event
	)
	for {
		e.mu.Lock()
		now := e.clock.Now()
		if e.busy && now.Sub(e.passEnd) < maxLag {
			// Back-to-back passes: the next starts where the last ended.
			// Waking late (timer slack, scheduling) must not stretch the
			// modelled time; the absolute wall deadlines catch up.
			now = e.passEnd
		}
		d, out := e.model.Step(now)
		e.busy, e.passEnd = !out.Idle, out.Start.Add(d)
		tokens = append(tokens[:0], out.Tokens...)
		finished = append(finished[:0], out.Finished...)
		for i := range finished { // the model reuses its buffers
			finished[i].Blocks = append([]kv.BlockHash(nil), finished[i].Blocks...)
		}
		events = append(events[:0], out.Events...)
		e.snap.stats, e.snap.counters = out.Stats, e.model.Counters()
		var wait time.Duration
		idle := out.Idle
		if idle {
			wait = time.Hour
			if next, ok := e.model.NextWake(out.Start); ok {
				wait = max(e.clock.WallUntil(next), time.Millisecond)
			}
		} else {
			wait = e.clock.WallUntil(out.Start.Add(d))
		}
		e.mu.Unlock()

		if len(events) > 0 && e.sink != nil {
			e.sink.KVEvents(events)
		}
		if !idle {
			e.met.observePass(d)
			if e.sink != nil {
				e.sink.Pass(passRecord(out.Start, d, &out.Stats))
			}
		}
		if wait > 0 {
			timer.Reset(wait)
			select {
			case <-ctx.Done():
				e.shutdown()
				return
			case <-timer.C:
			case <-e.wake:
				if !idle { // a pass is in progress: it still takes its time
					select {
					case <-ctx.Done():
						e.shutdown()
						return
					case <-timer.C:
					}
				} else {
					timer.Stop() // Go 1.23+: no stale value is left in timer.C
				}
			}
		} else if ctx.Err() != nil {
			e.shutdown()
			return
		}
		if !idle {
			e.deliver(tokens, finished, out.Start.Add(d))
		}
	}
}

func passRecord(start time.Time, d time.Duration, st *stepmodel.PassStats) protocol.PassRecord {
	return protocol.PassRecord{
		Start: start, DurationSec: d.Seconds(), PrefillTokens: st.PrefillTokens, PrefillAttended: st.PrefillAttended,
		DecodeSeqs: st.DecodeSeqs, DecodeContext: st.DecodeContext, HostLoadBlocks: st.HostLoadBlocks,
		OffloadBlocks: st.OffloadBlocks, Preemptions: st.Preemptions, Waiting: st.Waiting, Running: st.Running,
		GPUKVUsage: ratio(st.GPUBlocksUsed, st.GPUBlocks), HostKVUsage: ratio(st.HostBlocksUsed, st.HostBlocks),
	}
}

// deliver hands a pass's tokens and finishes to the waiting handlers.
func (e *Simulated) deliver(tokens []stepmodel.Token, finished []stepmodel.Finished, end time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, t := range tokens {
		if p := e.pending[t.ReqID]; p != nil {
			if !p.lastToken.IsZero() {
				e.met.itl.Observe(end.Sub(p.lastToken).Seconds())
			}
			p.lastToken = end
			p.push(t, nil)
		}
	}
	for i := range finished {
		f := &finished[i]
		p := e.pending[f.ReqID]
		if p == nil {
			continue
		}
		delete(e.pending, f.ReqID)
		e.met.observeFinished(f)
		fc := *f
		p.push(stepmodel.Token{}, &fc)
	}
	if e.handingOver {
		e.handOver(end)
	}
}

// handOver takes every movable request that has output off the model,
// holding its KV for the peer that will continue it, and tells its
// handler. Call with e.mu held, between passes.
func (e *Simulated) handOver(now time.Time) {
	for id, p := range e.pending {
		if !p.movable {
			continue
		}
		mg, ok := e.model.HandOver(now, id)
		if !ok { // not decoding yet: at a later pass
			continue
		}
		delete(e.pending, id)
		e.met.handedOver.Inc()
		p.moved(&moved{Migrated: mg, kv: e.transferParams(id, mg.Chain)})
	}
}

func (e *Simulated) shutdown() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for id, p := range e.pending {
		p.fail(errors.New("engine shutting down"))
		delete(e.pending, id)
	}
}

// pending is a request whose handler is waiting for output.
type pending struct {
	lastToken time.Time // virtual time of the last token; guarded by Engine.mu
	// movable: its client (a router) takes a handover (HeaderHandOver).
	movable bool

	mu       sync.Mutex
	tokens   []stepmodel.Token
	finished *stepmodel.Finished
	handed   *moved
	err      error
	notify   chan struct{}
}

// moved is a request the engine handed over: what a peer needs to go on.
type moved struct {
	stepmodel.Migrated
	kv map[string]any // kv_transfer_params naming this engine's hold
}

func (p *pending) moved(m *moved) {
	p.mu.Lock()
	p.handed = m
	p.mu.Unlock()
	p.wake()
}

// wake tells the request's handler there is something to take.
func (p *pending) wake() {
	select {
	case p.notify <- struct{}{}:
	default:
	}
}

func newPending() *pending { return &pending{notify: make(chan struct{}, 1)} }

func (p *pending) push(tok stepmodel.Token, f *stepmodel.Finished) {
	p.mu.Lock()
	if f != nil {
		p.finished = f
	} else {
		p.tokens = append(p.tokens, tok)
	}
	p.mu.Unlock()
	p.wake()
}

func (p *pending) fail(err error) {
	p.mu.Lock()
	p.err = err
	p.mu.Unlock()
	p.wake()
}

// take returns the tokens delivered since the last call, the finish if the
// request is done, its handover if it moved, and an error if the engine
// gave up on it.
func (p *pending) take(buf []stepmodel.Token) ([]stepmodel.Token, *stepmodel.Finished, *moved, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	buf = append(buf[:0], p.tokens...)
	p.tokens = p.tokens[:0]
	return buf, p.finished, p.handed, p.err
}

// modelNow is the time to tell the model of something happening now, on
// its timeline: the clock's time, but no later than the end of the pass in
// progress. A loop that wakes late runs its next pass from where the last
// one ended (Run), and a request that arrived in that slack would
// otherwise be scheduled before it arrived (a negative queue time). Call
// with e.mu held.
func (e *Simulated) modelNow() time.Time {
	now := e.clock.Now()
	if e.busy && now.After(e.passEnd) && now.Sub(e.passEnd) < maxLag {
		return e.passEnd
	}
	return now
}

// submit queues a request with the model and registers its handler;
// movable says its client takes a handover.
func (e *Simulated) submit(r stepmodel.Request, movable bool) (*pending, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.model.Submit(e.modelNow(), r); err != nil {
		return nil, err
	}
	p := newPending()
	p.movable = movable
	e.pending[r.ID] = p
	e.poke()
	return p, nil
}

// abort drops a request (its client went away) and frees its KV.
func (e *Simulated) abort(id string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.model.Abort(e.modelNow(), id); ok {
		e.met.aborted.Inc()
	}
	delete(e.pending, id)
	e.poke() // refresh the reported state
}

func (e *Simulated) newRequestID(prefix string) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.nextID++
	return fmt.Sprintf("%s-%s-%d", prefix, e.cfg.ID, e.nextID)
}

// Drain stops taking new requests (they get 503) and waits until every
// request in flight has finished, or ctx ends. It reports how many were
// still in flight when it returned.
func (e *Simulated) Drain(ctx context.Context) int {
	return e.drain(ctx, false)
}

// Leave drains the engine before it stops, as Drain does, but hands the
// answers its router streams over (as protocol.OpHandOver does) instead
// of finishing them: the router continues each on a peer decode node,
// which pulls its KV, so that the engine stops in seconds rather than when
// its longest answer ends. An answer no peer takes comes back
// (protocol.HandOverNever) and is finished here.
func (e *Simulated) Leave(ctx context.Context) int {
	return e.drain(ctx, true)
}

// orphanHoldWait: a peer pulls the KV it is handed at once (a router
// sends the decode leg, or the continuation of an answer handed over, as
// soon as it reads the hand-off, and the peer gives up a pull after
// pullTimeout). KV still held this long after everything else has ended
// was handed to a router that went away: no one will pull it.
const orphanHoldWait = 2 * pullTimeout

func (e *Simulated) drain(ctx context.Context, handOver bool) int {
	e.mu.Lock()
	e.model.SetDraining(true)
	if handOver {
		e.handingOver = true
	}
	e.mu.Unlock()
	e.poke()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var onlyHolds time.Time // since when nothing but holds is in flight
	for {
		e.mu.Lock()
		// A request the model has finished may still have its last pass's
		// tokens on the way to its client: wait for the handlers too.
		n := max(e.model.InFlight(), len(e.pending))
		if held := e.model.Held(); held == 0 || n != held || len(e.pending) != 0 {
			onlyHolds = time.Time{}
		} else if onlyHolds.IsZero() {
			onlyHolds = time.Now()
		} else if waited := time.Since(onlyHolds); waited >= e.orphanHoldWait {
			e.log.Warn("no peer pulled the KV held for it; ending the holds", "holds", e.model.DropHolds(),
				"waited", waited.Round(time.Millisecond).String())
			n = e.model.InFlight()
		}
		e.mu.Unlock()
		if n == 0 {
			e.poke() // refresh the reported state
			return 0
		}
		select {
		case <-ctx.Done():
			return n
		case <-tick.C:
		}
	}
}

// Control runs one control operation (see protocol.ControlRequest).
func (e *Simulated) Control(ctx context.Context, req protocol.ControlRequest) protocol.ControlReply {
	var rep protocol.ControlReply
	err := e.control(ctx, req, &rep)
	e.mu.Lock()
	rep.Role, rep.Draining, rep.InFlight = e.model.Role().String(), e.model.Draining(), e.model.InFlight()
	e.mu.Unlock()
	if err != nil {
		rep.Error = err.Error()
	} else {
		rep.OK = true
	}
	return rep
}

func (e *Simulated) control(ctx context.Context, req protocol.ControlRequest, rep *protocol.ControlReply) error {
	switch req.Op {
	case protocol.OpStatus:
		return nil
	case protocol.OpSetRole:
		r, err := roles.Parse(req.Role)
		if err != nil {
			return err
		}
		e.mu.Lock()
		old := e.model.Role()
		e.model.SetRole(r)
		e.handingOver = false
		e.mu.Unlock()
		e.poke()
		e.met.setRole(r)
		e.log.Info("role changed", "from", old.String(), "to", r.String())
		return nil
	case protocol.OpDrain, protocol.OpResume:
		e.mu.Lock()
		e.model.SetDraining(req.Op == protocol.OpDrain)
		e.handingOver = false
		e.mu.Unlock()
		e.log.Info(req.Op)
		return nil
	case protocol.OpHandOver:
		// No drain: a decode leg its router sent before the switch began
		// is still taken, and handed over at its first token, rather
		// than refused and its prompt prefilled again elsewhere.
		e.mu.Lock()
		e.handingOver = true
		n := 0
		for _, p := range e.pending {
			if p.movable {
				n++
			}
		}
		e.mu.Unlock()
		e.poke()
		e.log.Info("handing decodes over", "movable_requests", n)
		return nil
	case protocol.OpOffload:
		e.mu.Lock()
		n, d := e.model.OffloadGPU(e.modelNow())
		e.mu.Unlock()
		e.poke()
		rep.Blocks, rep.Seconds = n, d.Seconds()
		return nil
	case protocol.OpFetch:
		n, d, err := e.fetch(ctx, req.Peer, req.Blocks, req.From)
		rep.Blocks, rep.Seconds = n, d.Seconds()
		return err
	case protocol.OpHints:
		hints := make([]stepmodel.Hint, len(req.Hints))
		for i, h := range req.Hints {
			hints[i] = stepmodel.Hint{Hash: h.Hash, Priority: h.Priority}
		}
		e.mu.Lock()
		e.model.SetHints(hints)
		e.mu.Unlock()
		return nil
	case protocol.OpResync:
		e.mu.Lock()
		rep.Blocks = e.model.Resync()
		rep.Seq = e.model.LastEventSeq()
		e.mu.Unlock()
		e.poke()
		return nil
	}
	return fmt.Errorf("unknown control op %q", req.Op)
}

// fetch asks peer how much of blocks it holds and pulls that part into the
// host tier, at the profile's network bandwidth.
func (e *Simulated) fetch(ctx context.Context, peer string, blocks []kv.BlockHash, from int) (int, time.Duration, error) {
	if peer == "" || len(blocks) == 0 {
		return 0, 0, errors.New("fetch needs a peer and blocks")
	}
	var rep protocol.LookupReply
	if err := e.postJSON(ctx, peer+"/evolve/v1/kv/lookup", protocol.LookupRequest{Blocks: blocks}, &rep); err != nil {
		return 0, 0, fmt.Errorf("ask %s for blocks: %w", peer, err)
	}
	if rep.Local <= from {
		return 0, 0, nil
	}
	e.mu.Lock()
	now := e.modelNow()
	ready, n := e.model.Fetch(now, blocks[:rep.Local], from, 0)
	e.mu.Unlock()
	e.poke()
	return n, ready.Sub(now), nil
}

// lookup answers a peer's question about a chain.
func (e *Simulated) lookup(blocks []kv.BlockHash) protocol.LookupReply {
	e.mu.Lock()
	defer e.mu.Unlock()
	g, l := e.model.Lookup(blocks)
	return protocol.LookupReply{Engine: e.cfg.ID, GPU: g, Local: l}
}

// release ends a prefill leg's hold and returns its blocks.
func (e *Simulated) release(id string) ([]kv.BlockHash, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	b, ok := e.model.Release(id)
	e.poke() // refresh the reported state
	return append([]kv.BlockHash(nil), b...), ok
}
