package cluster

import (
	"bytes"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// HostPlan is what bringing the cluster up does on one host, step by step.
type HostPlan struct {
	Host  string   `json:"host"`
	SSH   string   `json:"ssh"` // user@address:port, and the jump host
	Steps []string `json:"steps"`
}

// Plan lists what `evolve up -f` does, per host, for --dry-run.
func (f *File) Plan() []HostPlan {
	var out []HostPlan
	o := f.Spec.Orchestrator
	for _, h := range f.Engines() {
		ssh := fmt.Sprintf("%s:%d", h.Address, h.Port)
		if h.User != "" {
			ssh = h.User + "@" + ssh
		}
		if h.Bastion != nil {
			ssh += fmt.Sprintf(" via %s@%s:%d", or(h.Bastion.User, h.User), h.Bastion.Address, h.Bastion.Port)
		}
		role := h.Role
		if role == "" {
			role = "the planner's choice"
		}
		engine := h.Engine.Backend
		switch {
		case engine == "vllm":
			engine += ": " + strings.Join(append(slices.Clone(vllmCommand(h)), h.Engine.Args...), " ")
			if p := h.Engine.PassMetricsPort; p > 0 {
				engine += fmt.Sprintf(" --forward-pass-metrics-port %d", p)
			}
		case len(h.Engine.Args) > 0:
			engine += ", profile " + h.Engine.Profile + ", args " + strings.Join(h.Engine.Args, " ")
		default:
			engine += ", profile " + h.Engine.Profile
		}
		if h.host != "" {
			engine += fmt.Sprintf(", engine %d of %s", h.index, h.host)
			if devs := h.Engine.Env[cudaDevices]; devs != "" {
				engine += " on GPUs " + devs
			}
		}
		if len(h.Engine.Env) > 0 {
			keys := make([]string, 0, len(h.Engine.Env))
			for k := range h.Engine.Env {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			engine += ", env " + strings.Join(keys, ",")
		}
		gpus, layout := "GPUs (nvidia-smi)", ""
		if h.host != "" {
			layout = "; engines of another layout of the host stop"
			if h.hostGPUs > 0 {
				gpus = fmt.Sprintf("GPUs (nvidia-smi: %d on the host)", h.hostGPUs)
			}
		}
		steps := []string{
			"connect over SSH, checking the host key against ~/.ssh/known_hosts",
			fmt.Sprintf("facts: state folder %s (made with sudo -n if the user cannot), OS, architecture, %s, free disk, free port %d%s", h.StateDir(), gpus, h.Engine.Port, layout),
			"upload the evolve binary for the host's architecture, cross-compiled when it is not this one's (skipped when its checksum matches)",
			fmt.Sprintf("write the engine's config (%s; role %s) and its service: a systemd unit where systemd runs and evolve may write units (root or sudo -n), else a supervised process", engine, role),
			fmt.Sprintf("start the engine on port %d, or restart it if its config changed", h.Engine.Port),
		}
		if slices.Contains(o.OnHosts(), h.HostName()) && h.index == 0 {
			p := f.OrchestratorPorts(h.HostName())
			step := fmt.Sprintf("start the orchestrator (router :%d, control :%d, NATS :%d)", p.RouterPort, p.ControlPort, p.NATSPort)
			if n := len(o.OnHosts()); n > 1 {
				step = fmt.Sprintf("start orchestrator %s, one of %d (router :%d, control :%d, NATS :%d, NATS routes to the others :%d); it serves once a majority of them have met",
					h.HostName(), n, p.RouterPort, p.ControlPort, p.NATSPort, p.ClusterPort)
			}
			steps = append(steps, step)
		}
		out = append(out, HostPlan{Host: h.Name, SSH: ssh, Steps: steps})
	}
	if o.Local() {
		out = append(out, HostPlan{Host: "local", SSH: "this machine", Steps: []string{
			fmt.Sprintf("start the orchestrator (router :%d, control :%d, NATS :%d reachable by the hosts)", o.RouterPort, o.ControlPort, o.NATSPort),
		}})
	}
	return out
}

// PlanGroup is what bringing the cluster up does on hosts that are alike
// (the same SSH user, port, bastion and key, the same engines, role and
// ports): their steps once, for --dry-run, and what was checked on this
// machine that would stop the bring-up on them.
type PlanGroup struct {
	Hosts   []string `json:"hosts"`
	SSH     []string `json:"ssh"` // user@address:port of each, and the jump host
	Engines int      `json:"engines_per_host"`
	Steps   []string `json:"steps"`
	// Checks say, each in a line with its fix, what the bring-up would
	// stop at: a host key not yet known, no SSH key at all.
	Checks []string `json:"checks,omitempty"`
}

// PlanGroups is the plan of `evolve up -f` grouped: hosts that are alike
// share their steps, a host's engines are listed in its steps, and each
// group says what Preflight found for its hosts; the orchestrator on this
// machine comes last.
func (f *File) PlanGroups(opt SSHOptions) []PlanGroup {
	o := f.Spec.Orchestrator
	var groups []PlanGroup
	bySig := map[string]int{}
	for _, h := range f.Spec.Hosts {
		sig := hostSignature(h)
		if slices.Contains(o.OnHosts(), h.Name) {
			sig = "orchestrator " + h.Name // its own steps
		}
		i, ok := bySig[sig]
		if !ok {
			i = len(groups)
			bySig[sig] = i
			groups = append(groups, PlanGroup{Engines: max(h.Engines, 1), Steps: f.hostSteps(h, opt)})
		}
		g := &groups[i]
		g.Hosts = append(g.Hosts, h.Name)
		g.SSH = append(g.SSH, sshText(h))
		g.Checks = append(g.Checks, Preflight(h, opt)...)
	}
	for i := range groups {
		groups[i].Checks = joinUnknownKeys(groups[i].Checks)
	}
	if o.Local() {
		groups = append(groups, PlanGroup{Hosts: []string{"local"}, SSH: []string{"this machine"}, Steps: []string{
			fmt.Sprintf("start the orchestrator (router :%d, control :%d, NATS :%d reachable by the hosts)", o.RouterPort, o.ControlPort, o.NATSPort),
		}})
	}
	return groups
}

// hostSignature is what makes hosts alike for the plan: all but their
// name and address.
func hostSignature(h Host) string {
	h.Name, h.Address = "", ""
	b := h.Bastion
	h.Bastion = nil
	return fmt.Sprintf("%+v %+v", h, b)
}

// sshText is how the plan names a host's SSH: user@address:port, and the
// jump host.
func sshText(h Host) string {
	ssh := fmt.Sprintf("%s:%d", h.Address, h.Port)
	if h.User != "" {
		ssh = h.User + "@" + ssh
	}
	if h.Bastion != nil {
		ssh += fmt.Sprintf(" via %s@%s:%d", or(h.Bastion.User, h.User), h.Bastion.Address, h.Bastion.Port)
	}
	return ssh
}

// hostSteps are the steps of a host and its engines.
func (f *File) hostSteps(h Host, opt SSHOptions) []string {
	var engines []Host
	for _, e := range f.Engines() {
		if e.HostName() == h.Name {
			engines = append(engines, e)
		}
	}
	kh := or(opt.KnownHosts, "~/.ssh/known_hosts")
	key := "the ssh-agent's keys"
	if h.KeyPath != "" {
		key = "key " + h.KeyPath
	}
	role := or(h.Role, "the planner's choice")
	ports := fmt.Sprint(h.Engine.Port)
	if len(engines) > 1 {
		ports = portRange(h.Engine.Port, len(engines))
	}
	gpus := "GPUs (nvidia-smi)"
	if h.GPUs > 0 {
		gpus = fmt.Sprintf("GPUs (nvidia-smi: %d on the host)", h.GPUs)
	}
	steps := []string{
		fmt.Sprintf("connect over SSH with %s, checking the host key against %s", key, kh),
		fmt.Sprintf("facts: state folder %s (made with sudo -n if the user cannot), OS, architecture, %s, free disk, free port %s", h.StateDir(), gpus, ports),
		"upload the evolve binary for the host's architecture, cross-compiled when it is not this one's (skipped when its checksum matches)",
	}
	service := "a systemd unit where systemd runs and evolve may write units (root or sudo -n), else a supervised process"
	if len(engines) == 1 {
		steps = append(steps, fmt.Sprintf("write the engine's config (%s; role %s) and its service: %s", engineText(engines[0]), role, service),
			fmt.Sprintf("start the engine on port %d, or restart it if its config changed", engines[0].Engine.Port))
	} else {
		step := fmt.Sprintf("write each engine's config (%s; role %s) and its service (%s); engines of another layout of the host stop:", engineText(h), role, service)
		for _, e := range engines {
			line := fmt.Sprintf("engine %d: port %d", e.index, e.Engine.Port)
			if devs := e.Engine.Env[cudaDevices]; devs != "" {
				line += ", GPUs " + devs
			}
			step += "\n" + line
		}
		steps = append(steps, step, "start each engine on its port, or restart it if its config changed")
	}
	if o := f.Spec.Orchestrator; slices.Contains(o.OnHosts(), h.Name) {
		p := f.OrchestratorPorts(h.Name)
		step := fmt.Sprintf("start the orchestrator (router :%d, control :%d, NATS :%d)", p.RouterPort, p.ControlPort, p.NATSPort)
		if n := len(o.OnHosts()); n > 1 {
			step = fmt.Sprintf("start orchestrator %s, one of %d (router :%d, control :%d, NATS :%d, NATS routes to the others :%d); it serves once a majority of them have met",
				h.Name, n, p.RouterPort, p.ControlPort, p.NATSPort, p.ClusterPort)
		}
		steps = append(steps, step)
	}
	return steps
}

// engineText is what an engine runs: its backend with the vLLM command or
// the sim profile, and the names of its environment.
func engineText(h Host) string {
	text := h.Engine.Backend
	switch {
	case text == "vllm":
		text += ": " + strings.Join(append(slices.Clone(vllmCommand(h)), h.Engine.Args...), " ")
		if p := h.Engine.PassMetricsPort; p > 0 {
			text += fmt.Sprintf(" --forward-pass-metrics-port %d", p)
		}
	case len(h.Engine.Args) > 0:
		text += ", profile " + h.Engine.Profile + ", args " + strings.Join(h.Engine.Args, " ")
	default:
		text += ", profile " + h.Engine.Profile
	}
	var keys []string
	for k := range h.Engine.Env {
		if k != cudaDevices || h.Engines <= 1 {
			keys = append(keys, k)
		}
	}
	if len(keys) > 0 {
		sort.Strings(keys)
		text += ", env " + strings.Join(keys, ",")
	}
	return text
}

// Preflight is what can be checked on this machine of reaching host h
// before the bring-up does: that it has an SSH key to offer (the file's,
// ~/.ssh/config's, or an ssh-agent), that the key file ~/.ssh/config
// names exists, and that known_hosts knows the host's key (and its jump
// host's). Each finding is a line with what to do.
func Preflight(h Host, opt SSHOptions) []string {
	r, err := resolve(h, opt.SSHConfig)
	if err != nil {
		return []string{fmt.Sprintf("%s: the SSH config: %v", h.Name, err)}
	}
	var out []string
	switch {
	case r.KeyPath == "" && os.Getenv("SSH_AUTH_SOCK") == "":
		out = append(out, fmt.Sprintf("%s: no SSH key to log in with: set keyPath, or run an ssh-agent (SSH_AUTH_SOCK is not set)", h.Name))
	case r.KeyPath != "":
		from := "keyPath"
		if h.KeyPath == "" {
			from = "~/.ssh/config's IdentityFile"
		}
		if why := keyFileProblem(r.KeyPath); why != "" {
			out = append(out, fmt.Sprintf("%s: %s %s", h.Name, from, why))
		}
	}
	if b := r.Bastion; b != nil && b.KeyPath != "" {
		if why := keyFileProblem(b.KeyPath); why != "" {
			out = append(out, fmt.Sprintf("%s: bastion.keyPath %s", h.Name, why))
		}
	}
	kh := opt.KnownHosts
	if kh == "" {
		home, _ := os.UserHomeDir()
		kh = filepath.Join(home, ".ssh", "known_hosts")
	}
	check, err := knownhosts.New(kh)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return append(out, fmt.Sprintf("%s: known hosts %s: %v", h.Name, kh, err))
	}
	hosts := [][2]string{{r.Address, strconv.Itoa(r.Port)}}
	if b := r.Bastion; b != nil {
		hosts = append(hosts, [2]string{b.Address, strconv.Itoa(b.Port)})
	}
	for _, a := range hosts {
		if check != nil && knownHost(check, a[0], a[1]) {
			continue
		}
		name := net.JoinHostPort(a[0], a[1])
		if opt.AcceptNewHostKeys {
			out = append(out, fmt.Sprintf("%s: the host key of %s is not in %s yet; --accept-new-host-keys records it on first use", h.Name, name, kh))
			continue
		}
		out = append(out, fmt.Sprintf("%s: the host key of %s is not in %s, so the bring-up stops there: check its fingerprint with the host's owner, then run with --accept-new-host-keys, or add it with: ssh-keyscan -p %s %s >> %s",
			h.Name, name, kh, a[1], a[0], kh))
	}
	return out
}

// keyFileProblem says what is wrong with path as an SSH private key on
// this machine, "" if nothing.
func keyFileProblem(path string) string {
	b, err := os.ReadFile(expandHome(path))
	var pe *fs.PathError
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return path + " does not exist on this machine, so the bring-up cannot log in (without a key file, the ssh-agent's keys are used)"
	case errors.As(err, &pe):
		return fmt.Sprintf("%s cannot be read: %v", path, pe.Err)
	case err != nil:
		return fmt.Sprintf("%s cannot be read: %v", path, err)
	case bytes.HasPrefix(bytes.TrimSpace(b), []byte("ssh-")) || bytes.HasPrefix(bytes.TrimSpace(b), []byte("ecdsa-")):
		return fmt.Sprintf("%s is a public key: it takes the private one (%s)", path, strings.TrimSuffix(path, ".pub"))
	case !bytes.Contains(b, []byte("PRIVATE KEY-----")):
		return path + " is not an SSH private key (one begins -----BEGIN OPENSSH PRIVATE KEY-----)"
	}
	return ""
}

