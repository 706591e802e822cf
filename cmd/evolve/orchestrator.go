package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/evolvellm/evolve/orchestrator"
	"github.com/evolvellm/evolve/orchestrator/routing"
	"github.com/evolvellm/evolve/planner"
	"github.com/evolvellm/evolve/protocol"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// readyInfo is what a started orchestrator writes to --ready-file.
type readyInfo struct {
	RouterURL  string `json:"router_url"`
	ControlURL string `json:"control_url"`
	NATSURL    string `json:"nats_url"`
	PID        int    `json:"pid"`
}

// orchestratorLong is evolve orchestrator --help's text.
const orchestratorLong = `Run the orchestrator: the one process between agents and engines.

It serves the OpenAI API (/v1/completions, /v1/chat/completions) and
Anthropic's Messages API (/v1/messages, for agents such as Claude Code) to
agents on --router-addr and routes each request to a prefill and a decode
engine (--policy evolve, dynamo or round-robin), and the control API on
--control-addr (loopback by default; a bearer token is required elsewhere).
With --api-key-file (or --api-key, or $EVOLVE_ORCHESTRATOR_API_KEY) the
agents' API takes only requests that carry a key (Authorization: Bearer
KEY, or x-api-key: KEY); /health and /metrics stay open. An entry NAME KEY
names the key: evolve_router_key_requests_total and _key_tokens_total
count its requests and tokens under the name (unnamed: sha256:<8 hex
digits of its fingerprint>); NAME KEY max-concurrency=64 max-wait=30s
lets the name's keys have 64 answers in flight at once, a request beyond
waiting up to 30 s (the default) for one to end, then answered 429 with
Retry-After, so that one team's agents cannot starve another's
(evolve_router_key_in_flight and _waiting show how near each runs, and
'evolve status'). --model-alias
lets clients name the served model their own way (claude-*, gpt-4o).
With --tls-cert-file and --tls-key-file (PEM) the router, and the control
API unless it is on loopback, serve HTTPS, and the embedded NATS server
off loopback takes TLS connections only (engines join at tls://...), so
that keys and tokens cross the network encrypted; the certificate must
name the address clients use.
The files are read again when they change (a renewed certificate is served
from the next connection on, no restart). evolve's commands and curl
trust a private CA with SSL_CERT_FILE=ca.pem, Claude Code with
NODE_EXTRA_CA_CERTS=ca.pem.

Engines register over NATS: by default the orchestrator embeds a NATS server
with JetStream (data in --data-dir; role overrides survive restarts, and a
port picked with --nats-listen HOST:0 is kept there, so that engines find a
restarted orchestrator where they left it); --nats joins an existing one
instead. Off loopback the embedded server requires a token (--nats-token
or, off the command line that ps shows, $EVOLVE_ORCHESTRATOR_NATS_TOKEN or
--nats-token-file): anyone who reaches an open event plane could drain the
engines or join as one and receive users' prompts. Engines that joined with the event plane's
token (nats://TOKEN@...) take requests only with it, as a bearer token the
router sends them (--engine-token for another), so that the API keys
cannot be bypassed on the engines' ports.

Several orchestrators can share one event plane, so that agents keep
working when one dies: give each a --name, an address its peers reach
its NATS server's routes at (--cluster-listen) and the others' addresses
(--cluster-peers). Their embedded NATS servers form one cluster, JetStream
keeps roles, pins and the planner's lease in 3 copies, and an engine
registers once (with every orchestrator's NATS URL in --nats, or any one
of them: the others are learned). Every orchestrator routes agents'
requests; one, the leader, plans and switches nodes, and its leadership
term rides on every role command, so that engines refuse the late
commands of a leader that lost its lease. When the leader dies another
leads within about 5 s; an answer streaming through a dead router is lost
to its client (agents send it again), new requests through the others
succeed. 'evolve status' shows every orchestrator and the leader.

The online planner (--planner auto) learns pass costs from the engines'
live statistics and moves nodes in auto mode between prefill and decode when
a better split has held for --planner-persistence and its predicted gain
pays for the switch; --planner recommend only reports ('evolve planner').

When an engine fails, a request it had not begun to answer is routed again,
and an answer it was writing, streamed or whole, goes on on another node
from the tokens it had written (evolve's engines name them to the router).
That node pulls the prompt's KV from live peers rather than recompute it,
or, when much is left to recompute (the output of a long answer), has a
prefill node compute that KV and pulls it, so that its own streams do not
stall: the agent reads one answer, the one the dead engine would have
written. A vLLM engine's stream goes on on another vLLM engine, from the
token ids the router asks vLLM to stream (return_token_ids), or, for a
chat that offers tools, from the text so far as an assistant message vLLM
continues; where vLLM engines prefill for others, on a decode engine that
pulls the KV a prefill engine computes for it; one in which vLLM has parsed a tool call or reasoning, or whose
output a grammar constrains, ends with an error event. 'evolve nodes -o json'
keeps, per node, the answers it was writing when it failed
(answers_interrupted, answers_lost).

Most users start it through 'evolve up'.`

func newOrchestratorCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "orchestrator",
		Short: "Run the router, KV directory, role manager and control API",
		Long:  orchestratorLong,
		Example: `  evolve orchestrator --data-dir /var/lib/evolve --nats-listen 0.0.0.0:4222
  evolve engine --nats nats://ORCHESTRATOR:4222 --profile gb300-kimi-k2

  # three orchestrators (on hosts a, b and c; the token from $EVOLVE_ORCHESTRATOR_NATS_TOKEN)
  evolve orchestrator --name a --nats-listen 0.0.0.0:4222 --cluster-listen 0.0.0.0:6222 --cluster-peers b:6222,c:6222
  evolve engine --nats nats://a:4222,nats://b:4222,nats://c:4222 --profile gb300-kimi-k2`,
		Args: noArgs,
		RunE: runOrchestrator,
	}
	f := cmd.Flags()
	f.String("router-addr", "127.0.0.1:8000", "address of the agents' API, OpenAI's and Anthropic's (port 0 picks a free port)")
	f.String("control-addr", "127.0.0.1:8001", "control API address (port 0 picks a free port)")
	f.String("token", "", "bearer token the control API requires (required when --control-addr is not loopback); ps shows a command line to every user: prefer $EVOLVE_ORCHESTRATOR_TOKEN or --token-file")
	f.String("token-file", "", "file holding the control API's token (instead of --token)")
	f.String("nats", "", "URL of an existing NATS server (empty: embed one); a URL with a token belongs in $EVOLVE_ORCHESTRATOR_NATS, not on the command line")
	f.String("nats-listen", "127.0.0.1:4222", "address of the embedded NATS server (port 0 picks a free port, the same one again on a restart with the same --data-dir); off loopback it needs --nats-token")
	f.String("nats-token", "", "token every client of the embedded NATS server must present, required when --nats-listen is not loopback (engines: --nats-token-file, or $EVOLVE_ENGINE_NATS=nats://TOKEN@host:port); prefer $EVOLVE_ORCHESTRATOR_NATS_TOKEN or --nats-token-file to the command line, which ps shows")
	f.String("nats-token-file", "", "file holding the embedded NATS server's token (instead of --nats-token)")
	f.String("nats-creds", "", "NATS user credentials file (a user JWT and its nkey seed, as 'nsc generate creds' writes) to present to --nats's servers, for a NATS deployment secured with accounts")
	addOrchestratorClusterFlags(f)
	f.String("engine-token", "", "token the router sends engines, which they require when they have one (default: the event plane's, --nats-token or the TOKEN of --nats nats://TOKEN@..., as engines take by default; or env EVOLVE_ORCHESTRATOR_ENGINE_TOKEN)")
	f.String("data-dir", "", "JetStream data of the embedded NATS server (default $XDG_STATE_HOME/evolve/orchestrator)")
	f.String("policy", "evolve", "routing policy: "+strings.Join(routing.Names(), ", "))
	addWaitFlags(f)
	f.Duration("shutdown-grace", 30*time.Second, "on SIGINT/SIGTERM, how long the answers the router is writing may take to finish; no new connection is taken meanwhile, so a load balancer moves to another router (a second signal stops at once)")
	addConnectionFlags(f)
	f.Duration("body-timeout", 30*time.Second, "how long a request body may take to arrive, a second more for each 256 KiB that did (a client trickling its body is cut with 408)")
	f.Duration("write-idle-timeout", 60*time.Second, "longest a write to a client may block (a client that stopped reading its answer); a streamed answer that keeps moving is never cut")
	f.Duration("idle-timeout", 120*time.Second, "a keep-alive connection idle this long between requests is closed")
	f.Int("large-body-budget", 64, "MiB of large request bodies (over 1 MiB each) the router reads, parses and tokenizes at once; more wait their turn (each costs about 3x its size in memory)")
	f.String("ready-file", "", "write the URLs as JSON to this file once serving (for scripts and evolve up)")
	addRecordFlag(f)
	f.String("tls-cert-file", "", "PEM certificate (chain) to serve the router, and the control API off loopback, over HTTPS with; read again when it changes")
	f.String("tls-key-file", "", "PEM private key of --tls-cert-file")
	f.String("served-model", "", "the model the cluster serves: engines of another are rejected (default: the model most of its engines serve, following them as they come and go)")
	addModelAliasFlag(f)
	addAPIKeyFlags(f)
	addPlannerFlags(f)
	return cmd
}

