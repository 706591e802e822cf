package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/evolvellm/evolve/cluster"
	"github.com/evolvellm/evolve/controlapi"
	"github.com/evolvellm/evolve/engine/stepmodel"
	"github.com/evolvellm/evolve/loadgen"
	"github.com/evolvellm/evolve/orchestrator"
	"github.com/evolvellm/evolve/orchestrator/apikeys"
	"github.com/evolvellm/evolve/orchestrator/routing"
	"github.com/evolvellm/evolve/tui"
	"github.com/evolvellm/evolve/workload"
	"github.com/spf13/cobra"
)

// routingFlags are the orchestrator flags evolve up passes on from its
// own, with or without a cluster file: the routing policy, the planner's
// and the model aliases.
func routingFlags() []string {
	key := func(k string) string { return "up." + k }
	args := []string{"--policy", config.GetString(key("policy")), "--planner", config.GetString(key("planner")),
		"--planner-interval", config.GetDuration(key("planner-interval")).String(),
		"--planner-persistence", config.GetDuration(key("planner-persistence")).String(),
		"--planner-ttft-weight", strconv.FormatFloat(config.GetFloat64(key("planner-ttft-weight")), 'g', -1, 64),
		"--planner-min-improvement", strconv.FormatFloat(config.GetFloat64(key("planner-min-improvement")), 'g', -1, 64)}
	for _, a := range configList(key("model-alias")) {
		args = append(args, "--model-alias", a)
	}
	return args
}

func localDir() string { return filepath.Join(stateDir(), "local") }

func newUpCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Bring up a local cluster: an orchestrator and simulated engines",
		Long: `Bring up a cluster on this machine: an orchestrator and --engines simulated
engines (--prefill of them prefill, the rest decode), each a separate
process on loopback. It prints the router URL for agents, the control URL,
and commands to try.

In the foreground (the default) Ctrl-C tears everything down cleanly:
engines drain, then the orchestrator stops. With --detach the cluster keeps
running; 'evolve down' stops it. Logs go to files under the state directory
($XDG_STATE_HOME/evolve/local/logs).

With --record DIR every router records the requests it serves, one row
each with timing, tokens, nodes, session and tool time but no prompt text
(docs/operating.md, "Recording the fleet's traffic"): 'evolve trace summary DIR' reads it, 'evolve trace
perfetto DIR' draws it, 'evolve sim --trace DIR' replays it.

With -f cluster.yaml it works on GPU hosts over SSH instead (apiVersion
evolve/v1, kind Cluster: hosts with their SSH address, user, port, key and
optional bastion, GPUs, engine backend and arguments, initial role; the
orchestrator's host and ports, or hosts: [a, b, c] for one on each, which
form one NATS cluster and serve on when one dies). --dry-run validates the file, naming the
field and line of every problem, and prints what would be done per host.
A small one (the README has a fuller example):

  apiVersion: evolve/v1
  kind: Cluster
  metadata: {name: lab}
  spec:
    orchestrator: {host: local}
    defaults: {user: ubuntu, gpus: 4, engine: {backend: vllm, args: [moonshotai/Kimi-K2-Instruct, --tensor-parallel-size, "4"]}}
    hosts:
      - {name: gpu-01, address: 10.0.0.11, role: prefill}
      - {name: gpu-02, address: 10.0.0.12}`,
		Example: `  evolve up
  evolve up --engines 8 --prefill 3 --profile gb300-kimi-k2 --speedup 20 --detach
  curl -s 127.0.0.1:8000/v1/completions -d '{"prompt": "Hello", "max_tokens": 8}'`,
		Args: noArgs,
		RunE: runUp,
	}
	f := cmd.Flags()
	f.Int("engines", 4, "simulated engines to start")
	f.Int("orchestrators", 1, "orchestrators to start, 1 to 5: several share one NATS cluster, each routes (the first on --router-addr, the others on free ports), one leads the planner, and the cluster serves on when one dies")
	f.Int("prefill", 0, "how many of them start as prefill (default: a third, at least 1)")
	f.String("profile", "tiny", "engine profile: "+strings.Join(stepmodel.ProfileNames(), ", ")+", or a YAML file (with --agents the default is gb300-kimi-k2)")
	f.Float64("speedup", 1, "modelled seconds per wall-clock second for every engine (with --agents the default is 10)")
	f.String("router-addr", "127.0.0.1:8000", "router address (port 0 picks a free port)")
	f.String("control-addr", "127.0.0.1:8001", "control API address (port 0 picks a free port)")
	f.String("nats-addr", "127.0.0.1:0", "address of the orchestrator's embedded NATS server (port 0 picks a free port)")
	f.String("policy", "evolve", "routing policy: "+strings.Join(routing.Names(), ", "))
	f.Bool("detach", false, "leave the cluster running and return")
	f.Duration("timeout", 60*time.Second, "how long to wait for the cluster to be ready (with -f and vLLM hosts: 30m unless set)")
	f.Int("agents", 0, "run this many simulated agents against the cluster (foreground only), printing their progress every 5 s and a summary at the end; unless given, --profile becomes gb300-kimi-k2 (agent-sized contexts) and --speedup 10 (ten minutes of agent work a minute)")
	f.String("workload", "shift", "agent workload for --agents: "+strings.Join(workload.Names(), ", ")+", mix:..., shift:...")
	f.Duration("duration", 0, "with --agents: stop after this long (0: until Ctrl-C)")
	f.StringP("file", "f", "", "bring up the GPU hosts of this cluster file over SSH (its format: above)")
	f.Bool("dry-run", false, "with -f: validate the cluster file and print what would be done on each host")
	addSSHFlags(f)
	f.String("service", "auto", "with -f: how hosts run evolve: auto (a systemd unit where systemd runs and evolve may write units as root or with sudo -n, else a supervised process), systemd or process")
	f.Bool("accept-new-host-keys", false, "with -f: trust hosts seen for the first time and record their keys (a changed key always fails)")
	f.String("binary", "", "with -f: the evolve binary to install on the hosts (default: this one); hosts of another architecture get one cross-compiled from the evolve source checkout evolve up runs in, with the Go toolchain")
	addModelAliasFlag(f)
	addAPIKeyFlags(f)
	addPlannerFlags(f)
	addRecordFlag(f)
	addOutputFlag(cmd, "table or json")
	return cmd
}

