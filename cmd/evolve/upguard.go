package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/evolvellm/evolve/cluster"
)

// A second evolve up must not harm the first: it takes the state
// directory's lock, and stops what the last local cluster left only once
// nothing of that cluster is left serving and its own addresses are free.

// lockState takes the local cluster's lock for this evolve up, held until
// it returns (a foreground cluster's whole life), or says who holds it.
func (u *localUp) lockState() error {
	l, err := cluster.LockLocal(u.dir)
	var held *cluster.LockedError
	if errors.As(err, &held) {
		who, stop := "another evolve up", "stop it"
		if held.PID > 0 {
			who = fmt.Sprintf("another evolve up (pid %d, since %s)", held.PID, held.Since.Local().Format("15:04:05"))
			stop = fmt.Sprintf("stop it (Ctrl-C where it runs, or kill %d: it stops what it started)", held.PID)
		}
		return fmt.Errorf("%s is starting a local cluster in %s, or runs one in the foreground: wait for it and use that cluster, or %s; another cluster at once needs another state directory ($XDG_STATE_HOME)",
			who, u.dir, stop)
	}
	if err != nil {
		return err
	}
	u.lock = l
	return nil
}

// checkLast refuses to start while the last local cluster of the state
// directory runs (its orchestrator, or one started again outside evolve
// up), or while one of this cluster's addresses is taken, naming what
// holds it. It touches nothing.
func (u *localUp) checkLast(last *cluster.LastLocal) error {
	if o := last.Running; o != nil {
		return fmt.Errorf("a local cluster is already running (router %s); stop it with 'evolve down'", o.RouterURL)
	}
	if len(last.Strays) > 0 {
		var lines []string
		for _, p := range last.Strays {
			lines = append(lines, "  "+procText(p))
		}
		return fmt.Errorf("the last local cluster still runs outside evolve up (restarted by hand or by a supervisor), so nothing of it was stopped:\n%s\n"+
			"keep using it, or stop that process first, then 'evolve down' stops the rest and 'evolve up' starts a new cluster", strings.Join(lines, "\n"))
	}
	for _, flag := range []string{"router-addr", "control-addr", "nats-addr"} {
		addr := config.GetString(u.key(flag))
		if _, port, _ := net.SplitHostPort(addr); port == "0" {
			continue // a free port is picked
		}
		if err := checkListen(addr); err != nil {
			return fmt.Errorf("--%s %s: %w; pick another, or port 0 for a free one", flag, addr, err)
		}
	}
	return nil
}

// procText names a process for a person: its pid and command line.
func procText(p cluster.Proc) string {
	if p.PID == 0 {
		return p.Command
	}
	return fmt.Sprintf("pid %d: %s", p.PID, p.Command)
}

// clearLast stops the engines the last local cluster left running (its
// orchestrators are gone and nothing serves its event plane), sets a
// record that does not read aside, and clears the data the cluster left:
// its role pins would otherwise apply to this cluster's engines, of the
// same names, while up prints the split it starts with.
func (u *localUp) clearLast(last *cluster.LastLocal) {
	if last.Damaged != nil {
		aside := cluster.LocalStatePath(u.dir) + ".damaged"
		if os.Rename(cluster.LocalStatePath(u.dir), aside) == nil {
			fmt.Fprintf(u.errw, "%v; set it aside as %s (processes it named, if any still run, were not stopped)\n", last.Damaged, aside)
		}
	}
	if len(last.Left) > 0 {
		fmt.Fprintf(u.errw, "the last local cluster's orchestrator is gone; stopping the %d engines it left running\n", len(last.Left))
		// Their router is gone with the orchestrator: nothing is in
		// flight to drain, so they get little time.
		cluster.StopPIDs(u.errw, last.Left, nil, 2*time.Second)
	}
	for _, d := range last.DataDirs {
		if entries, err := os.ReadDir(d); err == nil && len(entries) > 0 {
			fmt.Fprintf(u.errw, "the last local cluster did not stop with 'evolve down': its data (role pins) in %s is cleared, so that this cluster starts as it says\n", d)
		}
		os.RemoveAll(d)
	}
}

// writeSecretFile writes a secret to path, readable by its owner alone,
// replacing the file at once.
func writeSecretFile(path, secret string) error {
	tmp := path + ".tmp"
	os.Remove(tmp)
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, err = f.WriteString(secret + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
}

// makeTokens gives the cluster its event plane's token and its control
// API's, in files of the state directory only the user may read: a local
// process is not trusted for being on loopback. The engines take the
// event plane's as their engine token, which the router sends them.
func (u *localUp) makeTokens() error {
	u.st.NATSTokenFile = filepath.Join(u.dir, "nats-token")
	u.st.ControlTokenFile = filepath.Join(u.dir, "control-token")
	u.controlToken = newSecret()
	if err := writeSecretFile(u.st.NATSTokenFile, newSecret()); err != nil {
		return fmt.Errorf("the event plane's token: %w", err)
	}
	if err := writeSecretFile(u.st.ControlTokenFile, u.controlToken); err != nil {
		return fmt.Errorf("the control API's token: %w", err)
	}
	return nil
}

// checkListen reports whether addr can be listened on; when it cannot for
// a process listening there, the error names that process.
func checkListen(addr string) error {
	l, err := net.Listen("tcp", addr)
	if err == nil {
		return l.Close()
	}
	if !errors.Is(err, syscall.EADDRINUSE) {
		return err
	}
	p, listening := cluster.PortHolder(addr)
	switch {
	case listening && p.PID > 0:
		return fmt.Errorf("the address is in use by pid %d (%s)", p.PID, p.Command)
	case listening:
		return errors.New("the address is in use by a process of another user")
	}
	return errors.New("the address is in use (another evolve cluster, or another service)")
}
