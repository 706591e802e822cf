package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/evolvellm/evolve/cluster"
	"github.com/evolvellm/evolve/engine"
	"github.com/evolvellm/evolve/engine/stepmodel"
	"github.com/evolvellm/evolve/protocol"
	"github.com/evolvellm/evolve/protocol/natsconn"
	"github.com/evolvellm/evolve/roles"
	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"
)

func newEngineCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "engine [-- vllm serve MODEL [vLLM flags]]",
		Short: "Serve one model replica (a simulated GPU engine by default, or vLLM)",
		Long: `Run an engine agent: an OpenAI-compatible server for one model replica.

With --backend sim (the default) the engine is a simulated GPU: a step model
of vLLM's continuous batching with a paged KV cache on GPU and in host memory,
timed by a profile (see --profile). It runs against the wall clock, sped up by
--speedup: with --speedup 10 a modelled 40 ms pass takes 4 ms. Latencies it
reports (metrics, the "evolve" field of responses) are modelled times.

Without --nats the engine serves HTTP alone. With --nats it registers with the
orchestrator, publishes KV events and per-pass statistics, and takes control
requests (role, drain, offload, fetch, eviction hints).

Endpoints: POST /v1/completions, POST /v1/chat/completions (both with
"stream": true), GET /v1/models, GET /health, GET /metrics, and the KV
extensions under /evolve/v1/kv/.

The engine token: with --nats nats://TOKEN@HOST:PORT (as 'evolve up -f'
starts engines) the engine serves /v1/ and /evolve/v1/ only to requests
with Authorization: Bearer TOKEN, which the orchestrator's router and peer
engines send, so that the router's API keys cannot be bypassed on the
engine's port; /health and /metrics stay open. --token sets another
(the orchestrator's --engine-token must match), --token none serves
anyone. A vLLM server the agent starts gets the token as its API key
(VLLM_API_KEY); one it joins must have been started with it, or none.

Built-in profiles: ` + strings.Join(stepmodel.ProfileNames(), ", ") + `; or a path to a YAML file.

With --backend vllm the agent puts a vLLM server in the cluster. Either it
starts one (the command after --, to which it adds --host and --port from
--listen, a ZMQ --kv-events-config with replay and a NixlConnector
--kv-transfer-config with kv_role kv_both, unless given) and stops it on
exit, or it joins one already running (--vllm-url, with --kv-events and
--kv-replay where vLLM publishes). Routers send inference straight to vLLM
and tokenize prompts with its POST /tokenize; the agent registers it,
reports its load from its /metrics and turns its KV events into evolve's.
A role is a routing decision for vLLM (any instance prefills or decodes per
request), so switching needs no restart. vLLM keeps its own KV tiers:
evolve's fetches and eviction hints do not apply to it. The planner learns
its pass costs from vLLM's forward-pass metrics: the agent adds
--forward-pass-metrics-port (on a free port, or --pass-metrics-port) when
it finds that option in the release's vllm package, and follows the
stream (--pass-metrics for a joined server's).`,
		Example: `  # a small engine to try
  evolve engine --profile tiny --listen 127.0.0.1:8000
  curl -s 127.0.0.1:8000/v1/completions -d '{"prompt": "Hello", "max_tokens": 8}'

  # a GB300 tray running Kimi K2, 20x faster than real time, in a cluster
  evolve engine --profile gb300-kimi-k2 --speedup 20 --nats nats://10.0.0.1:4222 --id tray-07

  # a vLLM server the agent starts, in a cluster
  evolve engine --backend vllm --listen 0.0.0.0:8000 --advertise http://10.0.0.5:8000 \
    --nats nats://10.0.0.1:4222 --id gpu-05 -- vllm serve Qwen/Qwen3-8B --tensor-parallel-size 2

  # a vLLM server already running on this host
  evolve engine --backend vllm --vllm-url http://127.0.0.1:8000 --nats nats://10.0.0.1:4222`,
		Args: engineArgs,
		RunE: runEngine,
	}
	f := cmd.Flags()
	f.String("backend", "sim", "engine backend: sim or vllm")
	f.String("listen", "127.0.0.1:8000", "HTTP listen address (port 0 picks a free port); vllm: the started server's --host and --port")
	f.String("advertise", "", "base URL that routers and peers use to reach this engine (default: from --listen)")
	f.String("profile", "tiny", "simulated hardware and model: a built-in profile name or a YAML file")
	f.String("id", "", "engine id, letters, digits, '-' and '_' (default: <hostname>-<port>)")
	f.String("served-model-name", "", "model name clients ask for (default: the profile's model)")
	f.String("role", "both", "initial role: prefill, decode or both")
	f.Float64("speedup", 1, "modelled seconds per wall-clock second")
	f.String("nats", "", "NATS URL of the event plane: nats://[TOKEN@]HOST:PORT, or tls://... where it takes TLS only (a private CA is trusted with SSL_CERT_FILE); empty: HTTP only. ps shows a command line to every user: give a URL with a token as $EVOLVE_ENGINE_NATS, or the token in --nats-token-file")
	f.String("nats-token-file", "", "file holding the event plane's token (the orchestrator's --nats-token), presented with --nats and kept off the command line")
	f.String("nats-creds", "", "NATS user credentials file (a user JWT and its nkey seed, as 'nsc generate creds' writes) to present to --nats, where the orchestrators share a NATS deployment secured with accounts")
	f.String("token", "", "engine token that /v1/ and /evolve/v1/ require as Authorization: Bearer (default: the TOKEN of --nats nats://TOKEN@...; \"none\": serve anyone); prefer $EVOLVE_ENGINE_TOKEN to the command line, which ps shows")
	f.Int("max-num-seqs", 0, "most sequences in a batch (default: profile, else 256)")
	f.Int("max-num-batched-tokens", 0, "token budget of one forward pass (default: profile, else 8192)")
	f.Int("gpu-kv-tokens", 0, "GPU KV capacity in tokens (default: profile)")
	f.Int("host-kv-tokens", 0, "host-memory KV capacity in tokens (default: profile, else 4x GPU)")
	f.Duration("shutdown-grace", 30*time.Second, "on SIGINT/SIGTERM, how long requests in flight may take to finish (a second signal stops at once): the answers an evolve router streams are handed over to peer decode nodes at once, and those still unfinished when it ends go on elsewhere; vllm: how long the started server may take to stop")
	f.Int("default-max-tokens", 0, "output tokens when a request sets none (default: 16 for completions, 256 for chat)")
	f.Duration("exit-when-rejected", time.Minute, "exit with status 3 once the cluster has rejected this engine this long (another model or block size than the cluster serves, a bad registration), saying why; 0: keep waiting to be accepted")
	addVLLMFlags(f)
	return cmd
}

