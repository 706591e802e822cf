// Package cluster is the cluster file (cluster.yaml) and, in the phases
// that follow, the SSH bootstrap of engines on GPU hosts.
package cluster

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"os"
	"path"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/evolvellm/evolve/engine/stepmodel"
	"github.com/evolvellm/evolve/engine/vllm"
	"gopkg.in/yaml.v3"
)

// APIVersion and Kind of a cluster file.
const (
	APIVersion = "evolve/v1"
	Kind       = "Cluster"
)

// File is a cluster file.
type File struct {
	APIVersion string   `yaml:"apiVersion"`
	Kind       string   `yaml:"kind"`
	Metadata   Metadata `yaml:"metadata"`
	Spec       Spec     `yaml:"spec"`

	lines map[string]int // field path -> line, for errors
	path  string
}

// Metadata names the cluster.
type Metadata struct {
	Name string `yaml:"name"`
}

// Spec is the cluster's hosts and orchestrator.
type Spec struct {
	Orchestrator Orchestrator `yaml:"orchestrator"`
	Concurrency  int          `yaml:"concurrency"` // hosts worked on at once; default 8
	Defaults     Host         `yaml:"defaults"`    // merged into every host
	Hosts        []Host       `yaml:"hosts"`
}

// Orchestrator says where the orchestrator runs and on which ports.
type Orchestrator struct {
	Host string `yaml:"host"` // "local" (the operator's machine) or a host's name
	// Hosts, instead of host, runs one orchestrator on each of these
	// hosts: their NATS servers form one cluster (routes on clusterPort),
	// each routes requests, one leads the planner, and the cluster serves
	// on when one of them dies. Three is the usual number: JetStream keeps
	// evolve's state while a majority of them runs.
	Hosts       []string `yaml:"hosts"`
	RouterPort  int      `yaml:"routerPort"`
	ControlPort int      `yaml:"controlPort"`
	NATSPort    int      `yaml:"natsPort"`
	// ClusterPort is where the orchestrators of hosts take their peers'
	// NATS routes (default 6222); unused by one orchestrator.
	ClusterPort int `yaml:"clusterPort"`
	// Advertise is the address engines reach the orchestrator's NATS at;
	// default: the address the hosts see the operator's machine at (of an
	// orchestrator on a host: the host's address). Not with several hosts:
	// each is reached at its host's address.
	Advertise string `yaml:"advertise"`
	// ModelAliases are other names clients may give the served model, or
	// patterns (claude-*), as evolve orchestrator --model-alias takes.
	ModelAliases []string `yaml:"modelAliases"`
	// TLS makes the router and the control API serve HTTPS with a
	// certificate and key on the orchestrator's machine.
	TLS *TLS `yaml:"tls"`
}

// Local says whether the orchestrator runs on the operator's machine.
func (o Orchestrator) Local() bool { return len(o.OnHosts()) == 0 }

// OnHosts are the hosts orchestrators run on, in the file's order: none
// when the orchestrator runs on the operator's machine.
func (o Orchestrator) OnHosts() []string {
	if len(o.Hosts) > 0 {
		return o.Hosts
	}
	if o.Host == "" || o.Host == "local" {
		return nil
	}
	return []string{o.Host}
}

// OrchestratorPorts are the ports of the orchestrator on one host: those
// of spec.orchestrator, or the host's own (spec.hosts[i].orchestrator)
// where another program holds those.
type OrchestratorPorts struct {
	RouterPort  int `yaml:"routerPort"`
	ControlPort int `yaml:"controlPort"`
	NATSPort    int `yaml:"natsPort"`
	ClusterPort int `yaml:"clusterPort"`
}

// OrchestratorPorts are the ports the orchestrator on the host named
// host listens on.
func (f *File) OrchestratorPorts(host string) OrchestratorPorts {
	o := f.Spec.Orchestrator
	p := OrchestratorPorts{RouterPort: o.RouterPort, ControlPort: o.ControlPort, NATSPort: o.NATSPort, ClusterPort: o.ClusterPort}
	if h := f.Host(host).Orchestrator; h != nil {
		p.RouterPort = cmp.Or(h.RouterPort, p.RouterPort)
		p.ControlPort = cmp.Or(h.ControlPort, p.ControlPort)
		p.NATSPort = cmp.Or(h.NATSPort, p.NATSPort)
		p.ClusterPort = cmp.Or(h.ClusterPort, p.ClusterPort)
	}
	return p
}

