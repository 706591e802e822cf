package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/evolvellm/evolve/cluster"
	"github.com/evolvellm/evolve/orchestrator/routing"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// fileClusterState is what `evolve up -f` keeps on the operator's machine
// (0600, under $XDG_STATE_HOME/evolve/clusters/NAME): the orchestrator it
// started and how to reach it.
type fileClusterState struct {
	Name         string    `json:"name"`
	File         string    `json:"file"`
	Orchestrator int       `json:"orchestrator_pid"`            // on this machine
	OrchHost     string    `json:"orchestrator_host,omitempty"` // or on this host of the cluster
	RouterURL    string    `json:"router_url"`
	ControlURL   string    `json:"control_url"`
	NATSURL      string    `json:"nats_url"`
	ControlToken string    `json:"control_token"`
	NATSToken    string    `json:"nats_token"` // engines present it to the event plane
	Started      time.Time `json:"started"`
	// Orchestrators are those of spec.orchestrator.hosts, when several;
	// the URLs above are the first serving one's, NATSURL every one's.
	Orchestrators []fileOrchestrator `json:"orchestrators,omitempty"`
}

// fileOrchestrator is one of the orchestrators up ran on a cluster
// file's hosts, and what up did to it.
type fileOrchestrator struct {
	Host       string `json:"host"`
	Action     string `json:"action"` // started, restarted, unchanged, failed
	RouterURL  string `json:"router_url,omitempty"`
	ControlURL string `json:"control_url,omitempty"`
	Error      string `json:"error,omitempty"`
}

func clusterDir(name string) string { return filepath.Join(stateDir(), "clusters", name) }

func readClusterState(name string) (*fileClusterState, error) {
	b, err := os.ReadFile(filepath.Join(clusterDir(name), "state.json"))
	if err != nil {
		return nil, err
	}
	var st fileClusterState
	return &st, json.Unmarshal(b, &st)
}

func writeClusterState(st *fileClusterState) error {
	b, _ := json.MarshalIndent(st, "", "  ")
	p := filepath.Join(clusterDir(st.Name), "state.json")
	if err := os.WriteFile(p+".tmp", b, 0o600); err != nil {
		return err
	}
	return os.Rename(p+".tmp", p)
}

// upOutput is what `evolve up -f -o json` prints. Names are stable.
type upOutput struct {
	Cluster    string `json:"cluster"`
	RouterURL  string `json:"router_url"`
	ControlURL string `json:"control_url"`
	TokenFile  string `json:"control_token_file"`
	// Orchestrator: where it runs (local or a host's name) and what up did
	// to it (started, restarted, unchanged).
	Orchestrator struct {
		Host   string `json:"host"`
		Action string `json:"action"`
	} `json:"orchestrator"`
	// Orchestrators: of spec.orchestrator.hosts, each one (the first
	// serving one is also Orchestrator above).
	Orchestrators []fileOrchestrator   `json:"orchestrators,omitempty"`
	Hosts         []cluster.HostResult `json:"hosts"`
	Failed        int                  `json:"failed"`
	Interrupted   int                  `json:"interrupted,omitempty"` // hosts cut short by Ctrl-C
	DebugLog      string               `json:"debug_log"`
}

func loadClusterFile(cmd *cobra.Command, path string) (*cluster.File, error) {
	if d, _ := cmd.Flags().GetDuration("ssh-timeout"); d <= 0 {
		return nil, usageError{cmd: cmd.CommandPath(), err: fmt.Errorf("--ssh-timeout must be positive")}
	}
	f, err := cluster.Load(path)
	if err != nil {
		var es cluster.Errors
		if errors.As(err, &es) {
			return nil, usageError{cmd: cmd.CommandPath(), err: err}
		}
		return nil, usageError{cmd: cmd.CommandPath(), err: fmt.Errorf("cluster file: %w", err)}
	}
	return f, nil
}

