package cluster

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path"
	"runtime"
	"strconv"
	"strings"
	"sync"
)

// Phases of bringing a host up, in order.
const (
	PhaseConnect = "connect"
	PhaseFacts   = "facts"
	PhaseUpload  = "upload"
	PhaseConfig  = "config"
	PhaseStart   = "start"
)

// Facts is what a host says about itself.
type Facts struct {
	OS       string `json:"os"`
	Arch     string `json:"arch"` // Go's name: amd64, arm64
	GPUs     int    `json:"gpus"` // per nvidia-smi; 0 without it
	FreeDisk int64  `json:"free_disk_bytes"`
	// Service is how evolve runs its processes there: "systemd" (a unit,
	// where systemd runs and evolve may write units) or "process" (a
	// supervised background process).
	Service string `json:"service"`
}

// HostResult is what happened on one host.
type HostResult struct {
	Host   string `json:"host"`
	Phase  string `json:"phase"`  // the last phase reached
	Action string `json:"action"` // started, restarted, unchanged, stopped, failed, or interrupted
	Upload string `json:"upload"` // uploaded, unchanged
	Facts  Facts  `json:"facts"`
	Error  string `json:"error,omitempty"`
	err    error
	status *HostStatus // Status's answer
}

// Err is the host's failure, or nil.
func (r HostResult) Err() error { return r.err }

// UpOptions configure a bring-up.
type UpOptions struct {
	Dial func(ctx context.Context, h Host) (Conn, error)
	// Binary is the evolve binary to install (the running one by default),
	// built for linux/BinaryArch (runtime.GOARCH by default). A binary for
	// another OS has BinaryArch "os/arch" (darwin/arm64): it fits no host.
	Binary     string
	BinaryArch string
	// Build, when set, returns an evolve binary for linux/arch, for hosts
	// whose architecture is not BinaryArch (a cross-compile); without it
	// such hosts fail with how to build one. It may be called for several
	// hosts at once.
	Build func(ctx context.Context, arch string) (string, error)
	// NATS is the orchestrator's event plane as the hosts reach it; "" uses
	// nats://<the address each host sees this machine at>:NATSPort (the
	// file's natsPort when 0), tls:// when NATSTLS.
	NATS     string
	NATSPort int
	NATSTLS  bool
	// NATSToken is the event plane's token; it goes into the engine's
	// environment in a script only the host's user can read.
	NATSToken string
	// APIKeys, if any, are the keys the orchestrator's agents' API
	// requires; they go into its environment as the tokens do.
	APIKeys []string
	// OrchestratorArgs are flags the orchestrator gets beyond the file's
	// (the operator's routing policy and planner settings).
	OrchestratorArgs []string
	// Resolve gives a host's address as the other machines reach it (its
	// ~/.ssh/config alias resolved); nil keeps the file's.
	Resolve func(Host) Host
	// Progress is told each host's phases as they start (may be nil).
	Progress func(host, phase, detail string)
	Log      io.Writer // debug log (may be nil)
	// Service is how hosts run evolve's processes: "auto" (or "") a
	// systemd unit where systemd runs and evolve may write units (as root
	// or with sudo -n), else a supervised process; "systemd" or "process"
	// insist. Systemd says where to look for systemd and its units (zero:
	// /run/systemd/system and /etc/systemd/system).
	Service string
	Systemd Systemd
}

// serviceManager picks how the host runs evolve's processes (nil: a
// supervised process), and notes it in facts.
func (o *UpOptions) serviceManager(ctx context.Context, c Conn, f *Facts) (*Systemd, error) {
	var sd *Systemd
	switch o.Service {
	case "", "auto":
		sd = detectSystemd(ctx, c, o.Systemd)
	case "systemd":
		if sd = detectSystemd(ctx, c, o.Systemd); sd == nil {
			return nil, fmt.Errorf("--service systemd: the host does not run systemd, or evolve may not write units there (neither root nor passwordless sudo)")
		}
	case "process":
	default:
		return nil, fmt.Errorf("service %q: want auto, systemd or process", o.Service)
	}
	f.Service = "process"
	if sd != nil {
		f.Service = "systemd"
	}
	return sd, nil
}