// TLS names a PEM certificate (chain) and its key, as paths on the machine
// that reads them.
type TLS struct {
	CertFile string `yaml:"certFile"`
	KeyFile  string `yaml:"keyFile"`
}

// Args are the orchestrator's command-line flags for what the file sets
// beyond its ports.
func (o Orchestrator) Args() []string {
	var args []string
	for _, a := range o.ModelAliases {
		args = append(args, "--model-alias", a)
	}
	if o.TLS != nil {
		args = append(args, "--tls-cert-file", o.TLS.CertFile, "--tls-key-file", o.TLS.KeyFile)
	}
	return args
}

// Host is one GPU host.
type Host struct {
	Name    string   `yaml:"name"`
	Address string   `yaml:"address"`
	User    string   `yaml:"user"` // default: ~/.ssh/config's, else the local user
	Port    int      `yaml:"port"`
	KeyPath string   `yaml:"keyPath"`
	Bastion *Bastion `yaml:"bastion"`
	GPUs    int      `yaml:"gpus"`
	Role    string   `yaml:"role"` // initial role: prefill, decode, or empty
	Engine  Engine   `yaml:"engine"`
	// Engines is how many engines the host runs, its GPUs shared out
	// evenly (default 1): an 8-GPU host with engines 4 runs four engines
	// of 2 GPUs, named NAME-0 to NAME-3 (see File.Engines).
	Engines int `yaml:"engines"`
	// Dir is where evolve keeps its files on the host (default
	// $HOME/.local/state/evolve/engine).
	Dir string `yaml:"dir"`
	// Orchestrator gives the ports of the orchestrator this host runs
	// (spec.orchestrator.host or hosts) where they differ from
	// spec.orchestrator's: a host whose ports another program holds.
	Orchestrator *OrchestratorPorts `yaml:"orchestrator"`

	// Of an engine that shares its host with others (File.Engines): the
	// host's name and GPUs in the file, and the engine's index there.
	host     string
	hostGPUs int
	index    int
}

// Bastion is a jump host.
type Bastion struct {
	Address string `yaml:"address"`
	User    string `yaml:"user"`
	Port    int    `yaml:"port"`
	KeyPath string `yaml:"keyPath"`
}

// Engine is what runs on a host.
type Engine struct {
	Backend string `yaml:"backend"` // sim or vllm
	Profile string `yaml:"profile"` // for sim
	Port    int    `yaml:"port"`    // engine HTTP port; default 8100
	// Args: for sim, more `evolve engine` flags; for vllm, the arguments
	// of `vllm serve` (the model first).
	Args []string `yaml:"args"`
	// Command is the vLLM server's command, before Args; default
	// [vllm, serve]. vllm only.
	Command []string `yaml:"command"`
	// Ports vLLM binds beside Port: its KV event publisher (default
	// 5557), its replay service (5558) and NIXL's side channel (5600).
	// vllm only.
	KVEventsPort int `yaml:"kvEventsPort"`
	KVReplayPort int `yaml:"kvReplayPort"`
	NIXLPort     int `yaml:"nixlPort"`
	// PassMetricsPort, when set, is where vLLM publishes its forward-pass
	// metrics (--forward-pass-metrics-port, which only recent releases
	// have), for the planner to learn the engine's pass costs; unset, the
	// agent picks a free port when the release has the flag. vllm only.
	PassMetricsPort int               `yaml:"passMetricsPort"`
	Env             map[string]string `yaml:"env"`
}

// Host returns the host named name (the zero Host if none).
func (f *File) Host(name string) Host {
	for _, h := range f.Spec.Hosts {
		if h.Name == name {
			return h
		}
	}
	return Host{}
}

// FieldError is a problem with one field of the file.
type FieldError struct {
	File  string
	Line  int
	Field string
	Msg   string
}

func (e FieldError) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("%s:%d: %s: %s", e.File, e.Line, e.Field, e.Msg)
	}
	return fmt.Sprintf("%s: %s: %s", e.File, e.Field, e.Msg)
}

// Errors is every problem found in a file.
type Errors []FieldError

func (es Errors) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d problem(s) in the cluster file:", len(es))
	for _, e := range es {
		b.WriteString("\n  " + e.Error())
	}
	return b.String()
}