// engineArgs takes a command after "--" for --backend vllm only.
func engineArgs(cmd *cobra.Command, args []string) error {
	dash := cmd.ArgsLenAtDash()
	if len(args) > 0 && dash != 0 {
		return usageError{cmd: cmd.CommandPath(), err: fmt.Errorf("unexpected argument %q (a vLLM command goes after --)", args[0])}
	}
	return nil
}

var hostnameCleaner = regexp.MustCompile(`[^A-Za-z0-9_-]+`)

func runEngine(cmd *cobra.Command, args []string) error {
	get := func(k string) string { return config.GetString("engine." + k) }
	usage := func(err error) error { return usageError{cmd: cmd.CommandPath(), err: err} }

	if err := engineNATSSecret(cmd); err != nil {
		return usage(err)
	}
	if err := checkNATSCreds("engine"); err != nil {
		return usage(err)
	}
	if get("token") != "none" {
		warnOnCommandLine(cmd, "token", "$EVOLVE_ENGINE_TOKEN")
	}
	switch b := get("backend"); b {
	case "sim":
		if len(args) > 0 {
			return usage(errors.New("a command after -- is for --backend vllm"))
		}
		if err := flagsOfOtherBackend(cmd, vllmOnlyFlags, "vllm"); err != nil {
			return usage(err)
		}
	case "vllm":
		if err := flagsOfOtherBackend(cmd, simOnlyFlags, "sim"); err != nil {
			return usage(err)
		}
		return runVLLMEngine(cmd, args)
	default:
		return usage(fmt.Errorf("--backend %q: want sim or vllm", b))
	}
	profile, role, err := checkSimEngineFlags()
	if err != nil {
		return usage(err)
	}
	ln, err := net.Listen("tcp", get("listen"))
	if err != nil {
		return fmt.Errorf("listen on %s: %w", get("listen"), err)
	}
	defer ln.Close()
	eng, id, advertise, err := newSimEngine(ln, profile, role)
	if err != nil {
		return usage(err)
	}
	return serveEngine(ln, eng, id, advertise, profile.Name, role)
}