func runUp(cmd *cobra.Command, _ []string) error {
	key := func(k string) string { return "up." + k }
	warnOnCommandLine(cmd, "api-key", "$EVOLVE_UP_API_KEY or --api-key-file")
	if file := config.GetString(key("file")); file != "" {
		if config.GetString(key("record")) != "" {
			return usageError{cmd: cmd.CommandPath(), err: fmt.Errorf("--record records a local cluster's routers; with -f it is not supported yet: run 'evolve orchestrator --record DIR' on the orchestrator's host")}
		}
		return upFromFile(cmd, file, config.GetBool(key("dry-run")))
	}
	u, err := parseUp(cmd)
	if err != nil {
		return usageError{cmd: cmd.CommandPath(), err: err}
	}
	// The state directory's lock goes with this process: held while the
	// cluster starts, and while it runs in the foreground.
	defer func() { u.lock.Release() }()
	if err := u.prepare(); err != nil {
		return err
	}
	// The children run in their own process groups, so only this process
	// hears Ctrl-C, a closed terminal or a kill: it must stop them, or
	// they run on with nobody to stop them but 'evolve down'.
	ctx, stop := notifyInterrupt(context.Background())
	defer stop()
	u.ctx = ctx
	if err := u.startOrchestrator(); err != nil {
		return err
	}
	if err := u.startEngines(); err != nil {
		return err
	}
	if err := u.waitServing(); err != nil {
		return err
	}
	if err := u.print(); err != nil || u.detach {
		return err
	}
	if u.agents > 0 {
		return u.runAgents()
	}
	select {
	case <-ctx.Done():
		fmt.Fprintln(u.errw, "\nstopping the cluster")
	case <-u.orchDone:
		fmt.Fprintf(u.errw, "%s. The end of its log:\n%s\n", u.orchExited(), u.orchLogTail())
	}
	u.cleanup()
	return nil
}

// localUp is evolve up of a local cluster: an orchestrator and simulated
// engines, children of this process, on loopback.
type localUp struct {
	cmd              *cobra.Command
	errw             io.Writer
	key              func(string) string
	engines, prefill int
	orchestrators    int
	keys             []string // API keys
	agents           int
	model            workload.Model // the agents' workload, with agents
	detach           bool

	dir, logDir string
	st          *cluster.LocalState
	// Each child is waited for once; exited[pid] closes when it ends, for
	// the teardown and to notice an engine that stops alone.
	exited       map[int]chan struct{}
	stopping     atomic.Bool
	ctx          context.Context // done on Ctrl-C, a closed terminal, a kill
	exe          string
	orch         *exec.Cmd
	orchDone     chan struct{}
	info         readyInfo
	controlToken string // the control API's (its file: st.ControlTokenFile)
	record       string // --record, absolute; every orchestrator records there
	lock         *cluster.LocalLock
	deadline     time.Time
	client       *controlClient
}

