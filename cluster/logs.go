package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
)

// OrchestratorLog names the orchestrator's log; a host's name names its
// engine's. Of several orchestrators, each log is named
// orchestrator@HOST (see LogNames).
const OrchestratorLog = "orchestrator"

// LogNames are the logs of a cluster file: its orchestrators' (one named
// orchestrator, of several orchestrator@HOST each) and its engines'.
func LogNames(f *File) []string {
	var names []string
	if hosts := f.Spec.Orchestrator.OnHosts(); len(hosts) > 1 {
		for _, h := range hosts {
			names = append(names, OrchestratorLog+"@"+h)
		}
	} else {
		names = append(names, OrchestratorLog)
	}
	for _, h := range f.Engines() {
		names = append(names, h.Name)
	}
	return names
}

// ErrLocalLog says that the log asked for is on this machine: the
// orchestrator of a file whose orchestrator host is local.
var ErrLocalLog = errors.New("the orchestrator runs on this machine")

// Logs writes to w the last tail lines (all of it when tail is negative)
// of the log of the engine on the host named name, or of the orchestrator
// (name "orchestrator") when it runs on a host, read over SSH; with
// follow, then what is written to it until ctx ends.
func Logs(ctx context.Context, f *File, name string, tail int, follow bool, opt UpOptions, w io.Writer) error {
	var h Host
	var path string
	hosts := f.Spec.Orchestrator.OnHosts()
	orchOn, several := strings.CutPrefix(name, OrchestratorLog+"@")
	switch {
	case name == OrchestratorLog && len(hosts) == 0:
		return ErrLocalLog
	case name == OrchestratorLog && len(hosts) == 1, several && len(hosts) > 1 && slices.Contains(hosts, orchOn):
		if !several {
			orchOn = hosts[0]
		}
		h = f.Host(orchOn)
		path = h.OrchestratorDir() + "/orchestrator.log"
	default:
		if h = f.Engine(name); h.Name == "" {
			return fmt.Errorf("%s names no log of cluster %s: logs are those of %s", name, f.Metadata.Name, strings.Join(LogNames(f), ", "))
		}
		path = h.StateDir() + "/engine.log"
	}
	c, err := opt.Dial(ctx, h)
	if err != nil {
		return fmt.Errorf("host %s: %w", h.Name, err)
	}
	defer c.Close()
	if _, err := c.Run(ctx, "test -f "+path); err != nil {
		return fmt.Errorf("host %s has no log at %s (is it up? evolve up -f)", h.Name, path)
	}
	from := fmt.Sprintf("-n %d", tail)
	if tail < 0 {
		from = "-n +1"
	}
	cmd := fmt.Sprintf("tail %s %s", from, path)
	if follow {
		// -F: on through a log written anew (a reinstall).
		cmd = fmt.Sprintf("exec tail %s -F %s 2>/dev/null", from, path)
	}
	if err := c.Stream(ctx, cmd, w); err != nil {
		return fmt.Errorf("host %s: %w", h.Name, err)
	}
	return nil
}
