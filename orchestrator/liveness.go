package orchestrator

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/evolvellm/evolve/protocol"
)

// liveness keeps when each engine was last heard from, outside the
// cluster's lock: a heartbeat's arrival is noted before its handler waits
// for that lock, so that a router holding it (or an orchestrator short of
// CPU) does not make an engine look silent.
type liveness struct {
	seen sync.Map // engine id -> *atomic.Int64 (UnixNano)
	// announced: engine id -> *atomic.Int64, when a node that was marked
	// down and still beats was last asked to register again.
	announced sync.Map
}

// heard notes that id was heard from at now.
func (l *liveness) heard(id string, now time.Time) {
	v, _ := l.seen.LoadOrStore(id, new(atomic.Int64))
	v.(*atomic.Int64).Store(now.UnixNano())
}

// last is when id was last heard from (zero: never).
func (l *liveness) last(id string) time.Time {
	v, ok := l.seen.Load(id)
	if !ok {
		return time.Time{}
	}
	return time.Unix(0, v.(*atomic.Int64).Load())
}

// askAgain reports whether a down node that beats should be asked to
// register again now: at most once a heartbeat interval, so that a backlog
// of its heartbeats is not a storm of announcements.
func (l *liveness) askAgain(id string, now time.Time) bool {
	v, _ := l.announced.LoadOrStore(id, new(atomic.Int64))
	a := v.(*atomic.Int64)
	prev := a.Load()
	if now.UnixNano()-prev < int64(protocol.HeartbeatInterval) {
		return false
	}
	return a.CompareAndSwap(prev, now.UnixNano())
}

// silentSince reports whether a node last seen at seen (by the cluster's
// record) and at heard (by its arrival) has been silent for longer than
// limit at now.
func silentSince(seen, heard, now time.Time, limit time.Duration) bool {
	if heard.After(seen) {
		seen = heard
	}
	return now.Sub(seen) > limit
}