// joinUnknownKeys makes one line of the hosts whose keys are not known,
// with one ssh-keyscan for them, out of a line each, and one line of each
// other finding that several hosts share.
func joinUnknownKeys(checks []string) []string {
	var out, names []string
	var kh string
	byPort := map[string][]string{}
	var ports []string
	// The same finding on several hosts is one line that names them.
	var whats []string
	byWhat := map[string][]string{}
	for _, c := range checks {
		m := unknownKeyRE.FindStringSubmatch(c)
		if m == nil {
			name, what, _ := strings.Cut(c, ": ")
			if _, ok := byWhat[what]; !ok {
				whats = append(whats, what)
			}
			byWhat[what] = append(byWhat[what], name)
			continue
		}
		host, port, _ := net.SplitHostPort(m[1])
		names, kh = append(names, m[1]), m[2]
		if _, ok := byPort[port]; !ok {
			ports = append(ports, port)
		}
		byPort[port] = append(byPort[port], host)
	}
	for _, what := range whats {
		out = append(out, listed(byWhat[what])+": "+what)
	}
	if len(names) == 1 {
		return append(out, checks[slices.IndexFunc(checks, func(c string) bool { return unknownKeyRE.MatchString(c) })])
	}
	if len(names) == 0 {
		return out
	}
	var scans []string
	for _, p := range ports {
		scans = append(scans, fmt.Sprintf("ssh-keyscan -p %s %s >> %s", p, strings.Join(byPort[p], " "), kh))
	}
	return append(out, fmt.Sprintf("the host keys of %s are not in %s, so the bring-up stops there: check their fingerprints with the hosts' owner, then run with --accept-new-host-keys, or add them with: %s",
		listed(names), kh, strings.Join(scans, "; ")))
}

