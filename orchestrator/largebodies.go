package orchestrator

import (
	"context"
	"net/http"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/evolvellm/evolve/openaiapi"
	"golang.org/x/sync/semaphore"
)

// largeBody is the body size from which a request's reading, parsing,
// tokenizing and hashing take room in the router's budget for large
// bodies: an agent's usual turn (a 128K-token context is about 500 KB of
// text) never waits for it.
const largeBody = 1 << 20

// hugeBody is the body size after whose request, once no such request is
// left, the router gives the memory it took back to the system.
const hugeBody = 8 << 20

// freeMemoryEvery spaces the router's returns of memory: each is a full
// collection.
const freeMemoryEvery = 5 * time.Second

// largeBodies bounds the work the router does at once on large request
// bodies: each costs about three times its size in memory (the body, its
// members, its prompt's text and ids) and CPU in proportion before the
// cheap checks can refuse it. A body over largeBody waits for room for
// its size in the budget while it is read and parsed; its room is free
// again once the request is routed (or refused), so that a long answer
// does not hold it.
type largeBodies struct {
	budget int64
	sem    *semaphore.Weighted
	waits  atomic.Int64 // requests that found no room at once
	inWork atomic.Int64 // bytes of bodies read and parsed now

	mu       sync.Mutex
	huge     int       // requests with a huge body not yet answered
	lastFree time.Time // the last return of memory
	pending  bool      // a return of memory is scheduled
	freed    atomic.Int64
}

func newLargeBodies(budget int64) *largeBodies {
	return &largeBodies{budget: budget, sem: semaphore.NewWeighted(budget)}
}

// bodyWork is a request's room in the budget, held from its body's
// reading to its routing.
type bodyWork struct {
	l      *largeBodies
	weight int64
	size   int64 // the body's, once read
	once   sync.Once
}

type bodyWorkKey struct{}

// trackBodies gives each request that may carry a prompt a bodyWork, which
// readRequestBody fills and doneWithBody or the request's end frees.
func (o *Orchestrator) trackBodies(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			h.ServeHTTP(w, r)
			return
		}
		bw := &bodyWork{l: o.bodies}
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), bodyWorkKey{}, bw)))
		bw.done()
		if bw.size >= hugeBody {
			o.bodies.hugeDone()
		}
	})
}

// admit waits for room for a body that declares n bytes (-1: not said,
// counted as the largest body taken), until ctx ends.
func (bw *bodyWork) admit(ctx context.Context, n int64) error {
	if bw == nil || bw.weight > 0 || (n >= 0 && n <= largeBody) {
		return nil // small, or admitted already (a Messages request, read again as a chat)
	}
	if n < 0 || n > openaiapi.MaxBodyBytes {
		n = openaiapi.MaxBodyBytes
	}
	w := min(n, bw.l.budget)
	if !bw.l.sem.TryAcquire(w) {
		bw.l.waits.Add(1)
		if err := bw.l.sem.Acquire(ctx, w); err != nil {
			return err
		}
	}
	bw.weight = w
	bw.l.inWork.Add(w)
	return nil
}

// read notes the size of the body read.
func (bw *bodyWork) read(n int) {
	if bw == nil || bw.size > 0 {
		return
	}
	bw.size = int64(n)
	if bw.size >= hugeBody {
		bw.l.mu.Lock()
		bw.l.huge++
		bw.l.mu.Unlock()
	}
}

// done frees the request's room, once.
func (bw *bodyWork) done() {
	if bw == nil {
		return
	}
	bw.once.Do(func() {
		if bw.weight > 0 {
			bw.l.inWork.Add(-bw.weight)
			bw.l.sem.Release(bw.weight)
		}
	})
}

// doneWithBody frees r's room in the large-body budget: its body is
// parsed and its prompt hashed.
func doneWithBody(r *http.Request) {
	bw, _ := r.Context().Value(bodyWorkKey{}).(*bodyWork)
	bw.done()
}

// hugeDone notes a request with a huge body answered; once none is left,
// the memory they took goes back to the system (Go's runtime keeps it
// otherwise, for minutes or for good: an idle router collects rarely).
func (l *largeBodies) hugeDone() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.huge--
	if l.huge > 0 || l.pending {
		return
	}
	l.pending = true
	wait := max(0, freeMemoryEvery-time.Since(l.lastFree))
	time.AfterFunc(wait, l.freeMemory)
}

func (l *largeBodies) freeMemory() {
	l.mu.Lock()
	l.pending = false
	if l.huge > 0 {
		l.mu.Unlock()
		return // another came: the last one frees
	}
	l.lastFree = time.Now()
	l.mu.Unlock()
	debug.FreeOSMemory()
	l.freed.Add(1)
}