// parseUp reads and checks evolve up's flags for a local cluster.
func parseUp(cmd *cobra.Command) (*localUp, error) {
	key := func(k string) string { return "up." + k }
	u := &localUp{cmd: cmd, errw: cmd.ErrOrStderr(), key: key, exited: map[int]chan struct{}{}}
	if config.GetBool(key("dry-run")) {
		return nil, fmt.Errorf("--dry-run checks a cluster file: pass it with -f")
	}
	u.engines, u.prefill = config.GetInt(key("engines")), config.GetInt(key("prefill"))
	if u.engines < 1 {
		return nil, fmt.Errorf("--engines must be at least 1")
	}
	if u.prefill == 0 && u.engines > 1 {
		u.prefill = max(1, u.engines/3)
	}
	if u.orchestrators = config.GetInt(key("orchestrators")); u.orchestrators < 1 || u.orchestrators > 5 {
		return nil, fmt.Errorf("--orchestrators must be 1 to 5")
	}
	if u.prefill < 0 || u.prefill > u.engines {
		return nil, fmt.Errorf("--prefill must be between 0 and --engines (%d)", u.engines)
	}
	if _, err := loadProfile(config.GetString(key("profile"))); err != nil {
		return nil, fmt.Errorf("--profile: %w", err)
	}
	if _, err := routing.New(config.GetString(key("policy"))); err != nil {
		return nil, fmt.Errorf("--policy: %w", err)
	}
	if err := checkPlannerFlags("up"); err != nil {
		return nil, err
	}
	if config.GetDuration(key("timeout")) <= 0 {
		return nil, fmt.Errorf("--timeout must be positive")
	}
	var err error
	if u.keys, err = apiKeys("up"); err != nil {
		return nil, err
	}
	if config.GetDuration(key("duration")) < 0 {
		return nil, fmt.Errorf("--duration must not be negative (0: until Ctrl-C)")
	}
	if config.GetFloat64(key("speedup")) <= 0 {
		return nil, fmt.Errorf("--speedup must be positive")
	}
	u.detach = config.GetBool(key("detach"))
	u.agents = config.GetInt(key("agents"))
	switch {
	case u.agents < 0:
		return nil, fmt.Errorf("--agents must not be negative")
	case u.agents > 0 && u.detach:
		return nil, fmt.Errorf("--agents runs in the foreground: drop --detach, or run 'evolve bench' against a detached cluster")
	case u.agents > 0:
		if u.model, err = workload.New(config.GetString(key("workload")), u.agents); err != nil {
			return nil, fmt.Errorf("--workload: %w", err)
		}
		// Agent contexts need a real model's context length; time runs
		// faster so that a demo shows minutes of agent work per minute.
		if !cmd.Flags().Changed("profile") && config.GetString(key("profile")) == "tiny" {
			config.Set(key("profile"), "gb300-kimi-k2")
		}
		if !cmd.Flags().Changed("speedup") && config.GetFloat64(key("speedup")) == 1 {
			config.Set(key("speedup"), 10.0)
		}
	}
	if u.record, err = recordDir(config.GetString(key("record"))); err != nil {
		return nil, err
	}
	// An address in use fails the orchestrator deep in its log: say which
	// flag to change before anything starts.
	for _, flag := range []string{"router-addr", "control-addr", "nats-addr"} {
		if _, _, err := net.SplitHostPort(config.GetString(key(flag))); err != nil {
			return nil, fmt.Errorf("--%s: %w (want HOST:PORT)", flag, err)
		}
	}
	return u, nil
}

// prepare takes the state directory's lock, refuses a second local
// cluster or taken addresses before it touches anything, then stops what
// a dead cluster left and makes the state directory and the tokens.
func (u *localUp) prepare() error {
	u.dir = localDir()
	if err := u.lockState(); err != nil {
		return err
	}
	last := cluster.FindLastLocal(u.dir)
	if err := u.checkLast(last); err != nil {
		return err
	}
	var err error
	if u.exe, err = os.Executable(); err != nil {
		return err
	}
	u.clearLast(last)
	u.logDir = filepath.Join(u.dir, "logs")
	if err := os.MkdirAll(u.logDir, 0o700); err != nil {
		return fmt.Errorf("state directory: %w", err)
	}
	u.st = &cluster.LocalState{LogDir: u.logDir, Started: time.Now(), Detached: u.detach}
	if len(u.keys) > 0 {
		u.st.APIKey = apikeys.EntryKey(u.keys[0])
	}
	if err := u.makeTokens(); err != nil {
		return err
	}
	u.deadline = time.Now().Add(config.GetDuration(u.key("timeout")))
	return nil
}

// waitFor waits for a child, once; the channel closes when it ends.
func (u *localUp) waitFor(p *exec.Cmd) chan struct{} {
	ch := make(chan struct{})
	u.exited[p.Process.Pid] = ch
	go func() { p.Wait(); close(ch) }()
	return ch
}

// cleanup stops every child started.
func (u *localUp) cleanup() {
	u.stopping.Store(true)
	cluster.StopAll(u.errw, u.dir, u.st, u.exited)
}

// interrupted stops what had started after Ctrl-C while what was going on.
func (u *localUp) interrupted(what string) error {
	fmt.Fprintln(u.errw)
	u.cleanup()
	return fmt.Errorf("interrupted %s; stopped what had started", what)
}

