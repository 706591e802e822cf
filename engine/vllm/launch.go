package vllm

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Launch describes a vLLM server that the agent starts and supervises:
// the command line the operator gave, with the flags evolve needs added
// where the operator set none.
type Launch struct {
	Command []string // e.g. vllm serve Qwen/Qwen3-8B --tensor-parallel-size 2
	Env     []string // extra KEY=VALUE for the server
	// Host and Port are vLLM's HTTP listen address (--host, --port).
	Host string
	Port int
	// EventsPort and ReplayPort are where vLLM binds its KV event
	// publisher and replay service; NixlPort is NIXL's side channel.
	EventsPort, ReplayPort, NixlPort int
	// PassMetricsPort, when positive, is where vLLM publishes its
	// forward-pass metrics (--forward-pass-metrics-port, added unless the
	// command sets it): only releases that have the flag start with it.
	PassMetricsPort int
	// AdvertiseHost is the address peers reach this host at, for NIXL's
	// side channel.
	AdvertiseHost  string
	Stdout, Stderr io.Writer
}

// hasFlag says whether args set --name (as "--name v" or "--name=v").
func hasFlag(args []string, name string) bool {
	for _, a := range args {
		if a == name || strings.HasPrefix(a, name+"=") {
			return true
		}
	}
	return false
}

// HasFlag says whether a vLLM command line sets --name.
func HasFlag(command []string, name string) bool { return hasFlag(command, name) }

// flagValue returns the value args give --name.
func flagValue(args []string, name string) (string, bool) {
	for i, a := range args {
		if a == name && i+1 < len(args) {
			return args[i+1], true
		}
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v, true
		}
	}
	return "", false
}

// ParallelSizes reads the vLLM command line's tensor, pipeline and data
// parallel sizes (each 1 unless given, by its long flag or its short
// one), and names the flag that gave a size that is not a positive
// number, if any.
func ParallelSizes(command []string) (tp, pp, dp int, bad string) {
	sizes := [3]int{1, 1, 1}
	for i, f := range [3][2]string{{"--tensor-parallel-size", "-tp"}, {"--pipeline-parallel-size", "-pp"}, {"--data-parallel-size", "-dp"}} {
		for _, name := range f {
			if v, ok := flagValue(command, name); ok {
				k, err := strconv.Atoi(v)
				if err != nil || k < 1 {
					return 0, 0, 0, name + " " + v
				}
				sizes[i] = k
				break
			}
		}
	}
	return sizes[0], sizes[1], sizes[2], ""
}

// SchedulerLimits reads the vLLM command line's --max-num-seqs and
// --max-num-batched-tokens; each is 0 when not given as a positive number
// (vLLM's defaults depend on the GPU).
func SchedulerLimits(command []string) (seqs, tokens int) {
	read := func(name string) int {
		v, _ := flagValue(command, name)
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return 0
		}
		return n
	}
	return read("--max-num-seqs"), read("--max-num-batched-tokens")
}

// PriorityScheduling says whether the vLLM command line orders the
// server's queue by request priority (--scheduling-policy priority).
func PriorityScheduling(command []string) bool {
	v, ok := flagValue(command, "--scheduling-policy")
	return ok && v == "priority"
}

// Args returns the command line to run: the operator's, plus --host,
// --port, --kv-events-config (ZMQ publisher with replay),
// --kv-transfer-config (NixlConnector, kv_both: any instance prefills or
// decodes per request) and, with PassMetricsPort,
// --forward-pass-metrics-port where the operator did not set them.
func (l Launch) Args() []string {
	args := slices.Clone(l.Command)
	if !hasFlag(args, "--host") && l.Host != "" {
		args = append(args, "--host", l.Host)
	}
	if !hasFlag(args, "--port") && l.Port > 0 {
		args = append(args, "--port", strconv.Itoa(l.Port))
	}
	if !hasFlag(args, "--kv-events-config") {
		cfg, _ := json.Marshal(map[string]any{"enable_kv_cache_events": true, "publisher": "zmq",
			"endpoint": fmt.Sprintf("tcp://*:%d", l.EventsPort), "replay_endpoint": fmt.Sprintf("tcp://*:%d", l.ReplayPort),
			"topic": "kv"})
		args = append(args, "--kv-events-config", string(cfg))
	}
	if !hasFlag(args, "--kv-transfer-config") {
		args = append(args, "--kv-transfer-config", `{"kv_connector":"NixlConnector","kv_role":"kv_both"}`)
	}
	if !hasFlag(args, "--forward-pass-metrics-port") && l.PassMetricsPort > 0 {
		args = append(args, "--forward-pass-metrics-port", strconv.Itoa(l.PassMetricsPort))
	}
	return args
}

// PassMetricsEndpoint returns where the server of args publishes its
// forward-pass metrics, as a subscriber on this host dials them: "" when
// its command line asks for none (--forward-pass-metrics-port absent or
// 0), or an error for a port that is not one.
func (l Launch) PassMetricsEndpoint() (string, error) {
	v, ok := flagValue(l.Args(), "--forward-pass-metrics-port")
	if !ok {
		return "", nil
	}
	port, err := strconv.Atoi(v)
	if err != nil || port < 0 || port > 65535 {
		return "", fmt.Errorf("--forward-pass-metrics-port %q: want a port number", v)
	}
	if port == 0 {
		return "", nil
	}
	return "tcp://127.0.0.1:" + v, nil
}