// addRecordFlag adds --record.
func addRecordFlag(f *pflag.FlagSet) {
	f.String("record", "", "record every request the router serves in this directory: gzipped JSONL, a row each, with no prompt text (evolve trace summary DIR; evolve sim --trace DIR); a full or failing disk drops rows, never requests")
}

// recordDir checks --record's directory before anything starts, and
// makes it absolute: a child started elsewhere records in the same place.
func recordDir(dir string) (string, error) {
	if dir == "" {
		return "", nil
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("--record %s: %w", dir, err)
	}
	if fi, err := os.Stat(abs); err == nil && !fi.IsDir() {
		return "", fmt.Errorf("--record %s: a file, not a directory (the recording is a directory of files, one per router and rotation)", dir)
	}
	return abs, nil
}

// addConnectionFlags adds the flags of the connections the router holds.
func addConnectionFlags(f *pflag.FlagSet) {
	f.Int("max-connections", 4096, "most connections the router, and the control API, each hold at once; more wait to be accepted")
	f.Int("max-connections-per-client", 0, "most of those one client address holds (default: a quarter of --max-connections, at least 256; -1: no cap); its connections past that are closed at once, so that one client cannot take the router from the others")
}

// addWaitFlags adds the flags of how long the orchestrator waits on
// nodes and agents.
func addWaitFlags(f *pflag.FlagSet) {
	f.Int("missed-heartbeats", 3, "heartbeats (1 s apart) a node may miss before it is marked down")
	f.Duration("drain-timeout", 0, "longest wait for a switching node's requests (default 5m)")
	f.Duration("stream-idle-timeout", orchestrator.DefaultStreamIdle, "how long an answer that has begun may get no token from its engine before the router goes on with it on another engine, as for one that died (a hung engine; one whose heartbeats stop is left a second after it is marked down)")
	f.Duration("session-idle", orchestrator.BranchTTL, "how long an agent's branch may wait for its next request before it ends and its context is no longer kept for it (agents also end sessions with x-dynamo-session-final: true or DELETE /v1/sessions/ID)")
}

// addOrchestratorClusterFlags adds the flags of several orchestrators
// sharing one event plane.
func addOrchestratorClusterFlags(f *pflag.FlagSet) {
	f.String("name", "", "this orchestrator's name among several (default: the host's name and a random suffix, kept in --data-dir)")
	f.String("cluster-listen", "", "address the embedded NATS server takes routes from its peers' at (HOST:PORT), to share one event plane with other orchestrators; off loopback it needs --nats-token, which the servers present to each other")
	f.StringSlice("cluster-peers", nil, "the other orchestrators' --cluster-listen addresses (HOST:PORT, comma-separated or repeated)")
}

func stateDir() string {
	dir := os.Getenv("XDG_STATE_HOME")
	if dir == "" {
		home, _ := os.UserHomeDir()
		dir = filepath.Join(home, ".local", "state")
	}
	return filepath.Join(dir, "evolve")
}