// startOrchestrator starts the orchestrators, first (engines need their
// NATS addresses), and waits for their ready files.
func (u *localUp) startOrchestrator() error {
	key := u.key
	// The key file's path, so that the orchestrator reads it again when
	// it changes; the flags' keys through its environment.
	keyFile, err := apiKeyFile("up")
	if err != nil {
		return usageError{cmd: u.cmd.CommandPath(), err: err}
	}
	orchEnv := apiKeyEnv(configList("up.api-key"))
	natsAddr := config.GetString(key("nats-addr"))
	routes, err := u.clusterAddrs(natsAddr)
	if err != nil {
		u.cleanup()
		return err
	}
	var exited []chan struct{}
	for i := range u.orchestrators {
		o := cluster.LocalOrchestrator{Name: "orchestrator", DataDir: filepath.Join(u.dir, "nats")}
		routerAddr, controlAddr, listen := config.GetString(key("router-addr")), config.GetString(key("control-addr")), natsAddr
		log := filepath.Join(u.logDir, "orchestrator.log")
		var extra []string
		if u.orchestrators > 1 {
			o.Name = fmt.Sprint("orchestrator-", i)
			log = filepath.Join(u.logDir, o.Name+".log")
			var peers []string
			for j, r := range routes {
				if j != i {
					peers = append(peers, r)
				}
			}
			extra = []string{"--name", o.Name, "--cluster-listen", routes[i], "--cluster-peers", strings.Join(peers, ",")}
			if i > 0 {
				// The first takes the addresses asked for; the others
				// free ports beside them.
				o.DataDir = filepath.Join(u.dir, fmt.Sprint("nats-", i))
				routerAddr, controlAddr, listen = withPort(routerAddr, 0), withPort(controlAddr, 0), withPort(natsAddr, 0)
			}
		}
		ready := filepath.Join(u.dir, o.Name+".ready")
		os.Remove(ready)
		args := append([]string{"orchestrator", "--router-addr", routerAddr, "--control-addr", controlAddr,
			"--nats-listen", listen, "--data-dir", o.DataDir,
			"--ready-file", ready, "--log-format", "json", "--log-level", config.GetString("log-level"),
			// The tokens' files, not the tokens, which ps would show.
			"--nats-token-file", u.st.NATSTokenFile, "--token-file", u.st.ControlTokenFile}, routingFlags()...)
		if keyFile != "" {
			args = append(args, "--api-key-file", keyFile)
		}
		if u.record != "" {
			// Each router's files are named for it: several record
			// into one directory without loss.
			args = append(args, "--record", u.record)
		}
		p, err := cluster.StartChild(u.exe, log, u.detach, orchEnv, append(args, extra...)...)
		if err != nil {
			u.cleanup()
			return err
		}
		exited = append(exited, u.waitFor(p))
		o.PID = p.Process.Pid
		u.st.Orchestrators = append(u.st.Orchestrators, o)
		if i == 0 {
			u.orch = p
			u.st.Orchestrator = o.PID
		}
		fmt.Fprintf(u.errw, "starting %s (log %s)\n", o.Name, log)
	}
	u.orchDone = allClosed(exited)
	for i := range u.st.Orchestrators {
		o := &u.st.Orchestrators[i]
		ready := filepath.Join(u.dir, o.Name+".ready")
		var info readyInfo
		for {
			if b, err := os.ReadFile(ready); err == nil && json.Unmarshal(b, &info) == nil {
				break
			}
			if !cluster.Alive(o.PID) || time.Now().After(u.deadline) {
				u.cleanup()
				return fmt.Errorf("%s did not start:\n%s", o.Name, tail(filepath.Join(u.logDir, o.Name+".log"), 10))
			}
			if !sleepCtx(u.ctx, 50*time.Millisecond) {
				return u.interrupted("while the orchestrators started")
			}
		}
		o.RouterURL, o.ControlURL, o.NATSURL = info.RouterURL, info.ControlURL, info.NATSURL
		if i == 0 {
			u.info = info
		}
	}
	if u.orchestrators == 1 {
		u.st.Orchestrators = nil // the fields of LocalState say it all
	}
	u.st.RouterURL, u.st.ControlURL, u.st.NATSURL = u.info.RouterURL, u.info.ControlURL, u.info.NATSURL
	return nil
}

// orchExited says that the orchestrator (every one, when several) exited.
func (u *localUp) orchExited() string {
	if u.orchestrators > 1 {
		return fmt.Sprintf("every orchestrator exited (the first: %s)", u.orch.ProcessState)
	}
	return fmt.Sprintf("the orchestrator exited (%s)", u.orch.ProcessState)
}

// orchLogTail is the end of the (first) orchestrator's log.
func (u *localUp) orchLogTail() string {
	name := "orchestrator"
	if u.orchestrators > 1 {
		name = "orchestrator-0"
	}
	return tail(filepath.Join(u.logDir, name+".log"), 10)
}

// clusterAddrs picks the orchestrators' cluster addresses (none for one),
// on the host of the event plane.
func (u *localUp) clusterAddrs(natsAddr string) ([]string, error) {
	if u.orchestrators < 2 {
		return nil, nil
	}
	host, _, _ := net.SplitHostPort(natsAddr)
	var addrs []string
	for range u.orchestrators {
		ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return nil, fmt.Errorf("a cluster port on %s: %w", host, err)
		}
		addrs = append(addrs, ln.Addr().String())
		defer ln.Close()
	}
	return addrs, nil
}

// withPort is HOST:PORT addr with another port.
func withPort(addr string, port int) string {
	host, _, _ := net.SplitHostPort(addr)
	return net.JoinHostPort(host, strconv.Itoa(port))
}

// allClosed closes once every channel of chs has closed.
func allClosed(chs []chan struct{}) chan struct{} {
	all := make(chan struct{})
	go func() {
		for _, ch := range chs {
			<-ch
		}
		close(all)
	}()
	return all
}

// engineNATSURL is the event plane's URL for engines: every
// orchestrator's NATS server (its token goes in --nats-token-file).
func (u *localUp) engineNATSURL() string {
	urls := []string{u.info.NATSURL}
	if len(u.st.Orchestrators) > 1 {
		urls = urls[:0]
		for _, o := range u.st.Orchestrators {
			urls = append(urls, o.NATSURL)
		}
	}
	return strings.Join(urls, ",")
}