// checkSimEngineFlags checks a simulated engine's flags and returns its
// profile and role.
func checkSimEngineFlags() (*stepmodel.Profile, roles.Role, error) {
	profile, err := loadProfile(config.GetString("engine.profile"))
	if err != nil {
		return nil, 0, fmt.Errorf("--profile: %w", err)
	}
	role, err := roles.Parse(config.GetString("engine.role"))
	if err != nil {
		return nil, 0, fmt.Errorf("--role: %w", err)
	}
	if speedup := config.GetFloat64("engine.speedup"); speedup <= 0 {
		return nil, 0, fmt.Errorf("--speedup must be positive (got %g)", speedup)
	}
	for _, k := range []string{"max-num-seqs", "max-num-batched-tokens", "gpu-kv-tokens", "host-kv-tokens", "default-max-tokens"} {
		if config.GetInt("engine."+k) < 0 {
			return nil, 0, fmt.Errorf("--%s must not be negative", k)
		}
	}
	return profile, role, nil
}

// newSimEngine makes the simulated engine that serves on ln, with the id
// and URL it is known by.
func newSimEngine(ln net.Listener, profile *stepmodel.Profile, role roles.Role) (eng *engine.Simulated, id, advertise string, err error) {
	get := func(k string) string { return config.GetString("engine." + k) }
	geti := func(k string) int { return config.GetInt("engine." + k) }
	addr := ln.Addr().(*net.TCPAddr)
	advertise = get("advertise")
	if advertise == "" {
		host := addr.IP.String()
		if addr.IP.IsUnspecified() {
			host, _ = os.Hostname()
		}
		advertise = "http://" + net.JoinHostPort(host, fmt.Sprint(addr.Port))
	}
	id = get("id")
	if id == "" {
		h, _ := os.Hostname()
		id = strings.Trim(hostnameCleaner.ReplaceAllString(h, "-"), "-") + "-" + fmt.Sprint(addr.Port)
	}
	simCfg := stepmodel.Config{MaxNumSeqs: geti("max-num-seqs"), MaxNumBatchedTokens: geti("max-num-batched-tokens")}
	if n := geti("gpu-kv-tokens"); n > 0 {
		simCfg.GPUBlocks = max(1, n/profile.BlockSize)
	}
	if n := geti("host-kv-tokens"); n > 0 {
		simCfg.HostBlocks = max(1, n/profile.BlockSize)
	}
	eng, err = engine.NewSimulated(engine.Config{
		ID: id, Profile: profile, Sim: simCfg, ServedModelName: get("served-model-name"), Role: role,
		Speedup: config.GetFloat64("engine.speedup"), AdvertiseURL: advertise, DefaultMaxTokens: geti("default-max-tokens"), Logger: slog.Default(),
		Token: engineToken(),
	})
	return eng, id, advertise, err
}