// StateDir is where a host keeps what evolve installs: the binary, the
// engine's config and service script, its pid and logs, the config hash.
func (h Host) StateDir() string {
	if h.Dir != "" {
		return h.Dir
	}
	return "$HOME/.local/state/evolve/engine"
}

// Up brings every host up, a limited number at once; a host that fails
// does not stop the others. Results come in the file's host order.
func Up(ctx context.Context, f *File, opt UpOptions) []HostResult {
	return forEachHost(ctx, f, func(ctx context.Context, h Host) HostResult { return upHost(ctx, f, h, opt) })
}

// Down stops and removes what Up installed on every host.
func Down(ctx context.Context, f *File, opt UpOptions) []HostResult {
	return forEachHost(ctx, f, func(ctx context.Context, h Host) HostResult { return downHost(ctx, h, opt) })
}

// forEachHost does do for every engine of the file (File.Engines), a
// limited number at once.
func forEachHost(ctx context.Context, f *File, do func(context.Context, Host) HostResult) []HostResult {
	engines := f.Engines()
	out := make([]HostResult, len(engines))
	sem := make(chan struct{}, max(1, f.Spec.Concurrency))
	var wg sync.WaitGroup
	for i, h := range engines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				out[i] = Interrupted(HostResult{Host: h.Name}, ctx.Err())
				return
			}
			defer func() { <-sem }()
			r := do(ctx, h)
			// After an interrupt, what failed failed because of it (a
			// command cut short reads as its phase's own error).
			if r.err != nil && ctx.Err() != nil {
				r = Interrupted(r, ctx.Err())
			}
			out[i] = r
		}()
	}
	wg.Wait()
	return out
}

func (o *UpOptions) resolve(h Host) Host {
	if o.Resolve != nil {
		return o.Resolve(h)
	}
	return h
}

func (o *UpOptions) progress(h, phase, detail string) {
	if o.Progress != nil {
		o.Progress(h, phase, detail)
	}
	if o.Log != nil {
		fmt.Fprintf(o.Log, "%s\t%s\t%s\n", h, phase, detail)
	}
}

// Failed marks a result failed in phase with err.
func Failed(r HostResult, phase string, err error) HostResult { return fail(r, phase, err) }

// Interrupted marks a result cut short by the caller (Ctrl-C) in the
// phase it had reached: the host is left part-way, and a re-run converges.
func Interrupted(r HostResult, cause error) HostResult {
	r.Action, r.err = "interrupted", cause
	if r.Phase == "" {
		r.Error = "interrupted before it started"
	} else {
		r.Error = "interrupted at " + r.Phase
	}
	return r
}

func fail(r HostResult, phase string, err error) HostResult {
	r.Phase, r.Action, r.err, r.Error = phase, "failed", err, err.Error()
	return r
}