// startEngines starts the engines, prefill ones first, and records the
// cluster.
func (u *localUp) startEngines() error {
	key := u.key
	for i := 0; i < u.engines; i++ {
		role := "decode"
		if i < u.prefill {
			role = "prefill"
		}
		id := fmt.Sprintf("engine-%d", i)
		log := filepath.Join(u.logDir, id+".log")
		p, err := cluster.StartChild(u.exe, log, u.detach, nil, "engine", "--listen", "127.0.0.1:0", "--id", id,
			"--nats", u.engineNATSURL(), "--nats-token-file", u.st.NATSTokenFile,
			"--role", role, "--profile", config.GetString(key("profile")),
			"--speedup", strconv.FormatFloat(config.GetFloat64(key("speedup")), 'g', -1, 64),
			"--shutdown-grace", "10s", "--log-format", "json", "--log-level", config.GetString("log-level"))
		if err != nil {
			u.cleanup()
			return err
		}
		u.st.Engines = append(u.st.Engines, p.Process.Pid)
		done := u.waitFor(p)
		go func() {
			<-done
			if !u.stopping.Load() && !u.detach {
				// The cluster serves on without it (the orchestrator
				// marks it down); say so where the operator looks.
				fmt.Fprintf(u.errw, "%s stopped on its own (%v); the cluster serves on without it. The end of %s:\n%s\n", id, p.ProcessState, log, tail(log, 5))
			}
		}()
	}
	if err := cluster.WriteLocalState(localDir(), u.st); err != nil {
		u.cleanup()
		return fmt.Errorf("record the local cluster: %w", err)
	}
	return nil
}

// waitServing waits until every engine serves, showing progress.
func (u *localUp) waitServing() error {
	fmt.Fprintf(u.errw, "starting %s (%d prefill, %d decode)", counted(u.engines, "engine"), u.prefill, u.engines-u.prefill)
	u.client = &controlClient{base: u.info.ControlURL, token: u.controlToken, http: shortClient}
	for {
		var nodes []controlapi.Node
		serving := 0
		if u.client.do(u.cmd.Context(), "GET", "/api/v1/nodes", nil, &nodes) == nil {
			for _, n := range nodes {
				if n.State == orchestrator.StateServing {
					serving++
				}
			}
		}
		if serving == u.engines {
			fmt.Fprintln(u.errw, " ready")
			return nil
		}
		if time.Now().After(u.deadline) {
			fmt.Fprintln(u.errw)
			u.cleanup()
			return fmt.Errorf("only %d of %d engines registered in time; logs in %s", serving, u.engines, u.logDir)
		}
		fmt.Fprint(u.errw, ".")
		if !sleepCtx(u.ctx, 200*time.Millisecond) {
			return u.interrupted("while the engines registered")
		}
	}
}

// print says where the cluster serves and what to try.
func (u *localUp) print() error {
	st, keys := u.st, u.keys
	aliases := configList(u.key("model-alias"))
	out := map[string]any{"router_url": st.RouterURL, "control_url": st.ControlURL, "nats_url": st.NATSURL,
		"engines": u.engines, "prefill": u.prefill, "log_dir": u.logDir, "detached": u.detach,
		"api_keys": len(keys), "model_aliases": aliases}
	if u.record != "" {
		out["record_dir"] = u.record
	}
	if len(st.Orchestrators) > 1 {
		out["orchestrators"] = st.Orchestrators
	}
	return output(u.cmd, out, func(w *tabwriter.Writer, _ bool) {
		fmt.Fprintf(w, "router\t%s\t(OpenAI and Anthropic APIs for agents)\n", st.RouterURL)
		if len(keys) > 0 {
			fmt.Fprintf(w, "\t\tneeds an API key (%s; send Authorization: Bearer KEY or x-api-key: KEY)\n", counted(len(keys), "key"))
		}
		if len(aliases) > 0 {
			fmt.Fprintf(w, "\t\tthe served model also answers to %s\n", strings.Join(aliases, ", "))
		}
		fmt.Fprintf(w, "control\t%s\n", st.ControlURL)
		for _, o := range st.Orchestrators[min(1, len(st.Orchestrators)):] {
			fmt.Fprintf(w, "%s\trouter %s, control %s\n", o.Name, o.RouterURL, o.ControlURL)
		}
		fmt.Fprintf(w, "logs\t%s\n", u.logDir)
		if u.record != "" {
			fmt.Fprintf(w, "record\t%s\t(evolve trace summary %s)\n", u.record, u.record)
		}
		fmt.Fprintln(w)
		fmt.Fprintln(w, "try:")
		// On lines of their own, so that 80 columns hold them whole.
		fmt.Fprintf(w, "  curl -s %s/v1/completions \\\n", st.RouterURL)
		if len(keys) > 0 {
			fmt.Fprintln(w, "    -H 'Authorization: Bearer KEY' \\")
		}
		fmt.Fprintln(w, "    -d '{\"prompt\": \"Hello\", \"max_tokens\": 8}'")
		fmt.Fprintln(w, "  evolve nodes")
		fmt.Fprintln(w, "  evolve role set engine-0 decode")
		if u.detach {
			fmt.Fprintln(w, "  evolve down")
		} else {
			fmt.Fprintln(w, "Ctrl-C stops the cluster.")
		}
	})
}

