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
// engine that prefills busy, as Dynamo's router queue does. One request
// at a time has the turn: it looks whenever load leaves an engine (a first
// token, a finish: kick) and at least every queuePoll, and keeps the turn
// until it is routed, so that the next one sees its load (a freed slot
// lets one request through, not the whole queue).
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

// wait returns once a request that arrived now has the turn, behind those
// already waiting, and busy is false; release, to be called once the
// request is routed, passes the turn on. waited says whether it found the
// engines busy. When the client leaves first, wait gives up its place and
// returns ctx's error.
func (q *routerQueue) wait(ctx context.Context, busy func() bool) (release func(), waited bool, err error) {
	turn := make(chan struct{})
	q.mu.Lock()
	if len(q.waiting) == 0 {
		close(turn)
	}
	q.waiting = append(q.waiting, turn)
	q.mu.Unlock()
	release = sync.OnceFunc(func() { q.leave(turn) })
	select {
	case <-turn:
	case <-ctx.Done():
		release()
		return nil, true, ctx.Err()
	}
	for {
		q.mu.Lock()
		kicked := q.kicked
		q.mu.Unlock()
		if !busy() {
			return release, waited, nil
		}
		waited = true
		select {
		case <-kicked:
		case <-time.After(queuePoll):
		case <-ctx.Done():
			release()
			return nil, true, ctx.Err()
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
// request (see routerQueue), and returns the function to call once it is
// routed; ok is false when the client left first. For other policies it
// returns at once.
func (o *Orchestrator) queued(ctx context.Context, exclude map[string]bool) (routed func(), ok bool) {
	q, isQueuer := o.policy.(routing.Queuer)
	if !isQueuer {
		return func() {}, true
	}
	release, waited, err := o.queue.wait(ctx, func() bool {
		v := o.view(nil, &kv.Match{}, exclude)
		o.policyMu.Lock()
		defer o.policyMu.Unlock()
		return q.Busy(v)
	})
	if waited {
		o.met.routerQueued.Inc()
	}
	if err != nil {
		return nil, false
	}
	return release, true
}