var unknownKeyRE = regexp.MustCompile(`^\S+: the host key of (\S+) is not in (.+), so the bring-up stops there`)

// knownHost reports whether check (a known_hosts file's) records a key
// for address:port, whichever key it is.
func knownHost(check ssh.HostKeyCallback, address, port string) bool {
	ip := net.ParseIP(address)
	if ip == nil {
		ip = net.IPv4zero // a name: matched by name alone
	}
	p, _ := strconv.Atoi(port)
	err := check(net.JoinHostPort(address, port), &net.TCPAddr{IP: ip, Port: p}, probeKey)
	var ke *knownhosts.KeyError
	return err == nil || errors.As(err, &ke) && len(ke.Want) > 0
}

// probeKey is the key knownHost asks about: no host has it, so the answer
// says only whether the host has any.
var probeKey, _ = ssh.NewPublicKey(ed25519.PublicKey(make([]byte, ed25519.PublicKeySize)))

// WritePlan writes the grouped plan as text fitted to width: each group's
// hosts, their SSH, their numbered steps, and what the checks found.
func WritePlan(w io.Writer, groups []PlanGroup, width int) {
	for _, g := range groups {
		head := listed(g.Hosts)
		switch {
		case len(g.Hosts) > 1 && g.Engines > 1:
			head += fmt.Sprintf(": %d hosts, %d engines each", len(g.Hosts), g.Engines)
		case len(g.Hosts) > 1:
			head += fmt.Sprintf(": %d hosts", len(g.Hosts))
		case g.Engines > 1:
			head += fmt.Sprintf(": %d engines", g.Engines)
		}
		fmt.Fprintf(w, "\n%s\n", strings.Join(wrapAt(head+" ("+listed(g.SSH)+")", "  ", width), "\n"))
		for i, s := range g.Steps {
			for j, part := range strings.Split(s, "\n") {
				prefix := fmt.Sprintf("  %d. ", i+1)
				if j > 0 {
					prefix = "       "
				}
				fmt.Fprintln(w, strings.Join(wrapAt(prefix+part, "     ", width), "\n"))
			}
		}
		for _, c := range g.Checks {
			fmt.Fprintln(w, strings.Join(wrapAt("  ! "+c, "    ", width), "\n"))
		}
	}
}

// listed names a few items, or the first two and the last of many.
func listed(items []string) string {
	if len(items) <= 3 {
		return strings.Join(items, ", ")
	}
	return fmt.Sprintf("%s, %s … %s", items[0], items[1], items[len(items)-1])
}

// wrapAt wraps text at its spaces onto lines of at most width, each after
// the first starting with indent; leading spaces stay.
func wrapAt(text, indent string, width int) []string {
	lead := text[:len(text)-len(strings.TrimLeft(text, " "))]
	var lines []string
	line := lead
	for _, word := range strings.Fields(text) {
		switch {
		case strings.TrimSpace(line) == "":
			line += word
		case len([]rune(line))+1+len([]rune(word)) <= width:
			line += " " + word
		default:
			lines = append(lines, line)
			line = indent + word
		}
	}
	return append(lines, line)
}
