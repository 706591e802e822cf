package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"
)

// OrchestratorResult is what happened to the orchestrator evolve up runs
// on one of the cluster's hosts (spec.orchestrator.host), and how to
// reach it.
type OrchestratorResult struct {
	Host       string `json:"host"`
	Phase      string `json:"phase"`
	Action     string `json:"action"` // started, restarted, unchanged, stopped, failed
	RouterURL  string `json:"router_url,omitempty"`
	ControlURL string `json:"control_url,omitempty"`
	NATSURL    string `json:"nats_url,omitempty"` // as the hosts reach it
	Error      string `json:"error,omitempty"`
	err        error
}

// Err is the failure, or nil.
func (r OrchestratorResult) Err() error { return r.err }

// OrchestratorDir is where a host keeps the orchestrator's files: its
// service script, log, NATS data and ready file.
func (h Host) OrchestratorDir() string { return h.StateDir() + "/orchestrator" }

// orchestratorReady is how long a started orchestrator has to say it serves.
const orchestratorReady = 30 * time.Second

// UpOrchestrators runs the orchestrators on the file's orchestrator hosts
// (spec.orchestrator.host or hosts), all at once: of several, each waits
// for a majority of the others before it serves. It returns their results
// in the file's order.
func UpOrchestrators(ctx context.Context, f *File, opt UpOptions, controlToken string) []OrchestratorResult {
	return onOrchestratorHosts(f, func(host string) OrchestratorResult { return UpOrchestrator(ctx, f, host, opt, controlToken) })
}

// onOrchestratorHosts runs do for each orchestrator host at once and
// returns the results in the file's order.
func onOrchestratorHosts(f *File, do func(host string) OrchestratorResult) []OrchestratorResult {
	hosts := f.Spec.Orchestrator.OnHosts()
	res := make([]OrchestratorResult, len(hosts))
	var wg sync.WaitGroup
	for i, h := range hosts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[i] = do(h)
		}()
	}
	wg.Wait()
	return res
}

// clusterArgs are the flags that make the orchestrator on host one of
// the file's several: its name, where it takes routes, and its peers'
// route addresses, as the hosts reach each other (their addresses in the
// file, resolved through ~/.ssh/config).
func clusterArgs(f *File, host string, opt UpOptions) []string {
	hosts := f.Spec.Orchestrator.OnHosts()
	if len(hosts) < 2 {
		return nil
	}
	var peers []string
	for _, p := range hosts {
		if p != host {
			peers = append(peers, net.JoinHostPort(opt.resolve(f.Host(p)).Address, strconv.Itoa(f.OrchestratorPorts(p).ClusterPort)))
		}
	}
	return []string{"--name", host, "--cluster-listen", fmt.Sprintf("0.0.0.0:%d", f.OrchestratorPorts(host).ClusterPort),
		"--cluster-peers", strings.Join(peers, ",")}
}