// upFromFile brings up the hosts of a cluster file over SSH, with the
// orchestrator on this machine or on a host of its own.
func upFromFile(cmd *cobra.Command, path string, dryRun bool) error {
	f, err := loadClusterFile(cmd, path)
	if err != nil {
		return err
	}
	if dryRun {
		return printUpPlan(cmd, f, path)
	}
	keys, err := checkUpFileFlags()
	if err != nil {
		return usageError{cmd: cmd.CommandPath(), err: err}
	}
	errw := cmd.ErrOrStderr()
	dir := clusterDir(f.Metadata.Name)
	if err := os.MkdirAll(filepath.Join(dir, "logs"), 0o700); err != nil {
		return err
	}
	// Ctrl-C (or a closed terminal) cuts the bring-up short, not the
	// process: what is under way on each host stops, and the summary says
	// which hosts finished and which did not.
	ctx, stop := notifyInterrupt(cmd.Context())
	defer stop()
	debugPath := filepath.Join(dir, "logs", "up-"+time.Now().Format("20060102-150405")+".log")
	debug, err := os.OpenFile(debugPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer debug.Close()
	fmt.Fprintf(errw, "bringing up cluster %s (%s); debug log %s\n", f.Metadata.Name, hostsAndEngines(f), debugPath)
	prog := newHostProgress(errw, f)
	opt, err := upFileOptions(dir, lockedWriter{&prog.mu, debug}, prog, keys)
	if err != nil {
		return err
	}
	var st *fileClusterState
	var orchAction string
	var orchFailed []cluster.HostResult
	if f.Spec.Orchestrator.Local() {
		if st, orchAction, err = ensureOrchestrator(ctx, cmd, f, path, dir, debug, keys); err != nil {
			return err
		}
		// Engines reach the orchestrator that runs (a re-run keeps the one
		// it finds, on the ports it has).
		scheme := "nats"
		if u, err := url.Parse(st.NATSURL); err == nil {
			opt.NATSPort, _ = strconv.Atoi(u.Port())
			scheme = u.Scheme
		}
		opt.NATSTLS = scheme == "tls"
		if a := f.Spec.Orchestrator.Advertise; a != "" {
			opt.NATS = fmt.Sprintf("%s://%s:%d", scheme, a, opt.NATSPort)
		}
	} else if st, orchAction, orchFailed, err = ensureHostOrchestrators(ctx, cmd, f, path, opt); err != nil {
		return err
	} else {
		opt.NATS = st.NATSURL
	}
	opt.NATSToken = st.NATSToken
	res := cluster.Up(ctx, f, opt)
	res = append(waitRegistered(ctx, f, st, res, prog), orchFailed...)
	out := upOutput{Cluster: f.Metadata.Name, RouterURL: st.RouterURL, ControlURL: st.ControlURL,
		TokenFile: filepath.Join(dir, "state.json"), Hosts: res, DebugLog: debugPath, Orchestrators: st.Orchestrators}
	out.Orchestrator.Host, out.Orchestrator.Action = cmp.Or(st.OrchHost, "local"), orchAction
	return reportUpFile(cmd, path, out, debug)
}

// printUpPlan prints what evolve up -f would do on each host (--dry-run).
func printUpPlan(cmd *cobra.Command, f *cluster.File, path string) error {
	groups := f.PlanGroups(sshOptions("up"))
	out := map[string]any{"cluster": f.Metadata.Name, "file": path, "valid": true, "hosts": f.Plan(), "groups": groups}
	return output(cmd, out, func(w *tabwriter.Writer, _ bool) {
		fmt.Fprintf(w, "%s: cluster %s, %s, valid\n", path, f.Metadata.Name, hostsAndEngines(f))
		cluster.WritePlan(w, groups, textWidth(cmd.OutOrStdout()))
	})
}

// checkUpFileFlags checks the flags evolve up -f takes and returns the API
// keys they give.
func checkUpFileFlags() ([]string, error) {
	switch v := config.GetString("up.service"); v {
	case "auto", "systemd", "process":
	default:
		return nil, fmt.Errorf("--service %q: want auto, systemd or process", v)
	}
	keys, err := apiKeys("up")
	if err != nil {
		return nil, err
	}
	if _, err := routing.New(config.GetString("up.policy")); err != nil {
		return nil, fmt.Errorf("--policy: %w", err)
	}
	return keys, checkPlannerFlags("up")
}

// upFileOptions is how the hosts are brought up: over SSH as the flags
// say, with this evolve binary (or --binary), cross-compiled from the
// source checkout this runs in for hosts of another architecture.
func upFileOptions(dir string, log io.Writer, prog *hostProgress, keys []string) (cluster.UpOptions, error) {
	exe := config.GetString("up.binary")
	if exe == "" {
		var err error
		if exe, err = os.Executable(); err != nil {
			return cluster.UpOptions{}, err
		}
	}
	arch := cluster.BinaryArch(exe)
	if arch == "" {
		arch = runtime.GOOS + "/" + runtime.GOARCH
		if runtime.GOOS == "linux" {
			arch = "unknown" // not an ELF binary we can place
		}
	}
	builder := &cluster.SourceBuilder{Out: filepath.Join(dir, "bin"), Log: log}
	if cwd, err := os.Getwd(); err == nil {
		builder.Dir, _ = cluster.FindSource(cwd)
	}
	return cluster.UpOptions{Dial: cluster.SSHDialer(sshOptions("up")), Resolve: cluster.Resolver(sshOptions("up")),
		Binary: exe, BinaryArch: arch, Build: builder.Build, Log: log, Progress: prog.update, Service: config.GetString("up.service"),
		APIKeys: keys, OrchestratorArgs: routingFlags()}, nil
}

// waitRegistered waits until every engine that started has registered
// and serves, and marks those that did not in time (or when interrupted)
// in the results it returns.
func waitRegistered(ctx context.Context, f *cluster.File, st *fileClusterState, res []cluster.HostResult, prog *hostProgress) []cluster.HostResult {
	var want []string
	for _, r := range res {
		if r.Err() == nil {
			want = append(want, r.Host)
		}
	}
	c := &controlClient{base: st.ControlURL, token: st.ControlToken, http: newHTTPClient(5 * time.Second)}
	timeout := config.GetDuration("up.timeout")
	if !config.IsSet("up.timeout") && hasVLLM(f) {
		timeout = vllmReadyTimeout // vLLM loads its model first: minutes, not seconds
	}
	waitStart := time.Now()
	deadline := waitStart.Add(timeout)
	var lastNote time.Time
	noteEvery := time.Second
	if !prog.tty {
		noteEvery = 30 * time.Second // plain lines: one now and then
	}
	mark := func(hosts []string, f func(cluster.HostResult) cluster.HostResult) {
		for i := range res {
			if slices.Contains(hosts, res[i].Host) {
				res[i] = f(res[i])
			}
		}
	}
	for len(want) > 0 {
		var nodes []struct{ ID, State string }
		serving := map[string]bool{}
		// After Ctrl-C, one last look still tells which hosts serve.
		if c.do(context.WithoutCancel(ctx), "GET", "/api/v1/nodes", nil, &nodes) == nil {
			for _, n := range nodes {
				serving[n.ID] = n.State == "serving"
			}
		}
		left := want[:0:0]
		for _, h := range want {
			if !serving[h] {
				left = append(left, h)
			} else if time.Since(waitStart) > time.Second {
				prog.update(h, "serving", "") // after a wait worth mentioning
			}
		}
		if want = left; len(want) == 0 || ctx.Err() != nil {
			break
		}
		if time.Since(lastNote) >= noteEvery && time.Since(waitStart) > 2*time.Second {
			lastNote = time.Now()
			for _, h := range left {
				prog.update(h, "register", fmt.Sprintf("waiting for the engine to serve (%s of %s)", time.Since(waitStart).Round(time.Second), timeout))
			}
		}
		if time.Now().After(deadline) {
			mark(left, func(r cluster.HostResult) cluster.HostResult {
				return cluster.Failed(r, "register", fmt.Errorf("the engine did not register with the orchestrator within %v (see its log: %s/engine.log on the host)", timeout, f.Engine(r.Host).StateDir()))
			})
			break
		}
		sleepCtx(ctx, 200*time.Millisecond)
	}
	if ctx.Err() != nil {
		// Those still waiting to register were cut short there.
		mark(want, func(r cluster.HostResult) cluster.HostResult {
			if r.Err() != nil {
				return r
			}
			r.Phase = "register"
			return cluster.Interrupted(r, ctx.Err())
		})
	}
	return res
}

// reportUpFile prints each host's result and returns what failed or was
// cut short, saying how to finish.
func reportUpFile(cmd *cobra.Command, path string, out upOutput, debug io.Writer) error {
	res := out.Hosts
	var failed, cut []cluster.HostResult
	for _, r := range res {
		fmt.Fprintf(debug, "result %s: %s (phase %s) %s\n", r.Host, r.Action, r.Phase, r.Error)
		switch {
		case r.Action == "interrupted":
			cut = append(cut, r)
		case r.Err() != nil:
			failed = append(failed, r)
		}
	}
	out.Failed, out.Interrupted = len(failed), len(cut)
	if err := output(cmd, out, func(w *tabwriter.Writer, _ bool) {
		if len(out.Orchestrators) > 1 {
			fmt.Fprintf(w, "cluster %s: %d orchestrators (token in %s)\n", out.Cluster, len(out.Orchestrators), out.TokenFile)
			for _, o := range out.Orchestrators {
				if o.Error != "" {
					fmt.Fprintf(w, "  on %s: failed\n", o.Host)
				} else {
					fmt.Fprintf(w, "  on %s: %s, router %s, control %s\n", o.Host, o.Action, o.RouterURL, o.ControlURL)
				}
			}
			fmt.Fprintln(w)
		} else {
			fmt.Fprintf(w, "cluster %s: router %s, control %s (token in %s)\n\n", out.Cluster, out.RouterURL, out.ControlURL, out.TokenFile)
		}
		fmt.Fprintln(w, "HOST\tRESULT\tBINARY\tARCH\tGPUS")
		for _, r := range res {
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\n", r.Host, r.Action, r.Upload, r.Facts.Arch, r.Facts.GPUs)
		}
	}); err != nil {
		return err
	}
	if len(cut) > 0 {
		var b strings.Builder
		fmt.Fprintf(&b, "interrupted: %d of %d hosts did not finish:", len(cut)+len(failed), len(res))
		for _, r := range append(failed, cut...) {
			fmt.Fprintf(&b, "\n  %s: %s", r.Host, r.Error)
		}
		var serving []string
		for _, r := range res {
			if r.Err() == nil {
				serving = append(serving, r.Host)
			}
		}
		if len(serving) > 0 {
			fmt.Fprintf(&b, "\nserving: %s", strings.Join(serving, ", "))
		}
		fmt.Fprintf(&b, "\nRun 'evolve up -f %s' again to finish (it picks up where each host stands), or 'evolve down -f %s' to remove what started.\n(debug log: %s)", path, path, out.DebugLog)
		return errors.New(b.String())
	}
	if len(failed) > 0 {
		var b strings.Builder
		fmt.Fprintf(&b, "failed on %d host", len(failed))
		if len(failed) > 1 {
			b.WriteString("s")
		}
		b.WriteString(":")
		for _, r := range failed {
			fmt.Fprintf(&b, "\n  %s: %s: %s", r.Host, r.Phase, r.Error)
		}
		fmt.Fprintf(&b, "\n(debug log: %s)", out.DebugLog)
		if len(failed) < len(res) {
			return exitCodeError{code: 3, err: errors.New(b.String())}
		}
		return errors.New(b.String())
	}
	return nil
}

// newSecret is a fresh token.
func newSecret() string {
	b := make([]byte, 24)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// ensureHostOrchestrators runs the cluster's orchestrators on the hosts
// the file names, with the tokens this machine keeps for the cluster (made
// on the first run), so that a re-run finds them unchanged. Of several,
// those that failed come back as failed results while one serves; none
// serving is an error.
func ensureHostOrchestrators(ctx context.Context, cmd *cobra.Command, f *cluster.File, path string, opt cluster.UpOptions) (*fileClusterState, string, []cluster.HostResult, error) {
	st, err := readClusterState(f.Metadata.Name)
	if err != nil || st.ControlToken == "" || st.NATSToken == "" {
		st = &fileClusterState{Name: f.Metadata.Name, ControlToken: newSecret(), NATSToken: newSecret(), Started: time.Now()}
	}
	st.File, st.Orchestrator, st.OrchHost, st.Orchestrators = path, 0, "", nil
	st.RouterURL, st.ControlURL, st.NATSURL = "", "", ""
	if abs, err := filepath.Abs(path); err == nil {
		st.File = abs
	}
	opt.NATSToken = st.NATSToken
	results := cluster.UpOrchestrators(ctx, f, opt, st.ControlToken)
	var failed []cluster.HostResult
	var problems, natsURLs []string
	action := ""
	for _, r := range results {
		if ctx.Err() != nil {
			return nil, "", nil, fmt.Errorf("interrupted while the orchestrator started on host %s (at %s); run 'evolve up -f %s' again to finish, or 'evolve down -f %s'", r.Host, r.Phase, path, path)
		}
		o := fileOrchestrator{Host: r.Host, Action: r.Action, RouterURL: r.RouterURL, ControlURL: r.ControlURL, Error: r.Error}
		st.Orchestrators = append(st.Orchestrators, o)
		if err := r.Err(); err != nil {
			problems = append(problems, fmt.Sprintf("the orchestrator on host %s failed at %s: %v", r.Host, r.Phase, err))
			failed = append(failed, cluster.Failed(cluster.HostResult{Host: r.Host + " (orchestrator)"}, r.Phase, err))
			continue
		}
		fmt.Fprintf(cmd.ErrOrStderr(), "orchestrator %s on host %s: router %s\n", r.Action, r.Host, r.RouterURL)
		natsURLs = append(natsURLs, r.NATSURL)
		if st.RouterURL == "" {
			st.OrchHost, st.RouterURL, st.ControlURL, action = r.Host, r.RouterURL, r.ControlURL, r.Action
		}
	}
	if len(natsURLs) == 0 {
		return nil, "", nil, errors.New(strings.Join(problems, "\n"))
	}
	st.NATSURL = strings.Join(natsURLs, ",")
	if len(results) == 1 {
		st.Orchestrators = nil // the fields above say it all
	}
	return st, action, failed, writeClusterState(st)
}

// ensureOrchestrator starts the cluster's orchestrator on this machine
// unless it runs already (a re-run converges).
func ensureOrchestrator(ctx context.Context, cmd *cobra.Command, f *cluster.File, path, dir string, debug io.Writer, keys []string) (*fileClusterState, string, error) {
	if st, err := readClusterState(f.Metadata.Name); err == nil && cluster.Ours(st.Orchestrator) {
		fmt.Fprintf(debug, "orchestrator already running, pid %d\n", st.Orchestrator)
		return st, "unchanged", nil
	}
	st := &fileClusterState{Name: f.Metadata.Name, File: path, ControlToken: newSecret(), NATSToken: newSecret(), Started: time.Now()}
	if abs, err := filepath.Abs(path); err == nil {
		st.File = abs
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, "", err
	}
	o := f.Spec.Orchestrator
	ready := filepath.Join(dir, "orchestrator.ready")
	os.Remove(ready)
	logPath := filepath.Join(dir, "logs", "orchestrator.log")
	args := append([]string{"orchestrator", "--router-addr", fmt.Sprintf("0.0.0.0:%d", o.RouterPort), "--control-addr", fmt.Sprintf("127.0.0.1:%d", o.ControlPort),
		"--nats-listen", fmt.Sprintf("0.0.0.0:%d", o.NATSPort), "--data-dir", filepath.Join(dir, "nats"),
		"--ready-file", ready, "--log-format", "json"}, o.Args()...)
	args = append(args, routingFlags()...)
	p, err := cluster.StartChild(exe, logPath, true,
		append([]string{"EVOLVE_ORCHESTRATOR_TOKEN=" + st.ControlToken, "EVOLVE_ORCHESTRATOR_NATS_TOKEN=" + st.NATSToken}, apiKeyEnv(keys)...), args...)
	if err != nil {
		return nil, "", err
	}
	st.Orchestrator = p.Process.Pid
	deadline := time.Now().Add(30 * time.Second)
	var info readyInfo
	for {
		if b, err := os.ReadFile(ready); err == nil && json.Unmarshal(b, &info) == nil {
			break
		}
		if !cluster.Alive(p.Process.Pid) || time.Now().After(deadline) {
			return nil, "", fmt.Errorf("the orchestrator did not start:\n%s", tail(logPath, 10))
		}
		if !sleepCtx(ctx, 50*time.Millisecond) {
			// Nothing knows of it yet (no state written): stop it, or
			// it runs on where 'evolve down -f' cannot find it.
			cluster.StopPIDs(cmd.ErrOrStderr(), []int{p.Process.Pid}, nil, 15*time.Second)
			return nil, "", errors.New("interrupted while the orchestrator started; stopped it")
		}
	}
	// Listening on every interface, they report the wildcard address; say
	// one that clients can use.
	host := o.Advertise
	if host == "" {
		host = "127.0.0.1"
	}
	for _, u := range []*string{&info.RouterURL, &info.NATSURL} {
		*u = strings.NewReplacer("[::]", host, "0.0.0.0", host).Replace(*u)
	}
	st.RouterURL, st.ControlURL, st.NATSURL = info.RouterURL, info.ControlURL, info.NATSURL
	fmt.Fprintf(cmd.ErrOrStderr(), "orchestrator started on this machine: router %s (log %s)\n", st.RouterURL, logPath)
	return st, "started", writeClusterState(st)
}

// downFromFile stops the engines of a cluster file's hosts and removes
// what up installed, then stops the orchestrator up started here.
func downFromFile(cmd *cobra.Command, path string, yes bool) error {
	f, err := loadClusterFile(cmd, path)
	if err != nil {
		return err
	}
	errw := cmd.ErrOrStderr()
	if !yes {
		if fi, err := os.Stdin.Stat(); err != nil || fi.Mode()&os.ModeCharDevice == 0 {
			return usageError{cmd: cmd.CommandPath(), err: fmt.Errorf("stopping cluster %s on %d hosts needs --yes when not asked on a terminal", f.Metadata.Name, len(f.Spec.Hosts))}
		}
		fmt.Fprintf(errw, "stop cluster %s: the engines on %d hosts and the orchestrator, and remove what evolve installed? [y/N] ", f.Metadata.Name, len(f.Spec.Hosts))
		var answer string
		fmt.Fscanln(os.Stdin, &answer)
		if answer != "y" && answer != "Y" && answer != "yes" {
			return errors.New("cancelled")
		}
	}
	dopt := cluster.UpOptions{Dial: cluster.SSHDialer(sshOptions("down")), Progress: newHostProgress(errw, f).update}
	ctx, stop := notifyInterrupt(cmd.Context())
	defer stop()
	res := cluster.Down(ctx, f, dopt)
	if ctx.Err() != nil {
		// Engines still run: the orchestrator they report to stays.
		var left []string
		for _, r := range res {
			if r.Err() != nil {
				left = append(left, fmt.Sprintf("  %s: %s", r.Host, r.Error))
			}
		}
		output(cmd, map[string]any{"cluster": f.Metadata.Name, "hosts": res, "failed": len(left), "interrupted": true}, func(w *tabwriter.Writer, _ bool) {
			for _, r := range res {
				fmt.Fprintf(w, "%s\t%s\n", r.Host, r.Action)
			}
		})
		return fmt.Errorf("interrupted: %d of %d hosts not stopped:\n%s\nthe orchestrator still runs; run 'evolve down -f %s' again to finish", len(left), len(res), strings.Join(left, "\n"), path)
	}
	orch := "stopped"
	// Last: engines deregister from them as they stop.
	for _, r := range cluster.DownOrchestrators(ctx, f, dopt) {
		if r.Err() != nil {
			orch = "failed"
			res = append(res, cluster.Failed(cluster.HostResult{Host: r.Host + " (orchestrator)"}, r.Phase, r.Err()))
		}
	}
	if st, err := readClusterState(f.Metadata.Name); err == nil {
		if st.Orchestrator > 0 {
			cluster.StopPIDs(errw, []int{st.Orchestrator}, nil, 15*time.Second)
		}
		if orch == "stopped" {
			os.Remove(filepath.Join(clusterDir(f.Metadata.Name), "state.json"))
			os.RemoveAll(filepath.Join(clusterDir(f.Metadata.Name), "nats"))
		}
	}
	var failed []string
	for _, r := range res {
		if r.Err() != nil {
			failed = append(failed, fmt.Sprintf("  %s: %s: %s", r.Host, r.Phase, r.Error))
		}
	}
	if err := output(cmd, map[string]any{"cluster": f.Metadata.Name, "hosts": res, "failed": len(failed)}, func(w *tabwriter.Writer, _ bool) {
		for _, r := range res {
			fmt.Fprintf(w, "%s\t%s\n", r.Host, r.Action)
		}
	}); err != nil {
		return err
	}
	if len(failed) > 0 {
		return exitCodeError{code: 3, err: fmt.Errorf("failed on %d hosts:\n%s", len(failed), strings.Join(failed, "\n"))}
	}
	return nil
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// addSSHFlags adds the flags of the commands that reach a cluster file's
// hosts over SSH (up, down and status with -f).
func addSSHFlags(f *pflag.FlagSet) {
	f.String("known-hosts", "", "with -f: known_hosts file that host keys are checked against (default ~/.ssh/known_hosts)")
	f.String("ssh-config", "", "with -f: OpenSSH client config for host aliases (default ~/.ssh/config; none ignores it)")
	f.Duration("ssh-timeout", 10*time.Second, "with -f: how long to wait for a host's SSH connection and handshake (a slow link or a busy bastion needs more)")
}

// sshOptions reads the SSH flags of a command (those it lacks are unset).
func sshOptions(cmd string) cluster.SSHOptions {
	return cluster.SSHOptions{KnownHosts: config.GetString(cmd + ".known-hosts"),
		AcceptNewHostKeys: config.GetBool(cmd + ".accept-new-host-keys"), SSHConfig: config.GetString(cmd + ".ssh-config"),
		Timeout: config.GetDuration(cmd + ".ssh-timeout")}
}

// hostProgress shows each host's phase: on a terminal one live line per
// host, redrawn in place; otherwise a plain line per change. Hosts report
// at once; mu orders them (and the debug log written beside).
type hostProgress struct {
	mu    sync.Mutex
	w     io.Writer
	tty   bool
	hosts []string
	lines map[string]string
	drawn bool
}

func newHostProgress(w io.Writer, f *cluster.File) *hostProgress {
	p := &hostProgress{w: w, lines: map[string]string{}}
	if file, ok := w.(*os.File); ok {
		if fi, err := file.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 && os.Getenv("TERM") != "dumb" {
			p.tty = true
		}
	}
	for _, h := range f.Engines() {
		p.hosts = append(p.hosts, h.Name)
		p.lines[h.Name] = "waiting"
	}
	return p
}

func (p *hostProgress) update(host, phase, detail string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	line := phase
	if detail != "" {
		line += " " + detail
	}
	if !p.tty {
		fmt.Fprintf(p.w, "%-16s %s\n", host, line)
		return
	}
	p.lines[host] = line
	if p.drawn {
		fmt.Fprintf(p.w, "\x1b[%dA", len(p.hosts)) // back to the first host's line
	}
	for _, h := range p.hosts {
		fmt.Fprintf(p.w, "\x1b[2K%-16s %s\n", h, p.lines[h])
	}
	p.drawn = true
}

// statusOfFile is what `evolve status -f -o json` prints. Names are stable.
type statusOfFile struct {
	Cluster      string `json:"cluster"`
	Orchestrator string `json:"orchestrator"` // running, stopped, or unknown here
	RouterURL    string `json:"router_url,omitempty"`
	ControlURL   string `json:"control_url,omitempty"`
	// Orchestrators: of those on hosts, each one's state (running,
	// stopped, or unreachable: why).
	Orchestrators []fileOrchestratorState `json:"orchestrators,omitempty"`
	Hosts         []cluster.HostStatus    `json:"hosts"`
}

// fileOrchestratorState is whether the orchestrator on a host runs.
type fileOrchestratorState struct {
	Host  string `json:"host"`
	State string `json:"state"`
}

// statusFromFile reports a cluster of a file: its orchestrator (when it
// runs on this machine) and, over SSH, what each host runs.
func statusFromFile(cmd *cobra.Command, path string) error {
	f, err := loadClusterFile(cmd, path)
	if err != nil {
		return err
	}
	out := statusOfFile{Cluster: f.Metadata.Name, Orchestrator: "unknown here"}
	sopt := cluster.UpOptions{Dial: cluster.SSHDialer(sshOptions("status"))}
	if st, err := readClusterState(f.Metadata.Name); err == nil {
		out.Orchestrator, out.RouterURL, out.ControlURL = "stopped", st.RouterURL, st.ControlURL
		if cluster.Ours(st.Orchestrator) {
			out.Orchestrator = "running"
		}
	}
	// Those on hosts say themselves, over SSH, from any machine with the
	// file.
	hosts := f.Spec.Orchestrator.OnHosts()
	for _, o := range hosts {
		state, detail := "stopped", ""
		switch running, err := cluster.OrchestratorRunning(cmd.Context(), f, o, sopt); {
		case err != nil:
			state, detail = "unreachable", ": "+err.Error()
		case running:
			state = "running"
		}
		out.Orchestrators = append(out.Orchestrators, fileOrchestratorState{Host: o, State: state + detail})
		if len(hosts) == 1 {
			out.Orchestrator = state + " on host " + o + detail
		}
	}
	if len(hosts) > 1 {
		running := 0
		for _, o := range out.Orchestrators {
			if o.State == "running" {
				running++
			}
		}
		out.Orchestrator = fmt.Sprintf("%d of %d running", running, len(hosts))
	}
	out.Hosts = cluster.Status(cmd.Context(), f, sopt)
	failed := 0
	if err := output(cmd, out, func(w *tabwriter.Writer, _ bool) {
		fmt.Fprintf(w, "cluster %s: orchestrator %s %s\n", out.Cluster, out.Orchestrator, out.RouterURL)
		if len(out.Orchestrators) > 1 {
			for _, o := range out.Orchestrators {
				fmt.Fprintf(w, "  orchestrator on %s: %s\n", o.Host, o.State)
			}
		}
		fmt.Fprintln(w)
		fmt.Fprintln(w, "HOST\tENGINE\tSERVICE\tVERSION\tCONFIG")
		for _, h := range out.Hosts {
			state := "not installed"
			switch {
			case h.Error != "":
				state = "unreachable: " + h.Error
			case h.Running:
				state = "running"
			case h.Installed:
				state = "stopped"
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%.12s\n", h.Host, state, h.Service, h.Version, h.ConfigHash)
		}
	}); err != nil {
		return err
	}
	for _, h := range out.Hosts {
		if h.Error != "" {
			failed++
		}
	}
	if failed > 0 {
		return exitCodeError{code: 3, err: fmt.Errorf("%d hosts could not be reached", failed)}
	}
	return nil
}

// vllmReadyTimeout is how long `evolve up -f` waits for engines when a host
// runs vLLM and --timeout was not given.
const vllmReadyTimeout = 30 * time.Minute

// hostsAndEngines counts a cluster file's hosts, and its engines where
// some host runs several.
func hostsAndEngines(f *cluster.File) string {
	s := counted(len(f.Spec.Hosts), "host")
	if n := len(f.Engines()); n != len(f.Spec.Hosts) {
		s += ", " + counted(n, "engine")
	}
	return s
}

func hasVLLM(f *cluster.File) bool {
	for _, h := range f.Engines() {
		if h.Engine.Backend == "vllm" {
			return true
		}
	}
	return false
}
