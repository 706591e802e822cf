package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/evolvellm/evolve/cluster"
	"github.com/evolvellm/evolve/engine"
	"github.com/evolvellm/evolve/engine/vllm"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

func addVLLMFlags(f *pflag.FlagSet) {
	f.String("vllm-url", "", "vllm: join the vLLM server at this base URL (with or without /v1) instead of starting one")
	f.String("kv-events", "", "vllm: where the server publishes KV events (default: tcp://<vllm host>:5557, or from the command's --kv-events-config)")
	f.String("kv-replay", "", "vllm: the server's KV event replay endpoint (default: tcp://<vllm host>:5558; \"none\" for none)")
	f.String("kv-events-topic", "", "vllm: KV event topic prefix to follow (default: all)")
	f.Bool("kv-events-bind", false, "vllm: listen on the --kv-events endpoint (tcp://*:PORT or tcp://HOST:PORT) for a publisher that connects to the agent, as llm-d-inference-sim's does, where vLLM's binds and the agent connects")
	f.Int("kv-events-port", 5557, "vllm: port the started server publishes KV events on")
	f.Int("kv-replay-port", 5558, "vllm: port of the started server's replay service")
	f.Int("nixl-port", 5600, "vllm: NIXL side-channel port of the started server")
	f.Int("pass-metrics-port", 0, "vllm: have the started server publish its forward-pass metrics on this port (adds --forward-pass-metrics-port, which only recent vLLM releases have), so that the planner learns its pass costs; 0: on a free port when the agent finds the flag in the server's vLLM release; -1: never")
	f.String("pass-metrics", "", "vllm: where the server publishes forward-pass metrics, e.g. tcp://HOST:20380 (vLLM's --forward-pass-metrics-port, or Dynamo's InstrumentedScheduler), for the planner to learn its pass costs (default: from the started server's command; \"none\" for none)")
	f.Int("gpus", 0, "vllm: GPUs the server uses (reported to the orchestrator)")
	f.Int("block-size", 0, "vllm: KV block size, if the server's metrics do not say")
	f.Float64("prefill-us-per-token", vllm.DefaultPrefillUsPerToken, "vllm: the router's prefill cost per token until the server's metrics measure it")
	f.Duration("vllm-start-timeout", 30*time.Minute, "vllm: how long the server may take to load its model and answer")
	f.Bool("vllm-priority-scheduling", false, "vllm: the joined server (--vllm-url) runs --scheduling-policy priority, so the router sends an answer it continues there after its engine failed ahead of the queue; a started server's command says so itself")
}

// vllmAPIKey is the key a vLLM command gives with --api-key, if it does.
func vllmAPIKey(command []string) (string, bool) {
	for i, a := range command {
		if v, ok := strings.CutPrefix(a, "--api-key="); ok {
			return v, true
		}
		if a == "--api-key" && i+1 < len(command) {
			return command[i+1], true
		}
	}
	return "", false
}