// Endpoints returns where the server of args publishes KV events, as a
// subscriber on this host dials them: from the operator's own
// --kv-events-config if given, else evolve's.
func (l Launch) Endpoints() (events, replay, topic string, err error) {
	args := l.Args()
	v, _ := flagValue(args, "--kv-events-config")
	var cfg struct {
		Enable   bool   `json:"enable_kv_cache_events"`
		Endpoint string `json:"endpoint"`
		Replay   string `json:"replay_endpoint"`
		Topic    string `json:"topic"`
	}
	if err := json.Unmarshal([]byte(v), &cfg); err != nil {
		return "", "", "", fmt.Errorf("--kv-events-config: %w", err)
	}
	if !cfg.Enable {
		return "", "", "", errors.New(`--kv-events-config: evolve needs "enable_kv_cache_events": true`)
	}
	if cfg.Endpoint == "" {
		cfg.Endpoint = "tcp://*:5557" // vLLM's default
	}
	return dialable(cfg.Endpoint), dialable(cfg.Replay), cfg.Topic, nil
}

// dialable turns a bind endpoint (tcp://*:5557) into one to dial here.
func dialable(ep string) string {
	if ep == "" {
		return ""
	}
	rest, ok := strings.CutPrefix(ep, "tcp://")
	if !ok {
		return ep
	}
	host, port, err := net.SplitHostPort(rest)
	if err != nil {
		return ep
	}
	if host == "*" || host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	return "tcp://" + net.JoinHostPort(host, port)
}

// Process is a running vLLM server.
type Process struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error
	tail *outputTail
}

// Start runs the server. It keeps running when Start returns; stop it
// with Stop.
func Start(l Launch) (*Process, error) {
	args := l.Args()
	if len(args) == 0 {
		return nil, errors.New("no vLLM command given")
	}
	path, err := exec.LookPath(args[0])
	if err != nil {
		return nil, fmt.Errorf("start vLLM: %w", err)
	}
	cmd := exec.Command(path, args[1:]...)
	cmd.Env = os.Environ()
	if l.NixlPort > 0 && !envSet(l.Env, "VLLM_NIXL_SIDE_CHANNEL_PORT") {
		cmd.Env = append(cmd.Env, "VLLM_NIXL_SIDE_CHANNEL_PORT="+strconv.Itoa(l.NixlPort))
	}
	if l.AdvertiseHost != "" && !envSet(l.Env, "VLLM_NIXL_SIDE_CHANNEL_HOST") {
		cmd.Env = append(cmd.Env, "VLLM_NIXL_SIDE_CHANNEL_HOST="+l.AdvertiseHost)
	}
	cmd.Env = append(cmd.Env, l.Env...)
	tail := &outputTail{}
	cmd.Stdout, cmd.Stderr = tail.tee(l.Stdout), tail.tee(l.Stderr)
	ownGroup(cmd)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start vLLM: %w", err)
	}
	p := &Process{cmd: cmd, done: make(chan struct{}), tail: tail}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

func envSet(env []string, key string) bool {
	if _, ok := os.LookupEnv(key); ok {
		return true
	}
	for _, kv := range env {
		if strings.HasPrefix(kv, key+"=") {
			return true
		}
	}
	return false
}

// Pid is the server's process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Done is closed when the server has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Err is how the server exited; call after Done.
func (p *Process) Err() error { return p.err }

// Exited says how the server exited and the last lines it printed, for
// an operator: a server that exits 0 on a bad flag says why only there.
func (p *Process) Exited() string {
	how := "with status 0"
	if p.err != nil {
		how = p.err.Error()
	}
	if out := p.tail.String(); out != "" {
		return how + "; its last output:\n" + out
	}
	return how + ", printing nothing"
}

// outputTail keeps the last tailBytes of a process's output.
type outputTail struct {
	mu  sync.Mutex
	buf []byte
}

const tailBytes = 2048

func (t *outputTail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > 2*tailBytes {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-tailBytes:]...)
	}
	return len(p), nil
}

// tee is w, with what is written kept in t too.
func (t *outputTail) tee(w io.Writer) io.Writer {
	if w == nil {
		return t
	}
	return io.MultiWriter(w, t)
}

// String is the tail from its first whole line.
func (t *outputTail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	b := t.buf
	if len(b) > tailBytes {
		b = b[len(b)-tailBytes:]
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	return strings.TrimRight(string(b), "\n")
}

// Stop asks the server and its workers to stop (SIGTERM to its process
// group) and kills them after grace.
func (p *Process) Stop(grace time.Duration) error {
	select {
	case <-p.done:
		return nil
	default:
	}
	terminate(p.cmd)
	select {
	case <-p.done:
		return nil
	case <-time.After(grace):
	}
	kill(p.cmd)
	<-p.done
	return fmt.Errorf("vLLM did not stop within %s; killed", grace)
}
