package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/evolvellm/evolve/kv"
	"github.com/evolvellm/evolve/protocol"
	"github.com/nats-io/nats.go"
)

// flushInterval is how often buffered KV events and pass records are
// published; events are never reordered.
const flushInterval = 50 * time.Millisecond

// maxBatch is the most events or pass records in one message.
const maxBatch = 2048

// Replica is one model replica as the event plane sees it, whatever its
// backend: an Engine (the simulated GPU) or an adapter over another server
// (package engine/vllm).
type Replica interface {
	ID() string
	Registration(version string) protocol.Registration
	Heartbeat() protocol.Heartbeat
	Control(ctx context.Context, req protocol.ControlRequest) protocol.ControlReply
	// SetSink sets where KV events and pass records go.
	SetSink(EventSink)
	Logger() *slog.Logger
}

// NATSAgent connects a replica to the event plane: it registers it,
// publishes heartbeats, KV events and pass records, and answers control
// requests (see package protocol for subjects and schemas).
type NATSAgent struct {
	e       Replica
	nc      *nats.Conn
	version string

	mu     sync.Mutex
	events []kv.Event
	passes []protocol.PassRecord
	kick   chan struct{}
	subs   []*nats.Subscription
	fence  fenceGuard // refuses a deposed planner leader's role commands
	// rejected is why the cluster rejected the replica ("" while it is
	// accepted), and rejectedAt since when; onRejected, when set, is
	// told each rejection.
	rejected   string
	rejectedAt time.Time
}

// judged takes the orchestrator's verdict on the registration: the engine
// says it in its own log, since its operator may read no other.
func (a *NATSAgent) judged(reason string) {
	a.mu.Lock()
	was := a.rejected
	a.rejected = reason
	if reason != "" && was == "" {
		a.rejectedAt = time.Now()
	}
	a.mu.Unlock()
	switch {
	case reason != "" && reason != was:
		a.e.Logger().Error("the cluster rejected this engine: it serves no request until that is fixed", "reason", reason)
	case reason == "" && was != "":
		a.e.Logger().Info("the cluster accepts this engine now")
	}
}

// Rejected says why the cluster rejects the replica and since when ("":
// it is accepted, or has not been judged).
func (a *NATSAgent) Rejected() (string, time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.rejected, a.rejectedAt
}

// AttachNATS makes nc the replica's event plane. Call before the replica
// runs; then run the agent with Run.
func AttachNATS(e Replica, nc *nats.Conn, version string) *NATSAgent {
	a := &NATSAgent{e: e, nc: nc, version: version, kick: make(chan struct{}, 1)}
	e.SetSink(a)
	return a
}

// KVEvents buffers events for publication (EventSink).
func (a *NATSAgent) KVEvents(events []kv.Event) {
	a.mu.Lock()
	a.events = append(a.events, events...)
	full := len(a.events) >= maxBatch
	a.mu.Unlock()
	if full {
		a.poke()
	}
}

// Pass buffers a pass record for publication (EventSink).
func (a *NATSAgent) Pass(rec protocol.PassRecord) {
	a.mu.Lock()
	a.passes = append(a.passes, rec)
	a.mu.Unlock()
}

func (a *NATSAgent) poke() {
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// Start subscribes to control requests and announcements and registers the
// engine; when it returns, control requests are answered. ctx bounds the
// control operations that it starts.
func (a *NATSAgent) Start(ctx context.Context) error {
	id := a.e.ID()
	ctrl, err := a.nc.Subscribe(protocol.ControlSubject(id), func(m *nats.Msg) {
		var req protocol.ControlRequest
		var rep protocol.ControlReply
		if err := json.Unmarshal(m.Data, &req); err != nil {
			rep.Error = fmt.Sprintf("malformed control request: %v", err)
		} else if req.Op == protocol.OpRegistered {
			a.judged(req.Reason)
			rep.OK = true
		} else if err := a.fence.admit(req.Op, req.Fence); err != nil {
			rep.Error = err.Error()
			a.e.Logger().Warn("role command refused", "err", err)
		} else {
			// Control runs off the subscription goroutine: a fetch waits on a peer.
			go func() {
				rep := a.e.Control(ctx, req)
				a.respond(m, rep)
			}()
			return
		}
		a.respond(m, rep)
	})
	if err != nil {
		return fmt.Errorf("subscribe to control: %w", err)
	}
	ann, err := a.nc.Subscribe(protocol.SubjectAnnounce, func(*nats.Msg) { a.register() })
	if err != nil {
		ctrl.Unsubscribe()
		return fmt.Errorf("subscribe to announcements: %w", err)
	}
	a.subs = []*nats.Subscription{ctrl, ann}
	a.nc.SetReconnectHandler(func(*nats.Conn) { a.register() })
	a.register()
	if err := a.nc.FlushTimeout(5 * time.Second); err != nil {
		a.e.Logger().Warn("NATS not reachable yet; the engine will register when it is", "err", err)
	}
	return nil
}

// Run publishes heartbeats, KV events and pass records until ctx ends, then
// deregisters. Call Start first.
func (a *NATSAgent) Run(ctx context.Context) error {
	id := a.e.ID()
	defer func() {
		for _, s := range a.subs {
			s.Unsubscribe()
		}
	}()

	flush := time.NewTicker(flushInterval)
	defer flush.Stop()
	beat := time.NewTicker(protocol.HeartbeatInterval)
	defer beat.Stop()
	a.heartbeat()
	for {
		select {
		case <-ctx.Done():
			if !a.nc.IsConnected() {
				// The event plane is gone (its orchestrator stopped
				// first): nobody to tell, and a flush would wait out its
				// 10 s timeout.
				return nil
			}
			a.flush()
			a.publish(protocol.SubjectDeregister, protocol.Deregistration{ID: id})
			_ = a.nc.FlushTimeout(2 * time.Second)
			return nil
		case <-flush.C:
			a.flush()
		case <-a.kick:
			a.flush()
		case <-beat.C:
			a.heartbeat()
		}
	}
}

func (a *NATSAgent) respond(m *nats.Msg, rep protocol.ControlReply) {
	b, _ := json.Marshal(rep)
	if err := m.Respond(b); err != nil {
		a.e.Logger().Warn("control reply not sent", "err", err)
	}
}

// Register publishes the replica's registration again, for a replica
// whose registration changed (a measured cost).
func (a *NATSAgent) Register() { a.register() }

func (a *NATSAgent) register() {
	a.publish(protocol.SubjectRegister, a.e.Registration(a.version))
}

func (a *NATSAgent) heartbeat() {
	a.publish(protocol.HeartbeatSubject(a.e.ID()), a.e.Heartbeat())
}

func (a *NATSAgent) publish(subject string, v any) {
	b, err := json.Marshal(v)
	if err == nil {
		err = a.nc.Publish(subject, b)
	}
	if err != nil {
		a.e.Logger().Warn("publish failed", "subject", subject, "err", err)
	}
}

// flush publishes buffered events and pass records in order.
func (a *NATSAgent) flush() {
	a.mu.Lock()
	events, passes := a.events, a.passes
	a.events, a.passes = nil, nil
	a.mu.Unlock()
	id := a.e.ID()
	for len(events) > 0 {
		n := min(len(events), maxBatch)
		a.publish(protocol.KVSubject(id), protocol.KVEventBatch{Engine: id, Events: events[:n]})
		events = events[n:]
	}
	for len(passes) > 0 {
		n := min(len(passes), maxBatch)
		a.publish(protocol.StatsSubject(id), protocol.StatsBatch{Engine: id, Passes: passes[:n]})
		passes = passes[n:]
	}
}
