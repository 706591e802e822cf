package orchestrator

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/evolvellm/evolve/controlapi"
	"github.com/evolvellm/evolve/monitoring"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// subjectPresence carries each orchestrator's presence, every second.
const subjectPresence = "evolve.orchestrator.presence"

// presenceEvery is how often an orchestrator says it is there; one not
// heard for presenceSilent is shown silent, and forgotten after
// presenceForget.
const (
	presenceEvery  = time.Second
	presenceSilent = 3 * time.Second
	presenceForget = 10 * time.Minute
)

// peers is what this orchestrator knows of the others.
type peers struct {
	mu    sync.Mutex
	heard map[string]heardPeer
}

type heardPeer struct {
	st controlapi.Orchestrator
	at time.Time
}

// self is this orchestrator's presence now. A router on every interface
// is named, on an existing NATS, by the address this host reaches the
// event plane from: the others list it for Prometheus by that name (an
// embedded NATS cluster names it by its route's address instead).
func (o *Orchestrator) self() controlapi.Orchestrator {
	router := o.routerURL
	if o.natsFrom != nil {
		router = monitoring.ReachableRouter(router, o.natsFrom.from())
	}
	st := controlapi.Orchestrator{Name: o.cfg.Name, RouterURL: router, ControlURL: o.controlURL, NATSURL: o.natsURL,
		StartedAt: o.started, NATSPeers: -1, State: "up", Self: true}
	if f, ok := o.leads(); ok {
		st.Leader = true
		if f != nil {
			st.Term = f.Term
		}
	}
	if o.ns != nil {
		st.NATSPeers = natsPeers(o.ns)
	}
	return st
}

// natsPeers counts the servers ns has routes to (NATS pools several
// routes per peer).
func natsPeers(ns *server.Server) int {
	rz, err := ns.Routez(nil)
	if err != nil {
		return 0
	}
	names := map[string]bool{}
	for _, r := range rz.Routes {
		names[r.RemoteID] = true
	}
	return len(names)
}

// RouterTargets are the routers of the orchestrators on the event plane,
// this one's first, as Prometheus should scrape them: a router on every
// interface is named by the host the asker reached this control API at
// (requestHost), or for another orchestrator by the address its NATS
// server's route comes from; one whose address is not known is left out.
func (o *Orchestrator) RouterTargets(requestHost string) []string {
	out := []string{monitoring.ReachableRouter(o.routerURL, requestHost)}
	var routeIPs map[string]string
	if o.ns != nil {
		if rz, err := o.ns.Routez(nil); err == nil {
			routeIPs = map[string]string{}
			for _, r := range rz.Routes {
				routeIPs[r.RemoteName] = r.IP
			}
		}
	}
	for _, p := range o.Orchestrators() {
		if p.Self || p.State != "up" || p.RouterURL == "" {
			continue
		}
		u := monitoring.ReachableRouter(p.RouterURL, routeIPs[p.Name])
		if r, err := url.Parse(u); err != nil || net.ParseIP(r.Hostname()).IsUnspecified() {
			continue
		}
		out = append(out, u)
	}
	return out
}

// announcePresence says every second that this orchestrator is there,
// and listens for the others, until ctx ends.
func (o *Orchestrator) announcePresence(ctx context.Context) error {
	o.peers.heard = map[string]heardPeer{}
	sub, err := o.nc.Subscribe(subjectPresence, func(m *nats.Msg) {
		var st controlapi.Orchestrator
		if json.Unmarshal(m.Data, &st) != nil || st.Name == "" || st.Name == o.cfg.Name {
			return
		}
		st.Self = false
		o.peers.mu.Lock()
		o.peers.heard[st.Name] = heardPeer{st: st, at: time.Now()}
		o.peers.mu.Unlock()
	})
	if err != nil {
		return fmt.Errorf("subscribe %s: %w", subjectPresence, err)
	}
	o.subs = append(o.subs, sub)
	go func() {
		t := time.NewTicker(presenceEvery)
		defer t.Stop()
		for {
			b, _ := json.Marshal(o.self())
			o.nc.Publish(subjectPresence, b)
			o.dropSilentRouters()
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return nil
}

// hasPeers says whether another orchestrator has been heard lately.
func (o *Orchestrator) hasPeers() bool {
	o.peers.mu.Lock()
	defer o.peers.mu.Unlock()
	for _, h := range o.peers.heard {
		if time.Since(h.at) < presenceSilent {
			return true
		}
	}
	return false
}

// dropSilentRouters forgets the load of routers not heard for
// presenceSilent.
func (o *Orchestrator) dropSilentRouters() {
	var silent []string
	o.peers.mu.Lock()
	for name, h := range o.peers.heard {
		if time.Since(h.at) > presenceSilent {
			silent = append(silent, name)
		}
	}
	o.peers.mu.Unlock()
	for _, name := range silent {
		o.dropLoadsOf(name)
	}
}

// Orchestrators lists the orchestrators sharing the event plane, this
// one included, by name.
func (o *Orchestrator) Orchestrators() []controlapi.Orchestrator {
	now := time.Now()
	out := []controlapi.Orchestrator{o.self()}
	o.peers.mu.Lock()
	for name, h := range o.peers.heard {
		ago := now.Sub(h.at)
		if ago > presenceForget {
			delete(o.peers.heard, name)
			continue
		}
		st := h.st
		st.HeardAgo = ago.Round(time.Millisecond).Seconds()
		if ago > presenceSilent {
			st.State, st.Leader = "silent", false
		}
		out = append(out, st)
	}
	o.peers.mu.Unlock()
	slices.SortFunc(out, func(a, b controlapi.Orchestrator) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// localAddrDialer dials the event plane as the NATS client does, and keeps
// the local IP address of its last connection.
type localAddrDialer struct {
	mu   sync.Mutex
	addr string
}

// Dial implements nats.CustomDialer.
func (d *localAddrDialer) Dial(network, address string) (net.Conn, error) {
	c, err := (&net.Dialer{Timeout: nats.DefaultTimeout}).Dial(network, address)
	if err == nil {
		if a, ok := c.LocalAddr().(*net.TCPAddr); ok {
			d.mu.Lock()
			d.addr = a.IP.String()
			d.mu.Unlock()
		}
	}
	return c, err
}

// from is the local IP address of the last connection ("" before one).
func (d *localAddrDialer) from() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.addr
}
