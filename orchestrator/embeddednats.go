package orchestrator

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// natsPortFile, in the data directory, keeps the port the embedded NATS
// server picked for a listen address of port 0, so that a restart with the
// same command line (a supervisor's) listens where the engines, which
// reconnect to the address they were given, look for it.
const natsPortFile = "nats-port"

// natsBindWait is how long the embedded NATS server tries to bind its
// port: an orchestrator restarted at once may find it still held for a
// moment by the process it replaces.
const natsBindWait = 15 * time.Second

// startEmbeddedNATS starts the embedded NATS server on host:port (port 0:
// the port kept in the data directory, else any free one, then kept).
func (o *Orchestrator) startEmbeddedNATS(ctx context.Context, host string, port int) (*server.Server, error) {
	listen := net.JoinHostPort(host, strconv.Itoa(port))
	remembered := false
	if port == 0 {
		if p := o.rememberedNATSPort(); p > 0 {
			port, remembered = p, true
		}
	}
	deadline := time.Now().Add(natsBindWait)
	var lastErr error
	for attempt := 0; ; attempt++ {
		want := port
		if want == 0 {
			want = -1 // any free port
		} else if err := canListen(host, want); err != nil {
			lastErr = err
			if time.Now().After(deadline) || ctx.Err() != nil {
				if remembered {
					// The port it had is someone else's now: a fresh one,
					// which engines started for the old one will not find.
					o.log.Warn("the event plane's port from the last run is taken; listening on a new one: engines started for the old one must be restarted with the new address",
						"port", port, "err", err)
					port, remembered = 0, false
					deadline = time.Now().Add(natsBindWait)
					continue
				}
				return nil, fmt.Errorf("embedded NATS on %s: %w", listen, err)
			}
			if attempt == 0 {
				o.log.Info("the event plane's port is busy; retrying", "addr", net.JoinHostPort(host, strconv.Itoa(want)), "for", natsBindWait)
			}
			time.Sleep(200 * time.Millisecond)
			continue
		}
		ns, err := o.newNATSServer(host, want)
		if err == nil {
			if p := ns.Addr(); p != nil && port == 0 && o.cfg.DataDir != "" {
				o.rememberNATSPort(p.(*net.TCPAddr).Port)
			}
			return ns, nil
		}
		lastErr = err
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, fmt.Errorf("embedded NATS on %s did not start: %w", listen, lastErr)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// newNATSServer starts one NATS server and waits until it takes
// connections.
func (o *Orchestrator) newNATSServer(host string, port int) (*server.Server, error) {
	sopts := &server.Options{Host: host, Port: port, JetStream: true, StoreDir: o.cfg.DataDir,
		NoSigs: true, NoLog: true, ServerName: o.cfg.Name, Authorization: o.cfg.NATSToken}
	if err := o.clusterOptions(sopts); err != nil {
		return nil, err
	}
	if o.natsTLS() {
		// Engines on other machines send the token: encrypt it with
		// the router's certificate (tls:// URLs).
		sopts.TLSConfig = o.certs.Config()
	}
	ns, err := server.NewServer(sopts)
	if err != nil {
		return nil, fmt.Errorf("embedded NATS: %w", err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		return nil, fmt.Errorf("not ready for connections in 10 s")
	}
	return ns, nil
}

// canListen reports whether host:port can be bound now.
func canListen(host string, port int) error {
	ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		return err
	}
	return ln.Close()
}

func (o *Orchestrator) rememberedNATSPort() int {
	if o.cfg.DataDir == "" {
		return 0
	}
	b, err := os.ReadFile(filepath.Join(o.cfg.DataDir, natsPortFile))
	if err != nil {
		return 0
	}
	p, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || p <= 0 || p > 65535 {
		return 0
	}
	return p
}

func (o *Orchestrator) rememberNATSPort(port int) {
	path := filepath.Join(o.cfg.DataDir, natsPortFile)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(strconv.Itoa(port)+"\n"), 0o600); err != nil {
		o.log.Warn("the event plane's port is not kept for a restart", "err", err)
		return
	}
	if err := os.Rename(tmp, path); err != nil {
		o.log.Warn("the event plane's port is not kept for a restart", "err", err)
	}
}