// serveEngine serves a simulated engine on ln, joined to the event plane
// when --nats is given, until a signal.
func serveEngine(ln net.Listener, eng *engine.Simulated, id, advertise, profile string, role roles.Role) error {
	get := func(k string) string { return config.GetString("engine." + k) }
	// The first SIGINT or SIGTERM drains: no new requests; the answers a
	// router streams are handed over to peers (Leave), the rest finish (up
	// to --shutdown-grace). A second one kills at once.
	sigCtx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var agent *engine.NATSAgent
	if u := get("nats"); u != "" {
		nc, err := connectEngineNATS(u, id)
		if err != nil {
			return err
		}
		defer nc.Close()
		agent = engine.AttachNATS(eng, nc, buildVersion().Version)
		if err := agent.Start(ctx); err != nil {
			return err
		}
	}

	srv := &http.Server{Handler: eng.Handler(), ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() { eng.Run(ctx); close(done) }()
	agentDone := make(chan error, 1)
	if agent != nil {
		go func() { agentDone <- agent.Run(ctx) }()
	} else {
		close(agentDone)
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	slog.Info("engine ready", "id", id, "url", advertise, "model", eng.Model(), "profile", profile,
		"role", role.String(), "speedup", config.GetFloat64("engine.speedup"), "nats", cluster.RedactURLs(get("nats")), "requires_token", engineToken() != "")

	select {
	case err := <-rejectedExit(ctx, agent):
		cancel()
		<-done
		return err
	case <-sigCtx.Done():
		stop()
		grace := config.GetDuration("engine.shutdown-grace")
		slog.Info("engine draining before shutdown; answers its router streams are handed over to peers", "id", id, "grace", grace)
		graceCtx, cancelGrace := context.WithTimeout(context.Background(), grace)
		if left := eng.Leave(graceCtx); left > 0 {
			slog.Warn("shutdown grace over; aborting requests in flight", "id", id, "in_flight", left)
		}
		cancelGrace()
	case err := <-serveErr:
		if !errors.Is(err, http.ErrServerClosed) {
			cancel()
			<-done
			return fmt.Errorf("serve HTTP: %w", err)
		}
	}
	slog.Info("engine stopping", "id", id)
	cancel()
	shutCtx, cancelShut := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancelShut()
	_ = srv.Shutdown(shutCtx)
	<-done
	if err := <-agentDone; err != nil {
		return err
	}
	return nil
}

// rejectedExit fires, with the error the engine exits with (status 3),
// once the cluster has rejected the engine for --exit-when-rejected: an
// engine of a mistyped --served-model-name says so in its own log and
// exit status rather than waiting unseen. It never fires for 0, or
// without an event plane.
func rejectedExit(ctx context.Context, agent *engine.NATSAgent) <-chan error {
	out := make(chan error, 1)
	d := config.GetDuration("engine.exit-when-rejected")
	if agent == nil || d <= 0 {
		return out
	}
	go func() {
		t := time.NewTicker(min(d/4, time.Second))
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if why, since := agent.Rejected(); why != "" && time.Since(since) >= d {
				out <- exitCodeError{code: 3, err: fmt.Errorf("the cluster rejected this engine for %v: %s (fix it and start it again; --exit-when-rejected 0 waits)", d, why)}
				return
			}
		}
	}()
	return out
}

// connectEngineNATS connects an engine agent to the event plane, retrying
// for ever: an engine that starts before its orchestrator registers when
// it can.
func connectEngineNATS(url, id string) (*nats.Conn, error) {
	servers, opts := natsconn.Options(url, config.GetString("engine.nats-creds"))
	nc, err := nats.Connect(servers, append(opts, nats.Name("evolve-engine-"+id), nats.MaxReconnects(-1), nats.ReconnectWait(500*time.Millisecond),
		nats.RetryOnFailedConnect(true),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { slog.Warn("NATS", "err", err) }),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil { // nil: a clean close, no news
				slog.Warn("NATS disconnected", "err", err)
			}
		}),
		nats.ReconnectHandler(func(c *nats.Conn) { slog.Info("NATS reconnected", "url", c.ConnectedUrlRedacted()) }),
		nats.ClosedHandler(func(c *nats.Conn) {
			if err := c.LastError(); err != nil {
				slog.Error("NATS connection closed: the engine no longer reaches the event plane; restart it", "err", err)
			}
		}))...)
	if err != nil {
		return nil, fmt.Errorf("connect to NATS at %s: %w", servers, err)
	}
	return nc, nil
}

// Flags that mean something to one backend only.
var (
	simOnlyFlags  = []string{"profile", "speedup", "max-num-seqs", "max-num-batched-tokens", "gpu-kv-tokens", "host-kv-tokens", "default-max-tokens"}
	vllmOnlyFlags = []string{"vllm-url", "kv-events", "kv-replay", "kv-events-topic", "kv-events-bind", "kv-events-port", "kv-replay-port", "nixl-port",
		"gpus", "block-size", "prefill-us-per-token", "vllm-start-timeout", "vllm-priority-scheduling"}
)

// flagsOfOtherBackend refuses flags given on the command line that only
// the other backend reads, rather than ignoring them.
func flagsOfOtherBackend(cmd *cobra.Command, names []string, backend string) error {
	for _, n := range names {
		if cmd.Flags().Changed(n) {
			return fmt.Errorf("--%s is for --backend %s", n, backend)
		}
	}
	return nil
}

// engineToken is the token the engine requires of its routers and
// sends its peers: --token, else the event plane's ("" for none).
func engineToken() string {
	switch t := config.GetString("engine.token"); t {
	case "none":
		return ""
	case "":
		return protocol.EngineToken(config.GetString("engine.nats"))
	default:
		return t
	}
}
