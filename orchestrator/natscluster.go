package orchestrator

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
)

// natsClusterName names the NATS cluster that orchestrators form.
const natsClusterName = "evolve"

// natsClusterWait is how long an orchestrator on an existing NATS
// cluster waits for its JetStream.
const natsClusterWait = 30 * time.Second

// routeUser is the user name routes between orchestrators' NATS servers
// present, with the event plane's token as password.
const routeUser = "evolve"

// checkCluster checks the NATS cluster settings and fills in the name.
func (c *Config) checkCluster() error {
	if c.Name == "" {
		c.Name = defaultName(c.DataDir)
	}
	if err := checkOrchestratorName(c.Name); err != nil {
		return err
	}
	if c.ClusterListen == "" {
		if len(c.ClusterPeers) > 0 {
			return errors.New("cluster peers without a cluster address: give the address this orchestrator's peers reach it at (--cluster-listen)")
		}
		return nil
	}
	if len(c.ClusterPeers) == 0 {
		return errors.New("a cluster address without peers: give the other orchestrators' cluster addresses (--cluster-peers); JetStream needs to know them")
	}
	if c.NATSURL != "" {
		return errors.New("--cluster-listen forms a cluster of embedded NATS servers; with --nats-url, the NATS servers are clustered already")
	}
	if _, _, err := net.SplitHostPort(c.ClusterListen); err != nil {
		return fmt.Errorf("cluster address %q: %w", c.ClusterListen, err)
	}
	if c.NATSToken == "" && !isLoopback(c.ClusterListen) {
		return fmt.Errorf("cluster address %s is not loopback: set a NATS token, which the orchestrators' servers present to each other", c.ClusterListen)
	}
	for _, p := range c.ClusterPeers {
		if _, _, err := net.SplitHostPort(p); err != nil {
			return fmt.Errorf("cluster peer %q: want HOST:PORT, the address it gave --cluster-listen: %w", p, err)
		}
	}
	return nil
}

// nameFile, in the data directory, keeps the name an orchestrator chose
// for itself: its NATS server is the same JetStream peer after a restart.
const nameFile = "name"

// defaultName is the name kept in dataDir, else the host's name and a
// random suffix, then kept.
func defaultName(dataDir string) string {
	path := filepath.Join(dataDir, nameFile)
	if dataDir != "" {
		if b, err := os.ReadFile(path); err == nil {
			if name := strings.TrimSpace(string(b)); checkOrchestratorName(name) == nil && name != "" {
				return name
			}
		}
	}
	host, _ := os.Hostname()
	host = strings.Map(func(r rune) rune {
		if nameRune(r) {
			return r
		}
		return '-'
	}, host)
	if len(host) > 40 {
		host = host[:40]
	}
	suffix := make([]byte, 3)
	rand.Read(suffix)
	name := fmt.Sprintf("%s-%x", host, suffix)
	if dataDir != "" {
		if err := os.MkdirAll(dataDir, 0o700); err == nil {
			_ = os.WriteFile(path, []byte(name+"\n"), 0o600)
		}
	}
	return name
}

// checkOrchestratorName refuses names NATS would take badly.
func checkOrchestratorName(name string) error {
	if len(name) > 64 {
		return fmt.Errorf("orchestrator name %q: at most 64 characters", name)
	}
	for _, r := range name {
		if !nameRune(r) {
			return fmt.Errorf("orchestrator name %q: use letters, digits, '-', '_' and '.'", name)
		}
	}
	return nil
}

// nameRune says whether r may be part of an orchestrator's name.
func nameRune(r rune) bool {
	return r == '-' || r == '_' || r == '.' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z'
}

// replicas is how many copies JetStream keeps of evolve's state: 3 on a
// cluster of three orchestrators or more, else as many as there are; on
// an existing NATS cluster (--nats), 3 where it has three servers or
// more.
func (o *Orchestrator) replicas() int {
	switch {
	case o.cfg.ClusterListen != "":
		return min(3, len(o.cfg.ClusterPeers)+1)
	case o.cfg.NATSURL != "" && o.nc != nil && o.nc.ConnectedClusterName() != "":
		return max(1, min(3, len(o.nc.Servers())))
	}
	return 1
}

// clusterOptions adds this orchestrator's routes to sopts.
func (o *Orchestrator) clusterOptions(sopts *server.Options) error {
	if o.cfg.ClusterListen == "" {
		return nil
	}
	host, portStr, _ := net.SplitHostPort(o.cfg.ClusterListen)
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return fmt.Errorf("cluster address %q: port %q", o.cfg.ClusterListen, portStr)
	}
	sopts.Cluster = server.ClusterOpts{Name: natsClusterName, Host: host, Port: port}
	if o.cfg.NATSToken != "" {
		sopts.Cluster.Username, sopts.Cluster.Password = routeUser, o.cfg.NATSToken
	}
	for _, p := range o.cfg.ClusterPeers {
		u := &url.URL{Scheme: "nats-route", Host: p}
		if o.cfg.NATSToken != "" {
			u.User = url.UserPassword(routeUser, o.cfg.NATSToken)
		}
		sopts.Routes = append(sopts.Routes, u)
	}
	return nil
}

// openStores opens JetStream's buckets: role overrides and the planner's
// lease. On a NATS cluster JetStream answers once a majority of its
// servers have met: it tries until then, saying what it waits for.
func (o *Orchestrator) openStores(ctx context.Context, js jetstream.JetStream) error {
	start := time.Now()
	clustered := o.cfg.ClusterListen != "" || o.nc.ConnectedClusterName() != ""
	try := 5 * time.Second // JetStream answers at once alone
	if clustered {
		try = 2 * time.Second // or not until the cluster has met: try again soon
	}
	for attempt := 0; ; attempt++ {
		tctx, cancel := context.WithTimeout(ctx, try)
		store, err := openRoleStore(tctx, js, o.replicas())
		var l *lease
		if err == nil {
			l, err = openLease(tctx, o.nc, js, leaseHolder{Name: o.cfg.Name}, o.replicas(), o.log)
		}
		cancel()
		if err == nil {
			l.failed = o.noteStoreFailure
			o.store, o.lease = store, l
			return nil
		}
		// A NATS cluster's JetStream answers once its servers have met:
		// its own (--cluster-listen), until they do; an existing one
		// (--nats), for a while.
		if !clustered || ctx.Err() != nil || (o.cfg.ClusterListen == "" && time.Since(start) > natsClusterWait) {
			return err
		}
		if attempt%10 == 0 {
			o.log.Info("waiting for the NATS cluster's JetStream (a majority of the orchestrators must be up)",
				"peers", o.cfg.ClusterPeers, "waited", time.Since(start).Round(time.Second), "err", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}