// passMetricsPort is the port the started server of command is asked to
// publish its forward-pass metrics on (0: not asked; its command may ask
// itself): want, unless the release is found to lack the flag, which it
// would refuse and not start; by default (want 0) a free port, when the
// release is found to have it; -1: never.
func passMetricsPort(ctx context.Context, command, env []string, want int) (int, error) {
	const flag = "--forward-pass-metrics-port"
	if want < 0 || vllm.HasFlag(command, flag) {
		return 0, nil
	}
	knows, known := vllm.KnowsFlag(ctx, command, env, flag)
	switch {
	case want > 0 && known && !knows:
		slog.Warn("this vLLM release has no "+flag+", so it starts without it and the planner cannot learn its pass costs: upgrade vLLM, or run Dynamo's InstrumentedScheduler and give its endpoint with --pass-metrics",
			"pass_metrics_port", want)
		return 0, nil
	case want > 0:
		return want, nil
	case !knows:
		return 0, nil // the agent says at start what the planner then cannot do
	}
	l, err := net.Listen("tcp", ":0")
	if err != nil {
		return 0, fmt.Errorf("a port for vLLM's forward-pass metrics: %w", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	slog.Info("this vLLM release has "+flag+": the agent asks for its forward passes, for the planner", "pass_metrics_port", port)
	return port, nil
}

// runVLLMEngine is `evolve engine --backend vllm`: it starts a vLLM server
// (the command after --) or joins one (--vllm-url), and connects it to the
// event plane.
func runVLLMEngine(cmd *cobra.Command, command []string) error {
	v, err := parseVLLMEngine(cmd, command)
	var notUsage exitCodeError
	switch {
	case errors.As(err, &notUsage):
		return err
	case err != nil:
		return usageError{cmd: cmd.CommandPath(), err: err}
	}
	return v.run(cmd)
}

// vllmEngine is an evolve engine in front of a vLLM server: where the
// server listens and is reached, and where its KV events and pass
// metrics come from.
type vllmEngine struct {
	command                []string // the server's command (empty: joined at --vllm-url)
	id, role               string
	base, advertise        string // where the engine reaches the server, and where others do
	events, replay, topic  string // KV events (ZMQ)
	passes                 string // forward-pass metrics (ZMQ)
	listenHost, listenPort string
	launch                 vllm.Launch
	token                  string
}

// parseVLLMEngine reads and checks the flags of a vLLM engine.
func parseVLLMEngine(cmd *cobra.Command, command []string) (*vllmEngine, error) {
	get := func(k string) string { return config.GetString("engine." + k) }
	geti := func(k string) int { return config.GetInt("engine." + k) }
	if err := checkVLLMFlags(get("vllm-url"), command); err != nil {
		return nil, err
	}
	v := &vllmEngine{command: command, role: get("role")}
	if err := v.addresses(get("vllm-url")); err != nil {
		return nil, err
	}
	if a := get("advertise"); a != "" {
		v.advertise = strings.TrimRight(a, "/")
	}
	if _, _, dp, _ := vllm.ParallelSizes(command); dp > 1 {
		slog.Warn(fmt.Sprintf("vLLM runs %d data-parallel ranks: their KV events come on ports of their own, which this engine does not follow, so the router sees the caches of rank 0 only; run each rank as an engine of its own (a cluster file's engines: N)", dp))
	}
	advURL, _ := url.Parse(v.advertise)
	v.launch = vllm.Launch{Command: command, Host: v.listenHost, EventsPort: geti("kv-events-port"),
		ReplayPort: geti("kv-replay-port"), NixlPort: geti("nixl-port"), PassMetricsPort: geti("pass-metrics-port"),
		Stdout: os.Stderr, Stderr: os.Stderr}
	if advURL != nil {
		v.launch.AdvertiseHost = advURL.Hostname()
	}
	if v.listenPort != "" {
		v.launch.Port, _ = strconv.Atoi(v.listenPort)
	}
	v.token = engineToken()
	if err := v.launchEndpoints(cmd.Context()); err != nil {
		return nil, err
	}
	if err := v.endpointFlags(get); err != nil {
		return nil, err
	}
	v.id = get("id")
	if v.id == "" {
		h, _ := os.Hostname()
		port := v.listenPort
		if advURL != nil && advURL.Port() != "" {
			port = advURL.Port()
		}
		v.id = strings.Trim(hostnameCleaner.ReplaceAllString(h, "-"), "-") + "-" + port
	}
	return v, nil
}

// checkVLLMFlags checks the flags that need no address: a server to start
// or to join, ports, the role.
func checkVLLMFlags(attach string, command []string) error {
	geti := func(k string) int { return config.GetInt("engine." + k) }
	switch {
	case attach == "" && len(command) == 0:
		return errors.New("--backend vllm needs the server: a command after -- (vllm serve MODEL ...) or --vllm-url")
	case attach != "" && len(command) > 0:
		return errors.New("give either --vllm-url or a command after --, not both")
	case len(command) > 0 && config.GetBool("engine.vllm-priority-scheduling"):
		return errors.New("--vllm-priority-scheduling is for a joined server (--vllm-url): a started server's command says it with --scheduling-policy priority")
	}
	for _, k := range []string{"gpus", "block-size", "kv-events-port", "kv-replay-port", "nixl-port"} {
		if geti(k) < 0 {
			return fmt.Errorf("--%s must not be negative", k)
		}
	}
	if p := geti("pass-metrics-port"); p < -1 || p > 65535 {
		return fmt.Errorf("--pass-metrics-port %d: want a port number", p)
	}
	if attach != "" && geti("pass-metrics-port") > 0 {
		return errors.New("--pass-metrics-port is for a started server: a joined one (--vllm-url) publishes where its own command says; give that endpoint with --pass-metrics")
	}
	switch role := config.GetString("engine.role"); role {
	case "prefill", "decode", "both":
	default:
		return fmt.Errorf("--role %q: want prefill, decode or both", role)
	}
	return nil
}

// addresses sets where the server is reached: the joined server's URL,
// or --listen for one this engine starts.
func (v *vllmEngine) addresses(attach string) error {
	if attach != "" {
		u, err := url.Parse(attach)
		if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
			return fmt.Errorf("--vllm-url %q: want http://HOST:PORT", attach)
		}
		v.base = serverBase(attach)
		v.advertise = v.base
		v.events, v.replay = "tcp://"+net.JoinHostPort(u.Hostname(), "5557"), "tcp://"+net.JoinHostPort(u.Hostname(), "5558")
		return nil
	}
	listen := config.GetString("engine.listen")
	var err error
	v.listenHost, v.listenPort, err = net.SplitHostPort(listen)
	if err != nil {
		return fmt.Errorf("--listen %q: %w", listen, err)
	}
	if p, err := strconv.Atoi(v.listenPort); err != nil || p <= 0 {
		return fmt.Errorf("--listen %q: vLLM needs a fixed port", listen)
	}
	local := v.listenHost
	v.advertise = "http://" + net.JoinHostPort(v.listenHost, v.listenPort)
	if ip := net.ParseIP(local); local == "" || ip != nil && ip.IsUnspecified() {
		// Listening everywhere: the agent asks on loopback, and others
		// are told this host's name, as the simulated engine does.
		local = "127.0.0.1"
		h, _ := os.Hostname()
		v.advertise = "http://" + net.JoinHostPort(h, v.listenPort)
	}
	v.base = "http://" + net.JoinHostPort(local, v.listenPort)
	return nil
}

// launchEndpoints gives a server this engine starts the engine token as
// its API key, and reads where its command publishes KV events and pass
// metrics.
func (v *vllmEngine) launchEndpoints(ctx context.Context) error {
	command := v.command
	if len(command) == 0 {
		return nil
	}
	if v.token != "" {
		// The server takes the engine token as its API key, so that its
		// port serves only the cluster's routers.
		if key, ok := vllmAPIKey(command); ok && key != v.token {
			return errors.New("the vLLM command sets --api-key: the engine gives vLLM its engine token as the key; drop --api-key, or set the engine's --token (and the orchestrator's --engine-token) to that key")
		}
		if key, ok := os.LookupEnv("VLLM_API_KEY"); ok && key != v.token {
			return errors.New("VLLM_API_KEY is set to another key than the engine token, which the engine gives vLLM as its key: unset it, or set the engine's --token (and the orchestrator's --engine-token) to that key")
		}
		v.launch.Env = append(v.launch.Env, "VLLM_API_KEY="+v.token)
	}
	var err error
	if v.events, v.replay, v.topic, err = v.launch.Endpoints(); err != nil {
		return err
	}
	if v.launch.PassMetricsPort, err = passMetricsPort(ctx, command, v.launch.Env, v.launch.PassMetricsPort); err != nil {
		return exitCodeError{code: 1, err: err} // this machine's, not the flags'
	}
	v.passes, err = v.launch.PassMetricsEndpoint()
	return err
}

// endpointFlags applies the flags that name the ZMQ endpoints outright.
func (v *vllmEngine) endpointFlags(get func(string) string) error {
	switch p := get("pass-metrics"); {
	case p == "none":
		v.passes = ""
	case p != "":
		if !strings.HasPrefix(p, "tcp://") {
			return fmt.Errorf("--pass-metrics %q: want tcp://HOST:PORT", p)
		}
		v.passes = p
	}
	if e := get("kv-events"); e != "" {
		v.events = e
	}
	if r := get("kv-replay"); r != "" {
		v.replay = r
	}
	if v.replay == "none" {
		v.replay = ""
	}
	if t := get("kv-events-topic"); t != "" {
		v.topic = t
	}
	return nil
}

// run starts the server (when it has a command), waits for it, joins the
// event plane and serves until a signal or the server's end.
func (v *vllmEngine) run(cmd *cobra.Command) error {
	get := func(k string) string { return config.GetString("engine." + k) }
	sigCtx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithCancel(sigCtx)
	defer cancel()

	var agent *engine.NATSAgent
	maxSeqs, maxTokens := vllm.SchedulerLimits(v.command)
	rep, err := vllm.New(vllm.Config{ID: v.id, URL: v.advertise, LocalURL: v.base, Events: v.events, Replay: v.replay, Topic: v.topic, Role: v.role,
		EventsBind:  config.GetBool("engine.kv-events-bind"),
		PassMetrics: v.passes, MaxNumSeqs: maxSeqs, MaxNumBatchedTokens: maxTokens,
		ServedModelName: get("served-model-name"), BlockSize: config.GetInt("engine.block-size"), GPUs: config.GetInt("engine.gpus"),
		PrefillUsPerToken: config.GetFloat64("engine.prefill-us-per-token"), Logger: slog.Default(),
		Token:              v.token,
		PriorityScheduling: vllm.PriorityScheduling(v.command) || config.GetBool("engine.vllm-priority-scheduling"),
		Launched:           len(v.command) > 0,
		Changed: func() {
			if agent != nil {
				agent.Register()
			}
		}})
	if err != nil {
		return usageError{cmd: cmd.CommandPath(), err: err}
	}
	proc, err := v.start(ctx, rep, cancel)
	if proc != nil {
		defer func() {
			if err := proc.Stop(config.GetDuration("engine.shutdown-grace")); err != nil {
				slog.Warn("vLLM stop", "err", err)
			}
		}()
	}
	if err != nil {
		if sigCtx.Err() != nil {
			return nil
		}
		return err
	}
	if u := get("nats"); u != "" {
		nc, err := connectEngineNATS(u, v.id)
		if err != nil {
			return err
		}
		defer nc.Close()
		agent = engine.AttachNATS(rep, nc, buildVersion().Version)
		if err := agent.Start(ctx); err != nil {
			return err
		}
	}
	reg := rep.Registration(buildVersion().Version)
	slog.Info("engine ready", "id", v.id, "backend", "vllm", "url", v.advertise, "model", reg.Model, "block_size", reg.BlockSize,
		"gpu_blocks", reg.GPUBlocks, "role", reg.Role, "kv_events", v.events, "pass_metrics", v.passes, "nats", cluster.RedactURLs(get("nats")), "requires_token", reg.TokenRequired)

	agentDone := make(chan error, 1)
	agentCtx, cancelAgent := context.WithCancel(context.Background())
	defer cancelAgent()
	if agent != nil {
		go func() { agentDone <- agent.Run(agentCtx) }()
	} else {
		close(agentDone)
	}
	runErr := rep.Run(ctx)
	// Deregister before vLLM stops, so that routers stop sending to it.
	cancelAgent()
	if err := <-agentDone; err != nil && runErr == nil {
		runErr = err
	}
	if proc != nil {
		select {
		case <-proc.Done():
			if sigCtx.Err() == nil {
				return fmt.Errorf("vLLM exited: %v", proc.Err())
			}
		default:
		}
	}
	if runErr != nil {
		return runErr
	}
	slog.Info("engine stopping", "id", v.id)
	return nil
}

// start starts the server when the engine has its command (its end
// cancels ctx, through cancel), and waits until it answers or ctx ends. The process it returns,
// when not nil, is the caller's to stop, also with an error.
func (v *vllmEngine) start(ctx context.Context, rep *vllm.Replica, cancel context.CancelFunc) (*vllm.Process, error) {
	var proc *vllm.Process
	if len(v.command) > 0 {
		var err error
		if proc, err = vllm.Start(v.launch); err != nil {
			return nil, err
		}
		slog.Info("vLLM started", "pid", proc.Pid(), "command", strings.Join(v.launch.Args(), " "))
		go func() {
			<-proc.Done()
			cancel() // the server is gone: so is this engine
		}()
	}
	startCtx, cancelStart := context.WithTimeout(ctx, config.GetDuration("engine.vllm-start-timeout"))
	defer cancelStart()
	lastLog := time.Time{}
	err := rep.Probe(startCtx, func(err error) {
		if time.Since(lastLog) > 15*time.Second {
			slog.Info("waiting for vLLM", "url", v.advertise, "err", err)
			lastLog = time.Now()
		}
	})
	if err != nil && proc != nil {
		select {
		case <-proc.Done():
			return proc, fmt.Errorf("vLLM exited before it was ready, %s", proc.Exited())
		default:
		}
	}
	return proc, err
}
