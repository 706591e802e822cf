package orchestrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/evolvellm/evolve/protocol"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The planner's leadership is a key in a JetStream key-value bucket whose
// values expire: the orchestrator that creates the key leads, renews it
// every leaseRenew, and the others create it once it has expired. The
// key's revision at its creation is the leader's term, carried on every
// role command (protocol.Fence), so that engines refuse a deposed
// leader's late commands. A leader that cannot renew for leaseActFor
// stops acting before its key can expire.
const (
	leaseBucket = "evolve_leader"
	leaseKey    = "planner"
	leaseTTL    = 5 * time.Second
	leaseRenew  = time.Second
	leaseActFor = leaseTTL - 2*leaseRenew
	// leaseTry is how often an orchestrator that does not lead tries to
	// take the lease: the sooner after it expires, the sooner one leads.
	leaseTry = leaseRenew / 4
)

// leaseHolder is the lease key's value: who leads, and where.
type leaseHolder struct {
	Name       string `json:"name"`
	ControlURL string `json:"control_url,omitempty"`
	RouterURL  string `json:"router_url,omitempty"`
	Term       uint64 `json:"term,omitempty"` // from the holder's first renewal on
}

// lease takes and holds the planner's leadership for one orchestrator.
type lease struct {
	kv jetstream.KeyValue
	js jetstream.JetStream
	nc *nats.Conn
	// clustered: the bucket has replicas on other orchestrators' NATS
	// servers (keepStreamLeaderAway).
	clustered bool
	store     string // the bucket's identity: Fence.Lease
	me        leaseHolder
	log       *slog.Logger
	// failed, when set, is told of each write the store did not take.
	failed func()

	mu       sync.Mutex
	term     uint64      // the revision our hold began with; 0: not leading
	rev      uint64      // the revision we last wrote
	renewed  time.Time   // when we last wrote it
	renewals int         // since this orchestrator took the lease
	leader   leaseHolder // as last read
}

// openLease opens (or creates) the lease bucket, with replicas copies on
// a NATS cluster.
func openLease(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, me leaseHolder, replicas int, log *slog.Logger) (*lease, error) {
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: leaseBucket,
		Description: "evolve planner leadership", History: 1, TTL: leaseTTL, Replicas: replicas})
	if err != nil {
		return nil, fmt.Errorf("open key-value bucket %s: %w", leaseBucket, err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("key-value bucket %s: %w", leaseBucket, err)
	}
	store := leaseBucket
	if s, ok := st.(*jetstream.KeyValueBucketStatus); ok {
		store = strconv.FormatInt(s.StreamInfo().Created.UnixNano(), 36)
	}
	return &lease{kv: kv, js: js, nc: nc, clustered: replicas > 1, store: store, me: me, log: log}, nil
}

// run keeps trying to lead, and renews the lease while it does, until ctx
// ends; then it gives the lease up, so that another leads at once.
func (l *lease) run(ctx context.Context) {
	tick := time.NewTicker(leaseTry)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			l.release()
			return
		case <-tick.C:
			l.mu.Lock()
			due := l.term == 0 || time.Since(l.renewed) >= leaseRenew-leaseTry/2
			l.mu.Unlock()
			if due {
				l.step(ctx)
			}
		}
	}
}