// Load reads and validates a cluster file.
func Load(path string) (*File, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(path, b)
}

// Parse decodes and validates a cluster file; unknown fields and wrong
// types are errors with their line, as is every invalid value.
func Parse(path string, b []byte) (*File, error) {
	var root yaml.Node
	if err := yaml.Unmarshal(b, &root); err != nil {
		return nil, syntaxError(path, err)
	}
	if len(root.Content) == 0 {
		return nil, fmt.Errorf("%s: the file is empty; a cluster file starts with apiVersion: %s and kind: %s (evolve up --help shows one)", path, APIVersion, Kind)
	}
	if es := shapeErrors(path, root.Content[0], reflect.TypeOf(File{}), ""); len(es) > 0 {
		return nil, Errors(es)
	}
	f := &File{lines: map[string]int{}, path: path}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(f); err != nil {
		var te *yaml.TypeError
		if errors.As(err, &te) {
			var es Errors
			for _, m := range te.Errors {
				es = append(es, FieldError{File: path, Line: lineOf(m), Field: "schema", Msg: stripLine(m)})
			}
			return nil, es
		}
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(root.Content) > 0 {
		walk(root.Content[0], "", f.lines)
	}
	f.applyDefaults()
	if es := f.validate(); len(es) > 0 {
		return nil, es
	}
	return f, nil
}

var lineRE = regexp.MustCompile(`^line (\d+): `)

func lineOf(msg string) int {
	if m := lineRE.FindStringSubmatch(msg); m != nil {
		n, _ := strconv.Atoi(m[1])
		return n
	}
	return 0
}

func stripLine(msg string) string { return lineRE.ReplaceAllString(msg, "") }

// walk records the line of every field path (spec.hosts[1].address).
func walk(n *yaml.Node, path string, lines map[string]int) {
	switch n.Kind {
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			p := k.Value
			if path != "" {
				p = path + "." + k.Value
			}
			lines[p] = k.Line
			walk(v, p, lines)
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			p := fmt.Sprintf("%s[%d]", path, i)
			lines[p] = c.Line
			walk(c, p, lines)
		}
	}
}

// applyDefaults merges spec.defaults and built-in defaults into the hosts.
func (f *File) applyDefaults() {
	s := &f.Spec
	if s.Concurrency == 0 {
		s.Concurrency = 8
	}
	o := &s.Orchestrator
	if o.Host == "" && len(o.Hosts) == 0 {
		o.Host = "local"
	}
	if o.RouterPort == 0 {
		o.RouterPort = 8000
	}
	if o.ControlPort == 0 {
		o.ControlPort = 8001
	}
	if o.NATSPort == 0 {
		o.NATSPort = 4222
	}
	if o.ClusterPort == 0 {
		o.ClusterPort = 6222
	}
	d := s.Defaults
	for i := range s.Hosts {
		h := &s.Hosts[i]
		h.User = or(h.User, d.User)
		h.KeyPath = or(h.KeyPath, d.KeyPath)
		if h.Port == 0 {
			h.Port = max(d.Port, 22)
		}
		if h.Bastion == nil {
			h.Bastion = d.Bastion
		}
		if h.GPUs == 0 {
			h.GPUs = d.GPUs
		}
		h.Role = or(h.Role, d.Role)
		h.Dir = or(h.Dir, d.Dir)
		e := &h.Engine
		e.Backend = or(or(e.Backend, d.Engine.Backend), "sim")
		if e.Backend == or(d.Engine.Backend, "sim") {
			e.Profile = or(e.Profile, d.Engine.Profile) // a default profile is for the default backend
		}
		if e.Command == nil {
			e.Command = d.Engine.Command
		}
		h.Engines = cmp.Or(h.Engines, d.Engines, 1)
		if e.Backend == "vllm" {
			e.KVEventsPort = cmp.Or(e.KVEventsPort, d.Engine.KVEventsPort, 5557)
			// Each engine of a host takes the next port of each kind: the
			// replay ports follow the event ports' range.
			replay := 5558
			if h.Engines > 1 {
				replay = e.KVEventsPort + h.Engines
			}
			e.KVReplayPort = cmp.Or(e.KVReplayPort, d.Engine.KVReplayPort, replay)
			e.NIXLPort = cmp.Or(e.NIXLPort, d.Engine.NIXLPort, 5600)
			e.PassMetricsPort = cmp.Or(e.PassMetricsPort, d.Engine.PassMetricsPort)
		}
		if e.Port == 0 {
			e.Port = max(d.Engine.Port, 8100)
		}
		if e.Args == nil {
			e.Args = d.Engine.Args
		}
		if len(d.Engine.Env) > 0 {
			env := map[string]string{}
			for k, v := range d.Engine.Env {
				env[k] = v
			}
			for k, v := range e.Env {
				env[k] = v
			}
			e.Env = env
		}
		if h.Bastion != nil && h.Bastion.Port == 0 {
			b := *h.Bastion
			b.Port = 22
			h.Bastion = &b
		}
	}
}