// UpOrchestrator runs the orchestrator on one of the file's orchestrator
// hosts as a supervised service, with the control token and the event
// plane's token (opt.NATSToken) in its environment, listening on the
// host's orchestrator ports; re-runs leave it alone unless its config or
// binary changed. The URLs it returns use the host's address as the other
// machines reach it (spec.orchestrator.advertise when set).
func UpOrchestrator(ctx context.Context, f *File, host string, opt UpOptions, controlToken string) OrchestratorResult {
	o := f.Spec.Orchestrator
	h := f.Host(host)
	ports := f.OrchestratorPorts(host)
	r := OrchestratorResult{Host: h.Name}
	fail := func(phase string, err error) OrchestratorResult {
		r.Phase, r.Action, r.err, r.Error = phase, "failed", err, err.Error()
		return r
	}
	opt.progress(h.Name, PhaseConnect, "orchestrator")
	c, err := opt.Dial(ctx, h)
	if err != nil {
		return fail(PhaseConnect, err)
	}
	defer c.Close()
	opt.progress(h.Name, PhaseFacts, "orchestrator")
	fs, err := facts(ctx, c, h.StateDir())
	if err != nil {
		return fail(PhaseFacts, err)
	}
	if err := opt.fits(fs); err != nil {
		return fail(PhaseFacts, err)
	}
	sd, err := opt.serviceManager(ctx, c, &fs)
	if err != nil {
		return fail(PhaseFacts, err)
	}
	opt.progress(h.Name, PhaseUpload, "orchestrator")
	binSum, _, err := installBinary(ctx, c, h, fs.Arch, opt)
	if err != nil {
		return fail(PhaseUpload, err)
	}
	dir := h.OrchestratorDir()
	home, err := c.Run(ctx, "printf %s "+dir)
	if err != nil {
		return fail(PhaseConfig, err)
	}
	dir = strings.TrimSpace(home)
	args := []string{"orchestrator",
		"--router-addr", fmt.Sprintf("0.0.0.0:%d", ports.RouterPort),
		"--control-addr", fmt.Sprintf("0.0.0.0:%d", ports.ControlPort),
		"--nats-listen", fmt.Sprintf("0.0.0.0:%d", ports.NATSPort),
		"--data-dir", dir + "/nats", "--ready-file", dir + "/ready.json", "--log-format", "json"}
	args = append(append(append(args, clusterArgs(f, host, opt)...), o.Args()...), opt.OrchestratorArgs...)
	env := map[string]string{"EVOLVE_ORCHESTRATOR_TOKEN": controlToken, "EVOLVE_ORCHESTRATOR_NATS_TOKEN": opt.NATSToken}
	// The keys go in a private file the orchestrator reads again when it
	// changes: a re-run with other keys rewrites it (in one rename) and
	// leaves the orchestrator serving, its streams uncut.
	keyFile := dir + "/api-keys"
	if len(opt.APIKeys) > 0 {
		keys := "# the agents' API keys, written by evolve up -f: give it other keys and run it again\n" + strings.Join(opt.APIKeys, "\n") + "\n"
		if err := c.Upload(ctx, strings.NewReader(keys), keyFile, 0o600); err != nil {
			return fail(PhaseConfig, fmt.Errorf("write the API keys to %s: %w", keyFile, err))
		}
		args = append(args, "--api-key-file", keyFile)
	} else if _, err := c.Run(ctx, "rm -f "+keyFile); err != nil {
		return fail(PhaseConfig, err)
	}
	svc := service{name: "orchestrator", what: "the orchestrator of cluster " + f.Metadata.Name, bin: h.StateDir() + "/bin/evolve",
		dir: dir, env: env, args: args}
	// A restart must not read the last run's ready file.
	stale := func(phase string) {
		if phase == PhaseStart {
			c.Run(ctx, fmt.Sprintf("rm -f %s/ready.json", dir))
		}
		opt.progress(h.Name, phase, "orchestrator")
	}
	action, phase, err := ensureService(ctx, c, sd, svc, binSum, stale)
	if err != nil {
		return fail(phase, err)
	}
	r.Phase, r.Action = PhaseStart, action

	// Wait for it to serve, as its ready file says.
	deadline := time.Now().Add(orchestratorReady)
	if len(o.OnHosts()) > 1 {
		// It serves once a majority of the orchestrators have met, some
		// of which may still be installing.
		deadline = deadline.Add(orchestratorReady)
	}
	var ready struct {
		RouterURL  string `json:"router_url"`
		ControlURL string `json:"control_url"`
		NATSURL    string `json:"nats_url"`
	}
	for {
		out, err := c.Run(ctx, waitForFile(dir+"/ready.json", time.Until(deadline)))
		if err == nil && json.Unmarshal([]byte(out), &ready) == nil && ready.RouterURL != "" {
			break
		}
		if time.Now().After(deadline) {
			log, _ := c.Run(ctx, fmt.Sprintf("tail -n 5 %s/orchestrator.log 2>/dev/null", dir))
			return fail(PhaseStart, fmt.Errorf("the orchestrator did not start within %v; the end of %s/orchestrator.log:\n%s", time.Since(deadline.Add(-orchestratorReady)).Round(time.Second), dir, strings.TrimSpace(log)))
		}
		select {
		case <-ctx.Done():
			return fail(PhaseStart, ctx.Err())
		case <-time.After(readyPoll):
		}
	}
	addr := o.Advertise
	if addr == "" {
		addr = opt.resolve(h).Address
	}
	repl := strings.NewReplacer("[::]", addr, "0.0.0.0", addr)
	r.RouterURL, r.ControlURL, r.NATSURL = repl.Replace(ready.RouterURL), repl.Replace(ready.ControlURL), repl.Replace(ready.NATSURL)
	opt.progress(h.Name, PhaseStart, "orchestrator "+action)
	return r
}

// readyPoll is how often a remote wait for a file looks for it.
const readyPoll = 200 * time.Millisecond

// waitForFile is a command that waits on the host, up to about d, for a
// file to be there and not empty, and then prints it. One session does
// the whole wait: each session starts the user's login shell, which on
// hosts whose shell rc files set up pyenv or conda costs half a second of
// CPU, so polling with a session each time would keep a core busy.
func waitForFile(path string, d time.Duration) string {
	polls := max(1, int(d/readyPoll)+1)
	f := shellQuote(path)
	return fmt.Sprintf(`i=0; while [ ! -s %[1]s ] && [ $i -lt %[2]d ]; do sleep 0.2 2>/dev/null || sleep 1; i=$((i+1)); done; cat %[1]s 2>/dev/null; true`, f, polls)
}

// DownOrchestrators stops the orchestrators evolve up runs on the file's
// hosts, all at once, and removes their files.
func DownOrchestrators(ctx context.Context, f *File, opt UpOptions) []OrchestratorResult {
	return onOrchestratorHosts(f, func(host string) OrchestratorResult { return DownOrchestrator(ctx, f, host, opt) })
}

// DownOrchestrator stops the orchestrator evolve up runs on a host and
// removes its files (its NATS data too).
func DownOrchestrator(ctx context.Context, f *File, host string, opt UpOptions) OrchestratorResult {
	h := f.Host(host)
	r := OrchestratorResult{Host: h.Name}
	c, err := opt.Dial(ctx, h)
	if err != nil {
		r.Phase, r.Action, r.err, r.Error = PhaseConnect, "failed", err, err.Error()
		return r
	}
	defer c.Close()
	opt.progress(h.Name, PhaseStart, "stopping the orchestrator")
	dir := h.OrchestratorDir()
	// The state folder goes too once empty (the engine's down empties it).
	if _, err := c.Run(ctx, stopCommand(dir)+fmt.Sprintf(" && rm -rf %s && { rmdir %s 2>/dev/null || sudo -n rmdir %s 2>/dev/null; }; true", dir, h.StateDir(), h.StateDir())); err != nil {
		r.Phase, r.Action, r.err, r.Error = PhaseStart, "failed", err, err.Error()
		return r
	}
	r.Phase, r.Action = PhaseStart, "stopped"
	return r
}

// OrchestratorRunning reports whether the orchestrator evolve up started
// on a host runs.
func OrchestratorRunning(ctx context.Context, f *File, host string, opt UpOptions) (bool, error) {
	h := f.Host(host)
	c, err := opt.Dial(ctx, h)
	if err != nil {
		return false, err
	}
	defer c.Close()
	return isRunning(ctx, c, h.OrchestratorDir()), nil
}