// upHost runs the phases on one host.
func upHost(ctx context.Context, f *File, h Host, opt UpOptions) HostResult {
	r := HostResult{Host: h.Name}
	opt.progress(h.Name, PhaseConnect, fmt.Sprintf("%s@%s:%d", h.User, h.Address, h.Port))
	c, err := opt.Dial(ctx, h)
	if err != nil {
		return fail(r, PhaseConnect, err)
	}
	defer c.Close()
	dir := h.StateDir()

	opt.progress(h.Name, PhaseFacts, "")
	// The host's folder (made with sudo where the user may not) holds the
	// binary; an engine of several has its own folder in it.
	if r.Facts, err = facts(ctx, c, h.hostDir()); err != nil {
		return fail(r, PhaseFacts, err)
	}
	if dir != h.hostDir() {
		if _, err := c.Run(ctx, "mkdir -p "+dir); err != nil {
			return fail(r, PhaseFacts, fmt.Errorf("create %s: %w", dir, err))
		}
	}
	if err := opt.fits(r.Facts); err != nil {
		return fail(r, PhaseFacts, err)
	}
	switch gpus := cmp.Or(h.hostGPUs, h.GPUs); {
	case gpus > 0 && r.Facts.GPUs > 0 && r.Facts.GPUs < gpus:
		return fail(r, PhaseFacts, fmt.Errorf("the file says %d GPUs, nvidia-smi sees %d", gpus, r.Facts.GPUs))
	}
	// A host whose number of engines changed still runs the engines of
	// the old layout, which hold the ports: they go first.
	retired, err := retireOtherLayout(ctx, c, h)
	if err != nil {
		return fail(r, PhaseFacts, err)
	}
	for _, d := range retired {
		opt.progress(h.Name, PhaseFacts, "stopped the engine of the host's earlier layout in "+d)
	}
	if h.Engine.Backend == "vllm" {
		if err := checkVLLM(ctx, c, h); err != nil {
			return fail(r, PhaseFacts, err)
		}
	}
	// The engine's ports must be free, unless our engine holds them.
	if !isRunning(ctx, c, dir) {
		ports := []int{h.Engine.Port}
		if h.Engine.Backend == "vllm" {
			ports = append(ports, h.Engine.KVEventsPort, h.Engine.KVReplayPort, h.Engine.NIXLPort)
			if h.Engine.PassMetricsPort > 0 {
				ports = append(ports, h.Engine.PassMetricsPort)
			}
		}
		for _, p := range ports {
			out, _ := c.Run(ctx, fmt.Sprintf(`command -v ss >/dev/null 2>&1 && ss -ltnH "sport = :%d" | grep -q . && echo used; true`, p))
			if strings.TrimSpace(out) == "used" {
				if p == h.Engine.Port {
					return fail(r, PhaseFacts, fmt.Errorf("port %d is in use on the host: pick another engine.port", p))
				}
				return fail(r, PhaseFacts, fmt.Errorf("port %d, which vLLM's KV events, NIXL or forward-pass metrics use, is in use on the host: pick others (engine.kvEventsPort, kvReplayPort, nixlPort, passMetricsPort)", p))
			}
		}
	}

	sd, err := opt.serviceManager(ctx, c, &r.Facts)
	if err != nil {
		return fail(r, PhaseFacts, err)
	}

	opt.progress(h.Name, PhaseUpload, "")
	binSum, uploaded, err := installBinary(ctx, c, h, r.Facts.Arch, opt)
	if err != nil {
		return fail(r, PhaseUpload, err)
	}
	r.Upload = uploaded

	// The engine's service: a supervisor script that restarts it, its
	// environment, and a hash of both with the binary's.
	opt.progress(h.Name, PhaseConfig, "")
	nats := opt.NATS
	if nats == "" {
		addr := c.LocalAddr()
		if addr == "" {
			return fail(r, PhaseConfig, fmt.Errorf("cannot tell the address this host reaches the orchestrator at (a bastion hides it): set spec.orchestrator.advertise"))
		}
		port := opt.NATSPort
		if port == 0 {
			port = f.Spec.Orchestrator.NATSPort
		}
		scheme := "nats"
		if opt.NATSTLS {
			scheme = "tls"
		}
		nats = fmt.Sprintf("%s://%s:%d", scheme, addr, port)
	}
	svc := engineService(h, opt.resolve(h).Address, dir, nats, opt.NATSToken)
	action, phase, err := ensureService(ctx, c, sd, svc, binSum, func(phase string) { opt.progress(h.Name, phase, "") })
	if err != nil {
		return fail(r, phase, err)
	}
	r.Phase, r.Action = PhaseStart, action
	opt.progress(h.Name, PhaseStart, action)
	return r
}

func (o *UpOptions) binaryArch() string {
	if o.BinaryArch == "" {
		return runtime.GOARCH
	}
	return o.BinaryArch
}

// fits checks that evolve can run on a host with these facts: linux, and
// the binary's architecture or a way to build one.
func (o *UpOptions) fits(f Facts) error {
	want := o.binaryArch()
	switch {
	case f.OS != "linux":
		return fmt.Errorf("the host runs %s; evolve runs on linux", f.OS)
	case f.Arch != want && o.Build == nil:
		return fmt.Errorf("the host is linux/%s and the binary is %s: build one with GOOS=linux GOARCH=%s go build ./cmd/evolve and pass it with --binary", f.Arch, platform(want), f.Arch)
	}
	return nil
}

// platform names a binary's platform from UpOptions.BinaryArch.
func platform(arch string) string {
	if strings.Contains(arch, "/") {
		return arch
	}
	return "linux/" + arch
}