// step renews the lease when this orchestrator holds it, else tries to
// take it.
func (l *lease) step(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, leaseRenew)
	defer cancel()
	l.mu.Lock()
	term, rev := l.term, l.rev
	l.mu.Unlock()
	me := l.me
	me.Term = term
	val, _ := json.Marshal(me)
	if term != 0 {
		next, err := l.kv.Update(ctx, leaseKey, val, rev)
		l.mu.Lock()
		defer l.mu.Unlock()
		switch {
		case err == nil:
			l.rev, l.renewed = next, time.Now()
			if l.renewals++; l.renewals%10 == 1 {
				go l.keepStreamLeaderAway()
			}
		case errors.Is(err, jetstream.ErrKeyExists) || isWrongSequence(err):
			// Another took it: our key expired (we were paused, or cut off).
			l.log.Warn("planner leadership lost to another orchestrator", "term", term, "err", err)
			l.term = 0
		case time.Since(l.renewed) > leaseActFor:
			l.log.Warn("planner leadership not renewed; stepping down", "term", term, "err", err)
			l.term = 0
		}
		if err != nil && !errors.Is(err, jetstream.ErrKeyExists) && !isWrongSequence(err) && l.failed != nil {
			l.failed()
		}
		return
	}
	rev, err := l.kv.Create(ctx, leaseKey, val)
	if err == nil {
		l.took(rev)
		return
	}
	if e, err := l.kv.Get(ctx, leaseKey); err == nil {
		var h leaseHolder
		if json.Unmarshal(e.Value(), &h) == nil && h.Name == l.me.Name {
			// Ours, from before this process (restarted at once, as a
			// supervisor does): names are unique, so that process is
			// gone. Take the lease in a new term rather than wait for it
			// to expire.
			if err := l.kv.Delete(ctx, leaseKey, jetstream.LastRevision(e.Revision())); err == nil {
				if rev, err := l.kv.Create(ctx, leaseKey, val); err == nil {
					l.took(rev)
				}
			} else if l.failed != nil && !isWrongSequence(err) {
				l.failed() // our own stale hold, and the store takes no write
			}
			return
		}
		if json.Unmarshal(e.Value(), &h) == nil {
			l.mu.Lock()
			if l.leader.Name != h.Name {
				l.log.Info("planner leader", "name", h.Name, "control_url", h.ControlURL)
			}
			l.leader = h
			l.mu.Unlock()
		}
	} else if errors.Is(err, jetstream.ErrKeyNotFound) {
		l.mu.Lock()
		l.leader = leaseHolder{}
		l.mu.Unlock()
	}
}

// took records the lease taken at revision rev: this orchestrator leads.
func (l *lease) took(rev uint64) {
	l.mu.Lock()
	l.term, l.rev, l.renewed, l.renewals = rev, rev, time.Now(), 0
	l.leader = l.me
	l.leader.Term = rev
	l.mu.Unlock()
	l.log.Info("this orchestrator leads the planner", "term", rev)
}

// keepStreamLeaderAway asks JetStream to move the leadership of the
// lease's stream off this orchestrator's NATS server when it has it. A
// stream whose leader dies takes NATS 4 to 9 s to elect another, and
// until then no one can take the lease: had the planner's leader also
// led the stream, its death would keep the cluster leaderless that much
// longer than the lease's 5 s.
func (l *lease) keepStreamLeaderAway() {
	if !l.clustered {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	st, err := l.js.Stream(ctx, "KV_"+leaseBucket)
	if err != nil {
		return
	}
	info, err := st.Info(ctx)
	if err != nil || info.Cluster == nil || info.Cluster.Leader != l.me.Name {
		return
	}
	if _, err := l.nc.RequestWithContext(ctx, "$JS.API.STREAM.LEADER.STEPDOWN.KV_"+leaseBucket, nil); err != nil {
		l.log.Warn("the lease's stream stays led by this orchestrator's NATS server; should it die, another leads only once NATS elects a new stream leader (4-9 s)", "err", err)
		return
	}
	l.log.Info("the lease's stream is now led by another orchestrator's NATS server")
}

// isWrongSequence says whether err is JetStream refusing an update for a
// revision that is not the key's last.
func isWrongSequence(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// release gives the lease up when this orchestrator holds it.
func (l *lease) release() {
	l.mu.Lock()
	term, rev := l.term, l.rev
	l.term = 0
	l.mu.Unlock()
	if term == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := l.kv.Delete(ctx, leaseKey, jetstream.LastRevision(rev)); err != nil {
		l.log.Warn("planner leadership not given up; another takes it when it expires", "err", err)
	}
}

// fence is the fence of this orchestrator's role commands, and false
// when it does not lead (or has not renewed its lease for too long to
// be sure that it still does).
func (l *lease) fence() (*protocol.Fence, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.term == 0 || time.Since(l.renewed) > leaseActFor {
		return nil, false
	}
	return &protocol.Fence{Lease: l.store, Term: l.term, Holder: l.me.Name}, true
}
