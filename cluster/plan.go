package cluster

import (
	"fmt"
	"slices"
	"sort"
	"strings"
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
