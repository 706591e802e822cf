package orchestrator

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// An API key name's max-concurrency holds across routers: each router
// tells the others, as it changes (at most every keyLoadEvery), how many
// of each limited name's requests it has in flight, and admits one more
// only while its own and theirs together stay under the limit. Requests
// that reach several routers within one such interval may together pass
// it by the few admitted meanwhile; a router silent for presenceSilent
// no longer counts.

// subjectKeyLoad carries routers' in-flight requests per limited name.
const subjectKeyLoad = "evolve.router.keys"

// keyLoadEvery is how often a router says its counts when they changed;
// unchanged non-zero counts are said again every second, to stay fresh.
const keyLoadEvery = 50 * time.Millisecond

// keyLoad is one router's requests in flight per limited name.
type keyLoad struct {
	Router   string         `json:"router"`
	InFlight map[string]int `json:"in_flight"`
}

// remoteKeys are the other routers' last counts, with when each came.
type remoteKeys struct {
	mu sync.Mutex
	by map[string]heardKeys
}

type heardKeys struct {
	counts map[string]int
	at     time.Time
}

// othersInFlight is how many of name's requests the other routers have
// in flight, as they last said (none from a router silent since).
func (o *Orchestrator) othersInFlight(name string) int {
	o.keyPeers.mu.Lock()
	defer o.keyPeers.mu.Unlock()
	n := 0
	for router, h := range o.keyPeers.by {
		if time.Since(h.at) > presenceSilent {
			delete(o.keyPeers.by, router)
			continue
		}
		n += h.counts[name]
	}
	return n
}

// othersCounter is othersInFlight of name, for apikeys.Limit.Admit; nil
// where no other router is there.
func (o *Orchestrator) othersCounter(name string) func() int {
	if o.nc == nil || !o.hasPeers() {
		return nil
	}
	return func() int { return o.othersInFlight(name) }
}

// shareKeyLoads follows the other routers' counts and says this one's,
// until ctx ends.
func (o *Orchestrator) shareKeyLoads(ctx context.Context) error {
	o.keyPeers.by = map[string]heardKeys{}
	sub, err := o.nc.Subscribe(subjectKeyLoad, func(m *nats.Msg) {
		var kl keyLoad
		if json.Unmarshal(m.Data, &kl) != nil || kl.Router == "" || kl.Router == o.cfg.Name {
			return
		}
		o.keyPeers.mu.Lock()
		o.keyPeers.by[kl.Router] = heardKeys{counts: kl.InFlight, at: time.Now()}
		o.keyPeers.mu.Unlock()
	})
	if err != nil {
		return fmt.Errorf("subscribe %s: %w", subjectKeyLoad, err)
	}
	o.subs = append(o.subs, sub)
	go func() {
		tick := time.NewTicker(keyLoadEvery)
		defer tick.Stop()
		var last map[string]int
		var said time.Time
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			ks := o.keys.Get(time.Now())
			now := map[string]int{}
			busy := false
			for _, name := range ks.Limited() {
				if n := ks.Limit(name).InFlight(); n > 0 {
					now[name], busy = n, true
				}
			}
			if maps.Equal(now, last) && (!busy || time.Since(said) < time.Second) {
				continue
			}
			b, _ := json.Marshal(keyLoad{Router: o.cfg.Name, InFlight: now})
			o.nc.Publish(subjectKeyLoad, b)
			last, said = now, time.Now()
		}
	}()
	return nil
}