// hostDir is the state folder of h's host: h's own, unless h is one of
// several engines of its host, each in a subfolder.
func (h Host) hostDir() string {
	if h.host != "" {
		return path.Dir(h.StateDir())
	}
	return h.StateDir()
}

// binaryLocks serialise installBinary per host and folder: the engines of
// a host share one binary, and the first to get there uploads it.
var binaryLocks sync.Map

// installBinary puts evolve on the host as <host dir>/bin/evolve, unless
// it is there already (same checksum), cross-compiled when the host's
// architecture is not the binary's. It returns the binary's checksum and
// whether it was uploaded or unchanged.
func installBinary(ctx context.Context, c Conn, h Host, arch string, opt UpOptions) (string, string, error) {
	want := opt.binaryArch()
	path := opt.Binary
	if arch != want {
		opt.progress(h.Name, PhaseUpload, "cross-compiling evolve for linux/"+arch)
		var err error
		if path, err = opt.Build(ctx, arch); err != nil {
			return "", "", fmt.Errorf("the host is linux/%s and the binary %s; cross-compiling: %w", arch, platform(want), err)
		}
	}
	bin, err := os.ReadFile(path)
	if err != nil {
		return "", "", fmt.Errorf("read the binary: %w", err)
	}
	sum := sha256.Sum256(bin)
	binSum := hex.EncodeToString(sum[:])
	dir := h.hostDir()
	mu, _ := binaryLocks.LoadOrStore(fmt.Sprintf("%s:%d:%s", h.Address, h.Port, dir), &sync.Mutex{})
	mu.(*sync.Mutex).Lock()
	defer mu.(*sync.Mutex).Unlock()
	remote, _ := c.Run(ctx, fmt.Sprintf("sha256sum %s/bin/evolve 2>/dev/null | cut -d' ' -f1", dir))
	if strings.TrimSpace(remote) == binSum {
		return binSum, "unchanged", nil
	}
	home, err := c.Run(ctx, "printf %s "+dir)
	if err != nil {
		return "", "", err
	}
	if err := c.Upload(ctx, bytes.NewReader(bin), strings.TrimSpace(home)+"/bin/evolve", 0o755); err != nil {
		return "", "", err
	}
	return binSum, "uploaded", nil
}

// engineService is the engine's service. addr is the host's address as
// the orchestrator reaches it (its SSH config alias resolved).
func engineService(h Host, addr, dir, nats, token string) service {
	if scheme, rest, ok := strings.Cut(nats, "://"); ok && token != "" {
		nats = scheme + "://" + token + "@" + rest
	}
	args := []string{"engine", "--id", h.Name,
		"--listen", "0.0.0.0:" + strconv.Itoa(h.Engine.Port),
		"--advertise", fmt.Sprintf("http://%s:%d", addr, h.Engine.Port), "--log-format", "json"}
	if h.Role != "" {
		args = append(args, "--role", h.Role)
	}
	if h.Engine.Backend == "vllm" {
		// The agent starts vLLM (the command after --) and stops it with itself.
		args = append(args, "--backend", "vllm", "--gpus", strconv.Itoa(h.GPUs),
			"--kv-events-port", strconv.Itoa(h.Engine.KVEventsPort), "--kv-replay-port", strconv.Itoa(h.Engine.KVReplayPort),
			"--nixl-port", strconv.Itoa(h.Engine.NIXLPort))
		if h.Engine.PassMetricsPort > 0 {
			args = append(args, "--pass-metrics-port", strconv.Itoa(h.Engine.PassMetricsPort))
		}
		args = append(args, "--")
		args = append(append(args, vllmCommand(h)...), h.Engine.Args...)
	} else {
		args = append(append(args, "--profile", h.Engine.Profile), h.Engine.Args...)
	}
	env := map[string]string{}
	for k, v := range h.Engine.Env {
		env[k] = v
	}
	// The event plane's URL (with its token) in the environment, not on
	// the command line.
	env["EVOLVE_ENGINE_NATS"] = nats
	svc := service{name: "engine", what: "the engine of host " + h.Name, bin: h.hostDir() + "/bin/evolve", dir: dir, env: env, args: args}
	if h.host != "" {
		// One of several on the host: a unit of its own.
		svc.unitAs = "engine-" + h.Name
		svc.what = fmt.Sprintf("engine %d of host %s", h.index, h.host)
	}
	return svc
}

