package orchestrator

import (
	"context"
	"sync"
	"time"

	"github.com/evolvellm/evolve/kv"
	"github.com/evolvellm/evolve/orchestrator/routing"
)

// routerQueue holds new requests at the router, first come first served,
// while a queueing policy (Dynamo's router: routing.Queuer) finds every
// engine that prefills busy, as Dynamo's router queue does. The request at
// its head looks again whenever load leaves an engine (a first token, a
// finish: kick) and at least every queuePoll; the others wait their turn.
type routerQueue struct {
	mu      sync.Mutex
	waiting []chan struct{} // in arrival order; the head's is closed
	kicked  chan struct{}   // closed and replaced by kick
}

// queuePoll bounds how long the head waits without a kick (a node that
// joins frees no load, but may take work).
const queuePoll = 100 * time.Millisecond

func newRouterQueue() *routerQueue { return &routerQueue{kicked: make(chan struct{})} }

// kick tells the head of the queue that load left an engine.
func (q *routerQueue) kick() {
	q.mu.Lock()
	close(q.kicked)
	q.kicked = make(chan struct{})
	q.mu.Unlock()
}

// wait returns once busy is false for a request that arrived now, behind
// those already waiting, and reports whether it waited; or returns ctx's
// error when the client leaves first, giving up its place.
func (q *routerQueue) wait(ctx context.Context, busy func() bool) (bool, error) {
	q.mu.Lock()
	if len(q.waiting) == 0 && !busy() {
		q.mu.Unlock()
		return false, nil
	}
	turn := make(chan struct{})
	if len(q.waiting) == 0 {
		close(turn)
	}
	q.waiting = append(q.waiting, turn)
	q.mu.Unlock()
	defer q.leave(turn)
	select {
	case <-turn:
	case <-ctx.Done():
		return true, ctx.Err()
	}
	for {
		q.mu.Lock()
		kicked := q.kicked
		free := !busy()
		q.mu.Unlock()
		if free {
			return true, nil
		}
		select {
		case <-kicked:
		case <-time.After(queuePoll):
		case <-ctx.Done():
			return true, ctx.Err()
		}
	}
}

// leave takes turn out of the queue and, if it was the head, gives the
// next request its turn.
func (q *routerQueue) leave(turn chan struct{}) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for i, c := range q.waiting {
		if c != turn {
			continue
		}
		q.waiting = append(q.waiting[:i], q.waiting[i+1:]...)
		if i == 0 && len(q.waiting) > 0 {
			close(q.waiting[0])
		}
		return
	}
}

// queued waits, for a queueing policy, until the router would route a new
// request (see routerQueue); false when the client left first.
func (o *Orchestrator) queued(ctx context.Context, exclude map[string]bool) bool {
	q, ok := o.policy.(routing.Queuer)
	if !ok {
		return true
	}
	waited, err := o.queue.wait(ctx, func() bool {
		v := o.view(nil, &kv.Match{}, exclude)
		o.policyMu.Lock()
		defer o.policyMu.Unlock()
		return q.Busy(v)
	})
	if waited {
		o.met.routerQueued.Inc()
	}
	return err == nil
}