// runAgents runs --agents against the cluster, prints what they
// measured, and stops the cluster.
func (u *localUp) runAgents() error {
	key, errw := u.key, u.errw
	speedup := config.GetFloat64(key("speedup"))
	prog := newAgentProgress(errw, u.model, speedup, textWidth(errw))
	prog.total = config.GetDuration(key("duration"))
	prog.intro(u.agents, config.GetString(key("profile")))
	// The agents stop when the orchestrator does (killed, crashed):
	// with their router gone every call would fail until the run's end.
	bctx, stopAgents := context.WithCancel(u.ctx)
	go func() {
		select {
		case <-u.orchDone:
			stopAgents()
		case <-bctx.Done():
		}
	}()
	prog.start = time.Now()
	res, berr := loadgen.Bench(bctx, loadgen.BenchConfig{URL: localRouters(u.st), Model: u.model, Agents: u.agents, APIKey: u.st.APIKey, Unreachable: loadgen.DefaultUnreachable,
		Duration: config.GetDuration(key("duration")), Speedup: speedup, Seed: 1,
		Progress: func(s loadgen.Snapshot) { prog.line(s, split(u.liveClient())) }})
	stopAgents()
	// The agents may have failed on the dying router before up saw
	// the orchestrator exit: give it a moment to.
	var grace time.Duration
	if berr != nil {
		grace = 2 * time.Second
	}
	switch {
	case closedWithin(u.orchDone, grace):
		fmt.Fprintf(errw, "%s; the agents stopped. The end of its log:\n%s\n", u.orchExited(), u.orchLogTail())
		if berr == nil {
			u.printSummary(res)
		} else {
			fmt.Fprintln(errw, "agents:", berr)
		}
		berr = errors.New("the orchestrator exited while the agents ran")
	case berr != nil:
		fmt.Fprintln(errw, "agents:", berr)
	default:
		u.printSummary(res)
		// The planner's moves, from its own record, while it still runs.
		if flagOrConfig(u.cmd, "output") != "json" {
			prog.moves(u.cmd.OutOrStdout(), plannerDecisions(u.liveClient()))
		}
		berr = servedNothing(res)
	}
	// The signals stay caught through the teardown: a closed terminal
	// or a dead pipe must not kill up before it stops the cluster.
	fmt.Fprintln(errw, "stopping the cluster")
	u.cleanup()
	return berr
}

// printSummary prints what the agents measured, a table fitted to the
// terminal (80 columns off one): a line too long goes on under its value.
func (u *localUp) printSummary(res loadgen.Result) {
	out := u.cmd.OutOrStdout()
	if flagOrConfig(u.cmd, "output") == "json" {
		printBench(u.cmd, res)
		return
	}
	fw := &fitWriter{w: out, width: textWidth(out)}
	u.cmd.SetOut(fw)
	defer u.cmd.SetOut(out)
	printBench(u.cmd, res)
}

// fitWriter writes its lines to w wrapped at width, each continuation
// under the line's second column (a table's value).
type fitWriter struct {
	w     io.Writer
	width int
	buf   []byte
}

func (f *fitWriter) Write(p []byte) (int, error) {
	f.buf = append(f.buf, p...)
	for {
		i := strings.IndexByte(string(f.buf), '\n')
		if i < 0 {
			return len(p), nil
		}
		line := string(f.buf[:i])
		f.buf = f.buf[i+1:]
		if j := strings.Index(line, "  "); j > 0 && len([]rune(line)) > f.width {
			k := j + len(line[j:]) - len(strings.TrimLeft(line[j:], " "))
			if k < f.width/2 {
				value := wrapText(line[k:], "", f.width-k)
				line = line[:k] + strings.Join(value, "\n"+strings.Repeat(" ", k))
			}
		}
		if _, err := io.WriteString(f.w, line+"\n"); err != nil {
			return len(p), err
		}
	}
}

// agentProgress writes evolve up --agents' progress: a line every few
// seconds that fits the terminal (80 columns off one), with the
// workload's phase and the modelled time, and a line when the phase
// changes.
type agentProgress struct {
	w       io.Writer
	model   workload.Model
	speedup float64
	width   int
	total   time.Duration // the run's length (0: until Ctrl-C)
	start   time.Time
	phase   string
}

func newAgentProgress(w io.Writer, m workload.Model, speedup float64, width int) *agentProgress {
	if speedup <= 0 {
		speedup = 1
	}
	return &agentProgress{w: w, model: m, speedup: speedup, width: width}
}

// intro says what runs: the agents, the workload's schedule in modelled
// time and what it is in wall time, the profile and the speedup.
func (p *agentProgress) intro(agents int, profile string) {
	fmt.Fprintf(p.w, "running %s\n", counted(agents, p.model.Name()+" agent"))
	if sh, ok := p.model.(*workload.Shift); ok {
		fmt.Fprintln(p.w, strings.Join(wrapText(fmt.Sprintf("  %s for %s, then a change to %s over %s, then %s for %s (modelled time)",
			sh.From.Name(), shortDur(sh.Hold1), sh.To.Name(), shortDur(sh.Ramp), sh.To.Name(), shortDur(sh.Hold2)), "    ", p.width), "\n"))
	}
	speed := "in real time"
	if p.speedup != 1 {
		speed = fmt.Sprintf("at %gx: a wall minute is %s modelled; latencies are wall-clock", p.speedup, shortDur(time.Duration(float64(time.Minute)*p.speedup)))
	}
	fmt.Fprintln(p.w, strings.Join(wrapText("  engines "+profile+" "+speed, "    ", p.width), "\n"))
	fmt.Fprintln(p.w, strings.Join(wrapText("  every 5 s: wall time, modelled time and phase, the split, requests (and errors, if any) so far, and the last 5 s' TTFT and E2E, p50/p95", "    ", p.width), "\n"))
	fmt.Fprintln(p.w, "Ctrl-C stops the agents, prints their summary and stops the cluster")
}

// phaseAt is the workload's phase at modelled time t: a shift's first
// model, its change (with the share of the second), or its second.
func (p *agentProgress) phaseAt(t time.Duration) string {
	sh, ok := p.model.(*workload.Shift)
	if !ok {
		return p.model.Name()
	}
	switch f := sh.Fraction(t); {
	case f <= 0:
		return sh.From.Name()
	case f >= 1:
		return sh.To.Name()
	default:
		return fmt.Sprintf("→%s %.0f%%", sh.To.Name(), 100*f)
	}
}