// retireOtherLayout stops, on h's host, the engines of the other layout,
// removes their files, and returns their folders: for one of several
// engines, a single engine in the host's state folder; for a single
// engine, the engines an earlier file gave the host, in the subfolders
// named for them (NAME-0, NAME-1, ...). A folder holds an engine when it
// has the engine's log or its unit's environment (an orchestrator's are
// named for it). Only evolve's own files go, and a subfolder only once
// empty: nothing else in a shared folder is touched. The host's folder
// keeps the binary, which the new layout's engines (and an orchestrator
// there) run too. Every engine of a host does it before it checks its
// ports, as the old engines may hold them; stopping one twice is
// harmless.
func retireOtherLayout(ctx context.Context, c Conn, h Host) ([]string, error) {
	dirs := h.hostDir()
	if h.host == "" {
		dirs = fmt.Sprintf("%s/%s-[0-9]*", h.StateDir(), h.Name)
	}
	script := fmt.Sprintf(`for d in %[1]s; do [ -f "$d"/engine.env ] || [ -f "$d"/engine.log ] || continue; %[2]s; `+
		`rm -f "$d"/run.sh "$d"/engine.env "$d"/config.hash "$d"/engine.log; [ "$d" = %[3]s ] || { rm -rf "$d"/bin; rmdir "$d" 2>/dev/null; }; echo "$d"; done`,
		dirs, stopCommand(`"$d"`), h.hostDir())
	out, err := c.Run(ctx, script)
	if err != nil {
		return nil, fmt.Errorf("stop the engines of the host's earlier layout: %w", err)
	}
	return strings.Fields(out), nil
}

// vllmCommand is the host's vLLM server command, before its arguments.
func vllmCommand(h Host) []string {
	if len(h.Engine.Command) > 0 {
		return h.Engine.Command
	}
	return []string{"vllm", "serve"}
}

// checkVLLM makes sure the host can run the vLLM command, with the PATH
// the engine's environment gives it.
func checkVLLM(ctx context.Context, c Conn, h Host) error {
	bin := vllmCommand(h)[0]
	check := "command -v " + shellQuote(bin)
	if p, ok := h.Engine.Env["PATH"]; ok {
		check = "PATH=" + shellQuote(p) + "; " + check
	}
	out, err := c.Run(ctx, "("+check+") || echo missing")
	if err != nil {
		return fmt.Errorf("look for %s: %w", bin, err)
	}
	if strings.TrimSpace(out) == "missing" || strings.TrimSpace(out) == "" {
		return fmt.Errorf("%s is not installed on the host (or not on the PATH of engine.env): install vLLM, or set engine.command", bin)
	}
	return nil
}

func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./:=,@") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// facts asks the host what it is, and makes sure the state folder exists
// and belongs to the user: a system folder (/var/lib/evolve) is created
// with sudo -n, never with a password.
func facts(ctx context.Context, c Conn, dir string) (Facts, error) {
	if _, err := c.Run(ctx, fmt.Sprintf("mkdir -p %[1]s 2>/dev/null && [ -w %[1]s ]", dir)); err != nil {
		if _, err := c.Run(ctx, "sudo -n true"); err != nil {
			return Facts{}, fmt.Errorf("cannot create %s as this user, and sudo -n true fails (no sudo, or it asks for a password; evolve never sends one): give the user passwordless sudo, or set spec.hosts[].dir to a folder it owns", dir)
		}
		if _, err := c.Run(ctx, fmt.Sprintf("sudo -n mkdir -p %[1]s && sudo -n chown \"$(id -u):$(id -g)\" %[1]s && sudo -n chmod 700 %[1]s", dir)); err != nil {
			return Facts{}, fmt.Errorf("create %s with sudo: %w", dir, err)
		}
	}
	out, err := c.Run(ctx, fmt.Sprintf(`uname -s; uname -m; (command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -c GPU) || echo 0; df -Pk %s | tail -1 | awk '{print $4}'`, dir))
	if err != nil {
		return Facts{}, err
	}
	l := strings.Fields(out)
	if len(l) < 4 {
		return Facts{}, fmt.Errorf("unexpected answer to the facts probe: %q", out)
	}
	f := Facts{OS: strings.ToLower(l[0])}
	switch l[1] {
	case "x86_64", "amd64":
		f.Arch = "amd64"
	case "aarch64", "arm64":
		f.Arch = "arm64"
	default:
		f.Arch = l[1]
	}
	f.GPUs, _ = strconv.Atoi(l[2])
	kb, _ := strconv.ParseInt(l[3], 10, 64)
	f.FreeDisk = kb * 1024
	return f, nil
}