func or(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

var nameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?$`)

// validate checks every value and reports each problem with its field and
// line, a validator per section of the file.
func (f *File) validate() Errors {
	v := &validator{f: f}
	if f.APIVersion != APIVersion {
		v.bad("apiVersion", "is %q; want %q", f.APIVersion, APIVersion)
	}
	if f.Kind != Kind {
		v.bad("kind", "is %q; want %q", f.Kind, Kind)
	}
	if !nameRE.MatchString(f.Metadata.Name) {
		v.bad("metadata.name", "%q: want a lowercase name of letters, digits, dots and dashes", f.Metadata.Name)
	}
	s := f.Spec
	if s.Concurrency < 1 {
		v.bad("spec.concurrency", "must be at least 1")
	}
	if len(s.Hosts) == 0 {
		v.bad("spec.hosts", "lists no host")
	}
	v.orchestrator(s.Orchestrator)
	names := map[string]int{}
	for i, h := range s.Hosts {
		p := fmt.Sprintf("spec.hosts[%d]", i)
		if !nameRE.MatchString(h.Name) {
			v.bad(p+".name", "%q: want a lowercase name of letters, digits, dots and dashes", h.Name)
		} else if j, dup := names[h.Name]; dup {
			v.bad(p+".name", "%q is also the name of hosts[%d]", h.Name, j)
		}
		names[h.Name] = i
		v.host(p, h)
		switch h.Engine.Backend {
		case "sim":
			v.simEngine(p, h.Engine)
		case "vllm":
			v.vllmEngine(p, h)
		default:
			v.bad(p+".engine.backend", "%q: want sim or vllm", h.Engine.Backend)
		}
		v.enginePorts(p, h)
	}
	v.orchestratorHosts(s.Orchestrator, names)
	v.engineNames(names)
	sort.SliceStable(v.es, func(i, j int) bool { return v.es[i].Line < v.es[j].Line })
	return v.es
}

// validator gathers a file's problems, each with its field and line.
type validator struct {
	f  *File
	es Errors
}

// bad records a problem with field, at the field's line: a host's value
// taken from spec.defaults is pointed at there, an absent field at its
// parent.
func (v *validator) bad(field, format string, args ...any) {
	line := v.f.lines[field]
	if _, rest, ok := strings.Cut(field, "]."); line == 0 && ok && strings.HasPrefix(field, "spec.hosts[") {
		line = v.f.lines["spec.defaults."+rest] // the value came from the defaults
	}
	for p := field; line == 0 && p != ""; {
		i := strings.LastIndexAny(p, ".[")
		if i < 0 {
			break
		}
		p = p[:i]
		line = v.f.lines[p]
	}
	v.es = append(v.es, FieldError{File: v.f.path, Line: line, Field: field, Msg: fmt.Sprintf(format, args...)})
}

// port checks a port number.
func (v *validator) port(field string, p int) {
	if p < 1 || p > 65535 {
		v.bad(field, "%d is not a port", p)
	}
}

// orchestrator checks spec.orchestrator (but its host, which needs the
// hosts' names).
func (v *validator) orchestrator(o Orchestrator) {
	v.port("spec.orchestrator.routerPort", o.RouterPort)
	v.port("spec.orchestrator.controlPort", o.ControlPort)
	v.port("spec.orchestrator.natsPort", o.NATSPort)
	v.port("spec.orchestrator.clusterPort", o.ClusterPort)
	for i, a := range o.ModelAliases {
		if _, err := path.Match(a, ""); a == "" || strings.Contains(a, ",") || err != nil {
			v.bad(fmt.Sprintf("spec.orchestrator.modelAliases[%d]", i), "%q: want a model name or a pattern such as claude-*", a)
		}
	}
	if t := o.TLS; t != nil {
		for _, f := range []struct{ field, path string }{{"certFile", t.CertFile}, {"keyFile", t.KeyFile}} {
			if !path.IsAbs(f.path) {
				v.bad("spec.orchestrator.tls."+f.field, "%q: want the absolute path of a PEM file on the orchestrator's machine", f.path)
			}
		}
	}
}

// orchestratorHosts checks spec.orchestrator.host or hosts against the
// hosts' names, and the hosts' own orchestrator ports.
func (v *validator) orchestratorHosts(o Orchestrator, names map[string]int) {
	switch {
	case len(o.Hosts) > 0 && o.Host != "":
		v.bad("spec.orchestrator.hosts", "set host (one orchestrator) or hosts (several), not both")
	case len(o.Hosts) == 0 && o.Host != "local":
		if _, ok := names[o.Host]; !ok {
			v.bad("spec.orchestrator.host", "%q: want local or the name of a host", o.Host)
		}
	}
	seen := map[string]int{}
	for i, h := range o.Hosts {
		p := fmt.Sprintf("spec.orchestrator.hosts[%d]", i)
		if _, ok := names[h]; !ok {
			v.bad(p, "%q: want the name of a host (orchestrators run on the file's hosts; for one on this machine, set host: local)", h)
		} else if j, dup := seen[h]; dup {
			v.bad(p, "%q is also hosts[%d]: a host runs one orchestrator", h, j)
		}
		seen[h] = i
	}
	if len(o.Hosts) > 1 && o.Advertise != "" {
		v.bad("spec.orchestrator.advertise", "is for one orchestrator: of several, engines reach each at its host's address")
	}
	if v.f.Spec.Defaults.Orchestrator != nil {
		v.bad("spec.defaults.orchestrator", "is per host: set it on the hosts that run an orchestrator, or set spec.orchestrator's ports")
	}
	on := o.OnHosts()
	for i, h := range v.f.Spec.Hosts {
		if h.Orchestrator == nil {
			continue
		}
		p := fmt.Sprintf("spec.hosts[%d].orchestrator", i)
		if !slicesContains(on, h.Name) {
			v.bad(p, "host %s runs no orchestrator (spec.orchestrator.host or hosts names those that do)", h.Name)
			continue
		}
		ports := v.f.OrchestratorPorts(h.Name)
		named := []struct {
			name string
			port int
		}{{"routerPort", ports.RouterPort}, {"controlPort", ports.ControlPort}, {"natsPort", ports.NATSPort}, {"clusterPort", ports.ClusterPort}}
		for k, a := range named {
			v.port(p+"."+a.name, a.port)
			for _, b := range named[:k] {
				if a.port == b.port {
					v.bad(p+"."+a.name, "%d is also the orchestrator's %s on this host", a.port, b.name)
				}
			}
		}
	}
}

// host checks a host's SSH, GPUs, role and engine count.
func (v *validator) host(p string, h Host) {
	if h.Address == "" {
		v.bad(p+".address", "is missing: the host's SSH address")
	}
	v.port(p+".port", h.Port)
	if h.Bastion != nil {
		if h.Bastion.Address == "" {
			v.bad(p+".bastion.address", "is missing")
		}
		v.port(p+".bastion.port", h.Bastion.Port)
	}
	if h.GPUs < 0 {
		v.bad(p+".gpus", "must not be negative")
	}
	switch h.Role {
	case "", "prefill", "decode":
	default:
		v.bad(p+".role", "%q: want prefill or decode (or leave it to the planner)", h.Role)
	}
	if h.Engines < 1 {
		v.bad(p+".engines", "must be at least 1")
	} else if h.Engines > 1 {
		if devs, ok := h.Engine.Env[cudaDevices]; ok {
			if n := len(splitDevices(devs)); n%h.Engines != 0 {
				v.bad(p+".engine.env."+cudaDevices, "%q lists %d GPUs, which %d engines cannot share evenly", devs, n, h.Engines)
			}
		} else if h.GPUs%h.Engines != 0 || h.Engine.Backend == "vllm" && h.GPUs == 0 {
			v.bad(p+".gpus", "%d GPUs cannot be shared evenly by %d engines: set gpus to a multiple of engines", h.GPUs, h.Engines)
		}
	}
}

// simEngine checks a sim backend's engine.
func (v *validator) simEngine(p string, e Engine) {
	if e.Profile == "" {
		v.bad(p+".engine.profile", "is missing: the sim backend needs one of %s", strings.Join(stepmodel.ProfileNames(), ", "))
	} else if !slicesContains(stepmodel.ProfileNames(), e.Profile) {
		v.bad(p+".engine.profile", "%q: want one of %s", e.Profile, strings.Join(stepmodel.ProfileNames(), ", "))
	}
	if len(e.Command) > 0 {
		v.bad(p+".engine.command", "is for the vllm backend")
	}
	if e.KVEventsPort+e.KVReplayPort+e.NIXLPort+e.PassMetricsPort != 0 {
		v.bad(p+".engine", "kvEventsPort, kvReplayPort, nixlPort and passMetricsPort are for the vllm backend")
	}
}

// vllmEngine checks a vllm backend's engine: its model, its pass-metrics
// port, and its parallel sizes against the host's GPUs.
func (v *validator) vllmEngine(p string, h Host) {
	e := h.Engine
	if e.Profile != "" {
		v.bad(p+".engine.profile", "is for the sim backend; vllm takes its model in engine.args")
	}
	if len(e.Args) == 0 {
		v.bad(p+".engine.args", "is missing: the vllm backend needs the model to serve, e.g. [Qwen/Qwen3-8B, --tensor-parallel-size, \"2\"]")
	}
	if vllm.HasFlag(e.Args, "--forward-pass-metrics-port") {
		if max(h.Engines, 1) > 1 {
			v.bad(p+".engine.args", "--forward-pass-metrics-port: the host's %d engines would all publish on that port; set engine.passMetricsPort instead (engine i takes it plus i)", h.Engines)
		} else if e.PassMetricsPort != 0 {
			v.bad(p+".engine.passMetricsPort", "engine.args set --forward-pass-metrics-port too: set one of them")
		}
	}
	// vLLM on fewer GPUs than its parallel sizes ask for fails on the
	// host, after the model's download: say so here. The GPUs are the
	// file's, else those CUDA_VISIBLE_DEVICES lists.
	gpus := cmp.Or(h.GPUs, len(splitDevices(e.Env[cudaDevices])))
	tp, pp, dp, flag := vllm.ParallelSizes(e.Args)
	switch need := tp * pp * dp; {
	case flag != "":
		v.bad(p+".engine.args", "%s: want a positive number", flag)
	case dp > 1:
		// Its ranks publish KV events on ports of their own, which the
		// engine does not follow (and a host's next engine takes): the
		// directory would miss their caches.
		v.bad(p+".engine.args", "--data-parallel-size %d: evolve follows one vLLM server's KV events per engine; run the ranks as engines of their own (engines: %d, each with its share of the GPUs)", dp, dp*max(h.Engines, 1))
	case gpus > 0 && h.Engines >= 1 && need > gpus/h.Engines:
		if h.Engines > 1 {
			v.bad(p+".engine.args", "vLLM's parallel sizes ask for %d GPUs per engine; %d engines sharing %d GPUs have %d each", need, h.Engines, gpus, gpus/h.Engines)
		} else {
			v.bad(p+".engine.args", "vLLM's parallel sizes ask for %d GPUs; the engine has %d (gpus, or CUDA_VISIBLE_DEVICES)", need, gpus)
		}
	}
}

// enginePorts checks a host's engine ports: engine i of the host takes
// each port plus i, so the ranges must fit and not overlap.
func (v *validator) enginePorts(p string, h Host) {
	e := h.Engine
	n := max(h.Engines, 1)
	type namedPort struct {
		name string
		v    int
	}
	ports := []namedPort{{"port", e.Port}}
	if e.Backend == "vllm" {
		ports = append(ports, namedPort{"kvEventsPort", e.KVEventsPort}, namedPort{"kvReplayPort", e.KVReplayPort}, namedPort{"nixlPort", e.NIXLPort})
		if e.PassMetricsPort != 0 {
			ports = append(ports, namedPort{"passMetricsPort", e.PassMetricsPort})
		}
	}
	for k, pt := range ports {
		v.port(p+".engine."+pt.name, pt.v)
		if n > 1 && pt.v+n-1 > 65535 {
			v.bad(p+".engine."+pt.name, "%d engines take ports %d to %d, past 65535", n, pt.v, pt.v+n-1)
		}
		for _, o := range ports[:k] {
			if pt.v <= o.v+n-1 && o.v <= pt.v+n-1 {
				if n == 1 {
					v.bad(p+".engine."+pt.name, "%d is also engine.%s", pt.v, o.name)
				} else {
					v.bad(p+".engine."+pt.name, "its %d engines take %s, which overlaps engine.%s's %s: leave %d ports to each kind",
						n, portRange(pt.v, n), o.name, portRange(o.v, n), n)
				}
			}
		}
	}
}

// engineNames checks that no host is named as another host's engine
// (NAME-0 to NAME-(N-1)).
func (v *validator) engineNames(names map[string]int) {
	for i, h := range v.f.Spec.Hosts {
		if h.Engines <= 1 {
			continue
		}
		for k := 0; k < h.Engines; k++ {
			e := fmt.Sprintf("%s-%d", h.Name, k)
			if j, dup := names[e]; dup && j != i {
				v.bad(fmt.Sprintf("spec.hosts[%d].name", j), "%q is also the name of an engine of hosts[%d] (%s runs %s-0 to %s-%d)", e, i, h.Name, h.Name, h.Name, h.Engines-1)
			}
		}
	}
}

func portRange(from, n int) string { return fmt.Sprintf("%d-%d", from, from+n-1) }

// cudaDevices is the variable that tells CUDA which GPUs a process sees.
const cudaDevices = "CUDA_VISIBLE_DEVICES"

func splitDevices(s string) []string {
	var out []string
	for _, d := range strings.Split(s, ",") {
		if d = strings.TrimSpace(d); d != "" {
			out = append(out, d)
		}
	}
	return out
}

// Engines are the engines the cluster runs, a host's in its order: a host
// of one engine is its own engine; a host of engines N runs N, named
// NAME-0 to NAME-(N-1). Engine i of such a host gets an even share of its
// GPUs, as CUDA_VISIBLE_DEVICES (the i-th share of the list
// engine.env.CUDA_VISIBLE_DEVICES gives, else of 0 to gpus-1), its own
// state folder under the host's (dir/NAME-i), and each port the file gives
// plus i: engine.port, and vLLM's kvEventsPort, kvReplayPort, nixlPort and
// passMetricsPort.
func (f *File) Engines() []Host {
	var out []Host
	for _, h := range f.Spec.Hosts {
		if h.Engines <= 1 {
			out = append(out, h)
			continue
		}
		devs := splitDevices(h.Engine.Env[cudaDevices])
		if len(devs) == 0 {
			for g := 0; g < h.GPUs; g++ {
				devs = append(devs, strconv.Itoa(g))
			}
		}
		per := len(devs) / h.Engines
		for i := 0; i < h.Engines; i++ {
			e := h
			e.Name = fmt.Sprintf("%s-%d", h.Name, i)
			e.Dir = h.StateDir() + "/" + e.Name
			e.host, e.hostGPUs, e.index = h.Name, h.GPUs, i
			e.Engines = 1
			e.GPUs = per
			e.Engine.Port += i
			if e.Engine.Backend == "vllm" {
				e.Engine.KVEventsPort += i
				e.Engine.KVReplayPort += i
				e.Engine.NIXLPort += i
				if e.Engine.PassMetricsPort > 0 {
					e.Engine.PassMetricsPort += i
				}
			}
			env := make(map[string]string, len(h.Engine.Env)+1)
			for k, v := range h.Engine.Env {
				env[k] = v
			}
			if per > 0 {
				env[cudaDevices] = strings.Join(devs[i*per:(i+1)*per], ",")
			}
			e.Engine.Env = env
			out = append(out, e)
		}
	}
	return out
}

// Engine returns the engine named name (the zero Host if none).
func (f *File) Engine(name string) Host {
	for _, h := range f.Engines() {
		if h.Name == name {
			return h
		}
	}
	return Host{}
}

// HostName is the name in the file of the host the engine runs on: its
// own name unless it shares a host with other engines.
func (h Host) HostName() string { return cmp.Or(h.host, h.Name) }

func slicesContains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}