// phaseName is a phase without its share, to tell when one begins.
func phaseName(phase string) string { return strings.Fields(phase + " ")[0] }

// line writes one line of progress (two where the width is short):
// the wall time (of the run's total), the modelled time and the phase,
// the split, requests so far and the last interval's latencies;
// splitText is " | split 1P/3D" or "".
func (p *agentProgress) line(s loadgen.Snapshot, splitText string) {
	modelled := time.Duration(float64(s.Elapsed) * p.speedup)
	phase := p.phaseAt(modelled)
	if name := phaseName(phase); name != p.phase {
		if sh, ok := p.model.(*workload.Shift); ok && p.phase != "" {
			// When the schedule changed phase, not when this line saw it.
			at, what := sh.Hold1+sh.Ramp, sh.To.Name()+" alone from here on"
			if rest, ok := strings.CutPrefix(name, "→"); ok {
				at, what = sh.Hold1, "the change to "+rest+" began"
			}
			fmt.Fprintf(p.w, "-- %s wall, %s modelled: %s\n", shortDur(time.Duration(float64(at)/p.speedup)), shortDur(at), what)
		}
		p.phase = name
	}
	at := "t=" + shortDur(s.Elapsed)
	if p.total > 0 {
		at += "/" + shortDur(p.total)
	}
	if p.speedup != 1 {
		phase = shortDur(modelled) + " modelled: " + phase
	}
	lat := func(name string, d workload.Dist) string {
		if d.N == 0 {
			return name + " -" // no answer finished: not a latency of 0
		}
		return name + " " + shortSec(d.P50) + "/" + shortSec(d.P95)
	}
	segs := []string{at, phase}
	if sp := strings.TrimPrefix(splitText, " | split "); sp != "" {
		segs = append(segs, sp)
	}
	reqs := fmt.Sprintf("%d req", s.Requests)
	if s.Errors > 0 {
		reqs += fmt.Sprintf(", %d err", s.Errors) // none: said by their absence, to keep a line in 80 columns
	}
	segs = append(segs, reqs, lat("TTFT", s.TTFT), lat("E2E", s.E2E))
	fmt.Fprintln(p.w, strings.Join(wrapSegs(segs, "  ", "    ", p.width), "\n"))
}

// wrapSegs joins segments with sep on lines of at most width, each after
// the first starting with indent.
func wrapSegs(segs []string, sep, indent string, width int) []string {
	var lines []string
	line := ""
	for _, seg := range segs {
		switch {
		case line == "":
			line = seg
		case len([]rune(line))+len(sep)+len([]rune(seg)) <= width:
			line += sep + seg
		default:
			lines = append(lines, line)
			line = indent + seg
		}
	}
	return append(lines, line)
}

// moves writes the planner's moves of the run, from its record, at their
// wall and modelled times.
func (p *agentProgress) moves(w io.Writer, ds []tui.Decision) {
	var lines []string
	n := 0
	for _, d := range ds {
		if len(d.Moves) == 0 || d.Time.Before(p.start) {
			continue
		}
		n += len(d.Moves)
		at := d.Time.Sub(p.start)
		var moved []string
		for _, mv := range d.Moves {
			moved = append(moved, mv.Node+" to "+mv.To)
		}
		lines = append(lines, wrapText(fmt.Sprintf("  %s wall (%s modelled): %s; %s", shortDur(at), shortDur(time.Duration(float64(at)*p.speedup)),
			strings.Join(moved, ", "), d.Reason), "      ", p.width)...)
	}
	if len(lines) == 0 {
		fmt.Fprintln(w, "planner     no moves: the split it started with fitted the traffic")
		return
	}
	fmt.Fprintf(w, "planner     %s:\n%s\n", counted(n, "move"), strings.Join(lines, "\n"))
}