func runOrchestrator(cmd *cobra.Command, _ []string) error {
	get := func(k string) string { return config.GetString("orchestrator." + k) }
	for _, secret := range [][2]string{{"token", "token-file"}, {"nats-token", "nats-token-file"}} {
		if err := secretFromFile(cmd, "orchestrator", secret[0], secret[1]); err != nil {
			return usageError{cmd: cmd.CommandPath(), err: err}
		}
	}
	if err := checkNATSCreds("orchestrator"); err != nil {
		return usageError{cmd: cmd.CommandPath(), err: err}
	}
	warnOnCommandLine(cmd, "api-key", "$EVOLVE_ORCHESTRATOR_API_KEY or --api-key-file")
	if f := get("tls-key-file"); f != "" {
		if err := checkPrivate("tls-key-file", f); err != nil {
			return usageError{cmd: cmd.CommandPath(), err: err}
		}
	}
	if cmd.Flags().Changed("nats") && protocol.EngineToken(get("nats")) != "" {
		slog.Warn("--nats with a token on the command line shows it in ps to every user of this machine; use $EVOLVE_ORCHESTRATOR_NATS")
	}
	dataDir := get("data-dir")
	if dataDir == "" && get("nats") == "" {
		dataDir = filepath.Join(stateDir(), "orchestrator")
	}
	if dataDir != "" {
		if err := os.MkdirAll(dataDir, 0o700); err != nil {
			return fmt.Errorf("data directory: %w", err)
		}
	}
	if err := checkPlannerFlags("orchestrator"); err != nil {
		return usageError{cmd: cmd.CommandPath(), err: err}
	}
	for _, f := range []string{"session-idle", "stream-idle-timeout"} {
		if d := config.GetDuration("orchestrator." + f); d <= 0 {
			return usageError{cmd: cmd.CommandPath(), err: fmt.Errorf("--%s %v: give a duration above 0, such as 10m", f, d)}
		}
	}
	// The file is read (and checked) here, then by the orchestrator again
	// whenever it changes.
	if _, err := apiKeys("orchestrator"); err != nil {
		return usageError{cmd: cmd.CommandPath(), err: err}
	}
	keyFile, err := apiKeyFile("orchestrator")
	if err != nil {
		return usageError{cmd: cmd.CommandPath(), err: err}
	}
	o, err := orchestrator.New(orchestrator.Config{
		RouterAddr: get("router-addr"), ControlAddr: get("control-addr"), ControlToken: get("token"),
		NATSURL: get("nats"), NATSListen: get("nats-listen"), NATSToken: get("nats-token"), NATSCreds: get("nats-creds"), EngineToken: get("engine-token"), DataDir: dataDir, Policy: get("policy"),
		Name: get("name"), ClusterListen: get("cluster-listen"), ClusterPeers: configList("orchestrator.cluster-peers"),
		MissedHeartbeats: config.GetInt("orchestrator.missed-heartbeats"), ShutdownGrace: config.GetDuration("orchestrator.shutdown-grace"),
		DrainTimeout: config.GetDuration("orchestrator.drain-timeout"), SessionIdle: config.GetDuration("orchestrator.session-idle"),
		StreamIdle: config.GetDuration("orchestrator.stream-idle-timeout"), Logger: slog.Default(),
		PlannerMode: get("planner"), ModelAliases: configList("orchestrator.model-alias"), ServedModel: get("served-model"),
		APIKeys: configList("orchestrator.api-key"), APIKeyFile: keyFile, TLSCertFile: get("tls-cert-file"), TLSKeyFile: get("tls-key-file"),
		MaxConnectionsPerClient: config.GetInt("orchestrator.max-connections-per-client"), RecordDir: get("record"),
		Limits: orchestrator.HTTPLimits{MaxConnections: config.GetInt("orchestrator.max-connections"),
			BodyTimeout: config.GetDuration("orchestrator.body-timeout"), WriteIdle: config.GetDuration("orchestrator.write-idle-timeout"),
			IdleTimeout: config.GetDuration("orchestrator.idle-timeout"), LargeBodyBudget: int64(config.GetInt("orchestrator.large-body-budget")) << 20},
		Planner: planner.Config{Interval: config.GetDuration("orchestrator.planner-interval"),
			Persistence:    config.GetDuration("orchestrator.planner-persistence"),
			TTFTWeight:     config.GetFloat64("orchestrator.planner-ttft-weight"),
			MinImprovement: config.GetFloat64("orchestrator.planner-min-improvement")},
	})
	if err != nil {
		return usageError{cmd: cmd.CommandPath(), err: err}
	}
	if config.GetDuration("orchestrator.shutdown-grace") < 0 {
		return usageError{cmd: cmd.CommandPath(), err: errors.New("--shutdown-grace must not be negative")}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		stop() // a second signal now stops the process at once
	}()
	readyFile := get("ready-file")
	err = o.Run(ctx, func() {
		slog.Info("orchestrator ready", "router_url", o.RouterURL(), "control_url", o.ControlURL(), "nats_url", o.NATSURL(), "policy", get("policy"))
		if readyFile != "" {
			b, _ := json.Marshal(readyInfo{RouterURL: o.RouterURL(), ControlURL: o.ControlURL(), NATSURL: o.NATSURL(), PID: os.Getpid()})
			tmp := readyFile + ".tmp"
			if err := os.WriteFile(tmp, b, 0o600); err == nil {
				os.Rename(tmp, readyFile)
			}
		}
	})
	if readyFile != "" {
		os.Remove(readyFile)
	}
	return err
}

