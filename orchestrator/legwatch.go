package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// An engine that dies ends its legs' connections, and its answers go on
// elsewhere. One that hangs (a stopped process, a stuck GPU) ends
// nothing: its connections stay open and its answers wait as long as it
// hangs. The leg watch ends those legs as a death would, so that the same
// continuation takes them on:
//
//   - a leg whose node is marked down (it missed its heartbeats) and that
//     has had no byte for a second is ended at once;
//   - a leg that has sent a byte and then nothing for the stream idle time
//     (Config.StreamIdle, default 30 s) is ended, whatever its node says:
//     an engine that heartbeats while its backend is stuck.
//
// Before a leg's first byte (its prefill, its queue) only the first rule
// applies: a busy engine may take long to start an answer. Ending a leg
// closes its connection, so that an engine that comes back finds its
// client gone and drops the answer (evolve's engines free its KV; vLLM
// aborts a request whose client left).

// DefaultStreamIdle is how long a leg that has started may go without a
// byte before the router takes its answer elsewhere.
const DefaultStreamIdle = 30 * time.Second

// legSweep is how often the watch looks at the legs.
const legSweep = 250 * time.Millisecond

// Why a leg was ended.
var (
	errLegIdle     = errors.New("the engine sent nothing for the stream idle time")
	errLegNodeDown = errors.New("the engine's node went down (no heartbeats) while the leg waited")
)

// legWatch keeps the legs in flight and ends the hung ones.
type legWatch struct {
	mu   sync.Mutex
	legs map[*watchedLeg]struct{}
	idle time.Duration
}

// watchedLeg is one leg in flight.
type watchedLeg struct {
	url      string
	start    time.Time
	last     atomic.Int64 // unix nanoseconds of its last byte; 0: none yet
	cancel   context.CancelCauseFunc
	endedWhy atomic.Pointer[error]
}

func newLegWatch(idle time.Duration) *legWatch {
	if idle <= 0 {
		idle = DefaultStreamIdle
	}
	return &legWatch{legs: map[*watchedLeg]struct{}{}, idle: idle}
}

// begin watches a leg to the node at url, returning the context its
// request is sent with and the leg.
func (w *legWatch) begin(ctx context.Context, url string) (context.Context, *watchedLeg) {
	lctx, cancel := context.WithCancelCause(ctx)
	l := &watchedLeg{url: url, start: time.Now(), cancel: cancel}
	if w == nil { // an orchestrator of a test, built bare: nothing watches
		return lctx, l
	}
	w.mu.Lock()
	w.legs[l] = struct{}{}
	w.mu.Unlock()
	return lctx, l
}

// end stops watching l and frees its context.
func (w *legWatch) end(l *watchedLeg) {
	if w == nil {
		l.cancel(context.Canceled)
		return
	}
	w.mu.Lock()
	delete(w.legs, l)
	w.mu.Unlock()
	l.cancel(context.Canceled)
}

// sweep ends the legs that are hung at now: those idle past the stream
// idle time after their first byte, and those idle a second whose node
// is down (down says which URLs). It returns how many it ended.
func (w *legWatch) sweep(now time.Time, down map[string]bool) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for l := range w.legs {
		last, started := l.last.Load(), true
		if last == 0 {
			last, started = l.start.UnixNano(), false
		}
		idle := now.Sub(time.Unix(0, last))
		var why error
		switch {
		case down[l.url] && idle >= time.Second:
			why = errLegNodeDown
		case started && idle >= w.idle:
			why = fmt.Errorf("%w (%v)", errLegIdle, w.idle)
		}
		if why != nil {
			l.endedWhy.Store(&why)
			l.cancel(why)
			delete(w.legs, l)
			n++
		}
	}
	return n
}

// run sweeps until ctx ends.
func (o *Orchestrator) watchLegs(ctx context.Context) {
	t := time.NewTicker(legSweep)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			o.c.mu.Lock()
			down := map[string]bool{}
			for _, n := range o.c.nodes {
				if n.state == StateDown {
					down[n.reg.URL] = true
				}
			}
			o.c.mu.Unlock()
			if ended := o.legs.sweep(now, down); ended > 0 {
				o.met.legsEnded.Add(float64(ended))
			}
		}
	}
}

// watchedBody is a leg's answer body: each read notes a byte's time; its
// errors say why the watch ended the leg; Close stops watching it.
type watchedBody struct {
	io.ReadCloser
	w *legWatch
	l *watchedLeg
}

func (b *watchedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		b.l.last.Store(time.Now().UnixNano())
	}
	if err != nil && err != io.EOF {
		if why := b.l.endedWhy.Load(); why != nil {
			err = fmt.Errorf("%w: %w", *why, err)
		}
	}
	return n, err
}

func (b *watchedBody) Close() error {
	err := b.ReadCloser.Close()
	b.w.end(b.l)
	return err
}

// legHung reports whether err ended a leg the watch found hung.
func legHung(err error) bool {
	return errors.Is(err, errLegIdle) || errors.Is(err, errLegNodeDown)
}