// plannerDecisions are the planner's decisions, or none when it is off or
// out of reach.
func plannerDecisions(c *controlClient) []tui.Decision {
	var st struct {
		Decisions []tui.Decision `json:"decisions"`
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	c.do(ctx, "GET", "/api/v1/planner", nil, &st)
	return st.Decisions
}

// shortDur writes a duration as people read it: 45s, 6m05s, 1h02m.
func shortDur(d time.Duration) string {
	t := int(d.Round(time.Second).Seconds())
	switch h, m, s := t/3600, t/60%60, t%60; {
	case h > 0:
		return fmt.Sprintf("%dh%02dm", h, m)
	case m > 0:
		return fmt.Sprintf("%dm%02ds", m, s)
	default:
		return fmt.Sprintf("%ds", s)
	}
}

// shortSec writes seconds in at most five cells: 8ms, 0.21s, 2.4s, 49s.
func shortSec(s float64) string {
	switch {
	case s < 0.01:
		return fmt.Sprintf("%.0fms", s*1000)
	case s < 1:
		return fmt.Sprintf("%.2fs", s)
	case s < 10:
		return fmt.Sprintf("%.1fs", s)
	case s < 1000:
		return fmt.Sprintf("%.0fs", s)
	default:
		return shortDur(time.Duration(s * float64(time.Second)))
	}
}

// wrapText wraps text at its spaces onto lines of at most width, each
// after the first starting with indent.
func wrapText(text, indent string, width int) []string {
	var lines []string
	line := ""
	for _, w := range strings.Fields(text) {
		switch {
		case line == "":
			line = w
			if len(lines) > 0 {
				line = indent + w
			} else if strings.HasPrefix(text, " ") {
				line = text[:len(text)-len(strings.TrimLeft(text, " "))] + w
			}
		case len([]rune(line))+1+len([]rune(w)) <= width:
			line += " " + w
		default:
			lines = append(lines, line)
			line = indent + w
		}
	}
	return append(lines, line)
}

// closedWithin says whether ch is closed, or closes within d.
func closedWithin(ch <-chan struct{}, d time.Duration) bool {
	select {
	case <-ch:
		return true
	default:
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ch:
		return true
	case <-t.C:
		return false
	}
}

var shortClient = newHTTPClient(5 * time.Second)

// notifyInterrupt returns a context that ends at Ctrl-C, SIGTERM or a
// closed terminal (SIGHUP), so that a command stops what it started and
// says where it stood instead of dying midway. A broken pipe (| tee, and
// tee is gone) must not kill it midway either: with SIGPIPE notified,
// writes fail and the work goes on. stop undoes both.
func notifyInterrupt(parent context.Context) (ctx context.Context, stop func()) {
	ctx, cancel := signal.NotifyContext(parent, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	pipe := make(chan os.Signal, 1)
	signal.Notify(pipe, syscall.SIGPIPE)
	return ctx, func() { cancel(); signal.Stop(pipe) }
}

// sleepCtx waits d, or less if ctx ends first; it reports whether it
// waited the whole time.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// split describes the cluster's prefill/decode split for a progress line.
// liveClient is a client of the control API of the first of the
// cluster's orchestrators that runs (of several, one may have died).
func (u *localUp) liveClient() *controlClient {
	for _, o := range u.st.Orchestrators {
		if cluster.Alive(o.PID) {
			return &controlClient{base: o.ControlURL, token: u.controlToken, http: shortClient}
		}
	}
	return u.client
}

func split(c *controlClient) string {
	var nodes []controlapi.Node
	if c.do(context.Background(), "GET", "/api/v1/nodes", nil, &nodes) != nil {
		return ""
	}
	p, d := 0, 0
	for _, n := range nodes {
		if n.State != orchestrator.StateServing {
			continue
		}
		if n.Role == "prefill" {
			p++
		} else {
			d++
		}
	}
	return fmt.Sprintf(" | split %dP/%dD", p, d)
}

func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

func newDownCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "down",
		Short: "Stop the local cluster, or with -f the hosts of a cluster file",
		Long: `Stop the local cluster: the engines drain and stop, then the orchestrator.
With no local cluster it says so and succeeds. Processes of the cluster
that evolve up did not start (an orchestrator restarted by hand on its
data, an engine joined to its event plane) are not stopped: it names them,
keeps the data they use, and exits 1.

With -f cluster.yaml it stops the engines that 'evolve up -f' started on
the hosts over SSH and removes what it installed there, then stops the
orchestrator it started on this machine. It asks first on a terminal;
--yes answers for scripts.`,
		Example: `  evolve down
  evolve down -f cluster.yaml --yes`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if file := config.GetString("down.file"); file != "" {
				return downFromFile(cmd, file, config.GetBool("down.yes"))
			}
			st, err := cluster.ReadLocalState(localDir())
			if errors.Is(err, os.ErrNotExist) {
				if h := cluster.HolderOf(localDir()); h != nil {
					// An up that has not recorded its cluster yet.
					return fmt.Errorf("an evolve up (pid %d) is starting a local cluster and has not recorded it yet: run 'evolve down' once it is up, or stop it (Ctrl-C where it runs, or kill %d: it stops what it started)", h.PID, h.PID)
				}
				fmt.Fprintln(cmd.ErrOrStderr(), "no local cluster is running")
				return nil
			}
			var damaged *cluster.DamagedStateError
			if errors.As(err, &damaged) {
				return fmt.Errorf("%w: evolve down cannot tell what it started; stop the cluster's processes yourself (pgrep -af 'evolve (orchestrator|engine)'), then remove the file", err)
			}
			if err != nil {
				return err
			}
			errw := cmd.ErrOrStderr()
			orchs := "the orchestrator"
			if n := len(st.OrchestratorPIDs()); n > 1 {
				orchs = fmt.Sprintf("%d orchestrators", n)
			}
			fmt.Fprintf(errw, "stopping %d engines and %s\n", len(st.Engines), orchs)
			left := cluster.StopAll(errw, localDir(), st, nil)
			if len(left) == 0 {
				fmt.Fprintln(errw, "stopped")
				return nil
			}
			// Processes of this cluster that evolve up did not start (a
			// restart by hand): not stopped, and their data is kept.
			fmt.Fprintf(errw, "stopped what evolve up started; %d of the cluster's processes it did not start are still running (stop them yourself; their data in %s is kept):\n",
				len(left), filepath.Join(localDir(), "nats"))
			for _, p := range left {
				fmt.Fprintf(errw, "  pid %d: %s\n", p.PID, p.Command)
			}
			return exitCodeError{code: 1, err: fmt.Errorf("%d processes of the local cluster left running", len(left))}
		},
	}
	f := cmd.Flags()
	f.StringP("file", "f", "", "stop the hosts of this cluster file (see 'evolve up --help')")
	f.Bool("yes", false, "with -f: do not ask for confirmation")
	addSSHFlags(f)
	addOutputFlag(cmd, "with -f: table or json")
	return cmd
}