// addModelAliasFlag adds --model-alias (evolve orchestrator and evolve up
// share it).
func addModelAliasFlag(f *pflag.FlagSet) {
	f.StringSlice("model-alias", nil, "another name clients may give the served model, or a pattern (claude-*; * takes any name): its requests are served as the served model's, whose name the engines get (repeat, or separate with commas; Claude Code asks for claude-* models)")
}

// addPlannerFlags adds the planner's flags (evolve orchestrator and evolve
// up share them).
func addPlannerFlags(f *pflag.FlagSet) {
	f.String("planner", "auto", "online planner: auto (moves auto nodes), recommend (reports only) or off")
	f.Duration("planner-interval", 0, "time between planner steps, in the engines' modelled time (default 5s)")
	f.Duration("planner-persistence", 0, "how long a better split must hold before the planner acts, in modelled time (default 1m)")
	f.Float64("planner-ttft-weight", 0, fmt.Sprintf("weight of TTFT against decode time in the planner's objective, TTFT x weight + output tokens x ITL (default %g: 1 would be the predicted mean end-to-end latency, but bursts make TTFT longer than the planner's queue model predicts)", float64(planner.DefaultTTFTWeight)))
	f.Float64("planner-min-improvement", 0, fmt.Sprintf("share by which a better split must lower the planner's objective before it counts, in [0, 1) (default %g: the persistence and the payback check stop moves that do not pay)", planner.DefaultMinImprovement))
}

func checkPlannerFlags(cmd string) error {
	switch mode := config.GetString(cmd + ".planner"); mode {
	case orchestrator.PlannerAuto, orchestrator.PlannerRecommend, orchestrator.PlannerOff:
	default:
		return fmt.Errorf("--planner %q: want auto, recommend or off", mode)
	}
	if config.GetFloat64(cmd+".planner-ttft-weight") < 0 {
		return fmt.Errorf("--planner-ttft-weight must not be negative")
	}
	if err := checkMinImprovement(config.GetFloat64(cmd + ".planner-min-improvement")); err != nil {
		return err
	}
	for _, f := range []string{"planner-interval", "planner-persistence"} {
		if config.GetDuration(cmd+"."+f) < 0 {
			return fmt.Errorf("--%s must not be negative (0: the default)", f)
		}
	}
	return nil
}

// checkMinImprovement checks --planner-min-improvement (0: the default).
func checkMinImprovement(v float64) error {
	if v < 0 || v >= 1 || math.IsNaN(v) {
		return fmt.Errorf("--planner-min-improvement %g: want a share in [0, 1), 0 for the default (%g)", v, planner.DefaultMinImprovement)
	}
	return nil
}
