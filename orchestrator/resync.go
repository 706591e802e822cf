package orchestrator

import (
	"sync"
	"time"

	"github.com/evolvellm/evolve/protocol"
)

// resyncFollowerWait is how long an orchestrator that does not lead
// waits for a resync another asked for before it asks itself.
const resyncFollowerWait = time.Second

// resyncWait is the longest one engine's resync holds the others back
// while its events are read; past it the next one starts anyway.
const resyncWait = 30 * time.Second

// resyncQueue paces KV resyncs: one engine at a time sends its whole KV,
// and the next is asked only once the directory has applied it.
//
// A restarted orchestrator asks every engine to resync at once; each
// answers with every block it holds (millions with big host pools), and
// the events wait, decoded or not, in the event plane's unbounded
// subscription until the directory takes them. Unpaced, four engines of
// 560K blocks held the orchestrator at 2 GB for minutes after a restart;
// paced, one engine's KV is in memory at a time.
type resyncQueue struct {
	slot chan struct{} // held by the resync in progress

	mu     sync.Mutex
	queued map[string]bool // engines waiting for the slot
}

func newResyncQueue() *resyncQueue {
	return &resyncQueue{slot: make(chan struct{}, 1), queued: map[string]bool{}}
}

// resync asks engine id to publish its KV again, when no other resync is
// in progress, and returns once the directory has applied it (or the
// engine is gone, or resyncWait has passed). A resync already queued for
// the engine covers this one: it returns at once.
func (o *Orchestrator) resync(id string) {
	asked := time.Now()
	if !o.leading() && o.hasPeers() {
		// Every orchestrator sees an engine join, and each would ask it
		// for its whole KV: the leader asks, and the others take the
		// events it brings unless they see none begin soon.
		select {
		case <-time.After(resyncFollowerWait):
		case <-o.done():
			return
		}
	}
	q := o.resyncs
	q.mu.Lock()
	if q.queued[id] {
		q.mu.Unlock()
		return
	}
	q.queued[id] = true
	q.mu.Unlock()

	select {
	case q.slot <- struct{}{}:
	case <-o.done():
		return
	}
	defer func() { <-q.slot }()
	// From here on, events lost need another resync: this one may have
	// begun before them.
	q.mu.Lock()
	delete(q.queued, id)
	q.mu.Unlock()

	started, ok := o.startedAt(id)
	if !ok {
		return
	}
	if o.resyncedSince(id, asked) {
		o.met.resyncs.WithLabelValues("shared").Inc()
		return
	}
	t0 := time.Now()
	rep, err := o.control(id, protocol.ControlRequest{Op: protocol.OpResync})
	if err != nil {
		o.met.resyncs.WithLabelValues("failed").Inc() // control logged it
		return
	}
	if rep.Seq == 0 {
		// An engine that does not say how far its resync goes: nothing
		// to wait for.
		o.met.resyncs.WithLabelValues("applied").Inc()
		return
	}
	outcome := o.awaitKVApplied(id, started, rep.Seq, t0.Add(resyncWait))
	o.met.resyncs.WithLabelValues(outcome).Inc()
	o.log.Info("engine KV resynced", "id", id, "blocks", rep.Blocks, "outcome", outcome, "took", time.Since(t0).Round(time.Millisecond))
}

// resyncedSince says whether node id's events began a resync after
// asked (another orchestrator asked for it) and its directory needs no
// other.
func (o *Orchestrator) resyncedSince(id string, asked time.Time) bool {
	o.c.mu.Lock()
	defer o.c.mu.Unlock()
	n := o.c.nodes[id]
	return n != nil && !n.clearedAt.Before(asked) && !o.c.dir.NeedsResync(n.dir)
}

// startedAt is when the process behind node id started, as it registered.
func (o *Orchestrator) startedAt(id string) (time.Time, bool) {
	o.c.mu.Lock()
	defer o.c.mu.Unlock()
	n := o.c.nodes[id]
	if n == nil {
		return time.Time{}, false
	}
	return n.reg.StartedAt, true
}

// awaitKVApplied waits until the directory has applied node id's KV
// events up to seq, and says how it ended: applied; gone, when the node
// went down or another process registered as it (whose events are
// numbered afresh); timeout, at deadline or shutdown.
func (o *Orchestrator) awaitKVApplied(id string, started time.Time, seq uint64, deadline time.Time) string {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		o.c.mu.Lock()
		n := o.c.nodes[id]
		gone := n == nil || n.state == StateDown || n.state == StateRejected || !n.reg.StartedAt.Equal(started)
		done := !gone && o.c.dir.LastSeq(n.dir) >= seq
		o.c.mu.Unlock()
		switch {
		case done:
			return "applied"
		case gone:
			return "gone"
		case time.Now().After(deadline):
			return "timeout"
		}
		select {
		case <-tick.C:
		case <-o.done():
			return "timeout"
		}
	}
}

// done is closed when the orchestrator stops; nil (never) before Run.
func (o *Orchestrator) done() <-chan struct{} {
	if o.ctx == nil {
		return nil
	}
	return o.ctx.Done()
}