// downHost stops the engine and removes what upHost installed.
func downHost(ctx context.Context, h Host, opt UpOptions) HostResult {
	r := HostResult{Host: h.Name}
	opt.progress(h.Name, PhaseConnect, "")
	c, err := opt.Dial(ctx, h)
	if err != nil {
		return fail(r, PhaseConnect, err)
	}
	defer c.Close()
	dir := h.StateDir()
	opt.progress(h.Name, PhaseStart, "stopping")
	// The folder itself goes when empty; a system one (made with sudo)
	// needs sudo to go.
	cmd := stopCommand(dir) + fmt.Sprintf(" && rm -rf %[1]s/bin %[1]s/run.sh %[1]s/engine.env %[1]s/config.hash %[1]s/engine.log && { rmdir %[1]s 2>/dev/null || sudo -n rmdir %[1]s 2>/dev/null; }; true", dir)
	if h.host != "" {
		// One of several: the binary they share goes, and the host's
		// folder once the last is gone (an orchestrator's down removes
		// them the same way).
		cmd += fmt.Sprintf(" ; [ -f %[1]s/engine.env ] || rm -rf %[1]s/bin; { rmdir %[1]s 2>/dev/null || sudo -n rmdir %[1]s 2>/dev/null; }; true", h.hostDir())
	}
	if _, err := c.Run(ctx, cmd); err != nil {
		return fail(r, PhaseStart, err)
	}
	r.Phase, r.Action = PhaseStart, "stopped"
	opt.progress(h.Name, PhaseStart, "stopped")
	return r
}

// HostStatus is what a host says of the engine evolve installed there.
type HostStatus struct {
	Host       string `json:"host"`
	Installed  bool   `json:"installed"`
	Running    bool   `json:"running"`
	ConfigHash string `json:"config_hash,omitempty"`
	// Service is "systemd UNIT-FILE" for a unit, "process" for a
	// supervised process, empty when nothing is installed.
	Service string `json:"service,omitempty"`
	Version string `json:"version,omitempty"`
	Error   string `json:"error,omitempty"`
}

// Status reads, on every host, what Up left there: whether the engine's
// supervisor runs, its config hash and the installed binary's version.
func Status(ctx context.Context, f *File, opt UpOptions) []HostStatus {
	res := forEachHost(ctx, f, func(ctx context.Context, h Host) HostResult {
		r := HostResult{Host: h.Name}
		c, err := opt.Dial(ctx, h)
		if err != nil {
			return fail(r, PhaseConnect, err)
		}
		defer c.Close()
		dir := h.StateDir()
		st := HostStatus{Host: h.Name, Running: isRunning(ctx, c, dir)}
		if out, err := c.Run(ctx, fmt.Sprintf("cat %s/config.hash 2>/dev/null", dir)); err == nil {
			st.ConfigHash = strings.TrimSpace(out)
		}
		// The binary is the host's; one of several engines is installed
		// once its own config is there too.
		if out, err := c.Run(ctx, fmt.Sprintf("%s/bin/evolve version 2>/dev/null", h.hostDir())); err == nil && (h.host == "" || st.ConfigHash != "") {
			st.Installed, st.Version = true, strings.TrimSpace(out)
			st.Service = "process"
		}
		if out, err := c.Run(ctx, fmt.Sprintf("cat %s/service.unit 2>/dev/null", dir)); err == nil && strings.TrimSpace(out) != "" {
			st.Service = "systemd " + strings.TrimSpace(out)
		}
		r.status = &st
		return r
	})
	out := make([]HostStatus, len(res))
	for i, r := range res {
		if r.status != nil {
			out[i] = *r.status
		} else {
			out[i] = HostStatus{Host: r.Host, Error: r.Error}
		}
	}
	return out
}
