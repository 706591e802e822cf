package orchestrator

import (
	"context"
	"sync"
	"time"

	"github.com/evolvellm/evolve/controlapi"
)

// eventHistory is how many events the control API keeps for new
// watchers: days of a quiet cluster, hours of a busy one.
const eventHistory = 2000

// eventLog is the orchestrator's own record of what happened to its
// nodes (joined, down, back, switching, switched, answers lost), each
// with the time it happened, so that a monitor started later shows the
// past as it was instead of inventing it from its first snapshot. It is
// bounded: the oldest events go first, and since moves past them.
type eventLog struct {
	mu        sync.Mutex
	recording bool      // false: nothing feeds it (no record to serve)
	since     time.Time // the record is complete from here on
	events    []controlapi.Event
	subs      map[chan controlapi.Event]struct{}
	limit     int
}

func newEventLog(start time.Time, limit int) *eventLog {
	return &eventLog{since: start, subs: map[chan controlapi.Event]struct{}{}, limit: limit}
}

// add records events and tells the watchers; a watcher too slow to keep
// up is dropped (its channel closed), never waited for.
func (l *eventLog) add(evs ...controlapi.Event) {
	if len(evs) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, evs...)
	if over := len(l.events) - l.limit; over > 0 {
		l.since = l.events[over-1].Time
		l.events = append(l.events[:0:0], l.events[over:]...)
	}
	for ch := range l.subs {
		for _, e := range evs {
			select {
			case ch <- e:
				continue
			default:
				delete(l.subs, ch)
				close(ch)
			}
			break
		}
	}
}

// history is the record: when it begins (zero when nothing records) and
// its events, oldest first.
func (l *eventLog) history() controlapi.Events {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.historyLocked()
}

func (l *eventLog) historyLocked() controlapi.Events {
	if !l.recording {
		return controlapi.Events{Events: []controlapi.Event{}}
	}
	return controlapi.Events{Since: l.since, Events: append([]controlapi.Event{}, l.events...)}
}

// watch returns the record and a channel of every event after it, taken
// together so that none falls between them.
func (l *eventLog) watch(buf int) (controlapi.Events, chan controlapi.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ch := make(chan controlapi.Event, buf)
	l.subs[ch] = struct{}{}
	return l.historyLocked(), ch
}

// unwatch stops sending to ch (if the log has not dropped it already).
func (l *eventLog) unwatch(ch chan controlapi.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.subs[ch]; ok {
		delete(l.subs, ch)
		close(ch)
	}
}

// recordEvents follows the nodes' changes, as a watcher of the cluster's
// own, into l until ctx ends. Dropped for falling behind (a burst of
// heartbeats), it subscribes again and records what changed meanwhile
// from the nodes' state.
func (o *Orchestrator) recordEvents(ctx context.Context, l *eventLog) {
	l.mu.Lock()
	l.recording = true
	l.mu.Unlock()
	last := map[string]controlapi.Node{}
	note := func(n controlapi.Node, now time.Time) {
		var old *controlapi.Node
		if p, ok := last[n.ID]; ok {
			old = &p
		}
		l.add(controlapi.NodeEvents(old, &n, now)...)
		last[n.ID] = n
	}
	for ctx.Err() == nil {
		ch := make(chan watchEvent, 4096)
		o.c.mu.Lock()
		nodes := o.c.statuses()
		o.c.subs[ch] = struct{}{}
		o.c.mu.Unlock()
		now := time.Now()
		for _, n := range nodes {
			note(n, now)
		}
	follow:
		for {
			select {
			case <-ctx.Done():
				o.c.mu.Lock()
				if _, ok := o.c.subs[ch]; ok {
					delete(o.c.subs, ch)
					close(ch)
				}
				o.c.mu.Unlock()
				return
			case ev, ok := <-ch:
				if !ok {
					break follow // dropped: subscribe again
				}
				if ev.Node != nil {
					note(*ev.Node, time.Now())
				}
			}
		}
	}
}
