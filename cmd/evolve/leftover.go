package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// clusterProc is an evolve server of the local cluster that evolve up did
// not start (or no longer records): an orchestrator restarted by hand on
// the cluster's data, an engine joined to its event plane.
type clusterProc struct {
	PID     int    `json:"pid"`
	Command string `json:"command"`
}

// strayProcs finds, in /proc, the evolve servers that belong to the local
// cluster st but are not among its recorded processes: an orchestrator
// whose --data-dir is dataDir, an engine whose event plane (its --nats, or
// $EVOLVE_ENGINE_NATS) is st's.
func strayProcs(st *localState, dataDir string) []clusterProc {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	known := append([]int{st.Orchestrator, os.Getpid()}, st.Engines...)
	natsHost := hostOf(st.NATSURL)
	var out []clusterProc
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || slices.Contains(known, pid) || !alive(pid) {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if len(args) < 2 || filepath.Base(args[0]) != "evolve" && !strings.HasSuffix(args[0], "/evolve") {
			continue
		}
		mine := false
		switch args[1] {
		case "orchestrator":
			mine = flagValue(args, "data-dir") == dataDir
		case "engine":
			u := flagValue(args, "nats")
			if u == "" {
				u = environValue(pid, "EVOLVE_ENGINE_NATS")
			}
			mine = natsHost != "" && hostOf(u) == natsHost
		}
		if mine {
			out = append(out, clusterProc{PID: pid, Command: redactURL(strings.Join(args, " "))})
		}
	}
	return out
}

// flagValue is the value of --name in args (--name V or --name=V).
func flagValue(args []string, name string) string {
	for i, a := range args {
		if a == "--"+name && i+1 < len(args) {
			return args[i+1]
		}
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v
		}
	}
	return ""
}

// environValue is the variable name of process pid's environment.
func environValue(pid int, name string) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		return ""
	}
	for _, kv := range bytes.Split(b, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte(name+"=")); ok {
			return string(v)
		}
	}
	return ""
}
