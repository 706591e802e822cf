package cluster

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The local launcher: evolve up without a cluster file starts an
// orchestrator and engines as children of itself on this machine, records
// them in a state file in its directory (LocalState), and evolve down
// stops them from that record.

// LocalState records a local cluster started by evolve up, so that evolve
// down and the other commands find it.
type LocalState struct {
	RouterURL    string    `json:"router_url"`
	ControlURL   string    `json:"control_url"`
	NATSURL      string    `json:"nats_url"`
	Orchestrator int       `json:"orchestrator_pid"`
	Engines      []int     `json:"engine_pids"`
	LogDir       string    `json:"log_dir"`
	Started      time.Time `json:"started"`
	Detached     bool      `json:"detached"`
	// APIKey is the first of the keys the router requires, if any: evolve
	// bench sends it to this cluster (the file is the user's alone).
	APIKey string `json:"api_key,omitempty"`
	// Orchestrators lists every orchestrator of a cluster of several
	// (evolve up --orchestrators), the first one the fields above name.
	Orchestrators []LocalOrchestrator `json:"orchestrators,omitempty"`
	// ControlTokenFile and NATSTokenFile hold the tokens of the cluster's
	// control API and event plane (mode 0600, in its state directory), so
	// that a local process is not trusted for being on loopback: the
	// user's commands read the first, the cluster's processes both.
	ControlTokenFile string `json:"control_token_file,omitempty"`
	NATSTokenFile    string `json:"nats_token_file,omitempty"`
}

// LocalOrchestrator is one of the orchestrators of a local cluster.
type LocalOrchestrator struct {
	Name       string `json:"name"`
	PID        int    `json:"pid"`
	RouterURL  string `json:"router_url"`
	ControlURL string `json:"control_url"`
	NATSURL    string `json:"nats_url"`
	DataDir    string `json:"data_dir"`
}

// OrchestratorPIDs are the processes of the cluster's orchestrators.
func (st *LocalState) OrchestratorPIDs() []int {
	pids := []int{st.Orchestrator}
	for _, o := range st.Orchestrators {
		if o.PID != st.Orchestrator {
			pids = append(pids, o.PID)
		}
	}
	return pids
}

// DataDirs are the data directories of the cluster's orchestrators
// under dir.
func (st *LocalState) DataDirs(dir string) []string {
	dirs := []string{filepath.Join(dir, "nats")}
	for _, o := range st.Orchestrators {
		if o.DataDir != "" && !slices.Contains(dirs, o.DataDir) {
			dirs = append(dirs, o.DataDir)
		}
	}
	return dirs
}

// LocalStatePath is where the local cluster of directory dir is recorded.
func LocalStatePath(dir string) string { return filepath.Join(dir, "cluster.json") }

// ReadLocalState reads the record of the local cluster of dir.
func ReadLocalState(dir string) (*LocalState, error) {
	b, err := os.ReadFile(LocalStatePath(dir))
	if err != nil {
		return nil, err
	}
	var st LocalState
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, &DamagedStateError{Path: LocalStatePath(dir), Err: err}
	}
	return &st, nil
}

// DamagedStateError is a local cluster's record that does not read (cut
// short by a full disk or a crash, or written over).
type DamagedStateError struct {
	Path string
	Err  error
}

func (e *DamagedStateError) Error() string {
	why := "it is not a cluster's record"
	var se *json.SyntaxError
	if errors.As(e.Err, &se) {
		why = fmt.Sprintf("it is cut short or damaged at byte %d", se.Offset)
	}
	return fmt.Sprintf("the local cluster's record %s does not read (%s)", e.Path, why)
}

func (e *DamagedStateError) Unwrap() error { return e.Err }

// WriteLocalState records st as the local cluster of dir, replacing the
// file at once (a reader never sees half of it).
func WriteLocalState(dir string, st *LocalState) error {
	b, _ := json.MarshalIndent(st, "", "  ")
	tmp := LocalStatePath(dir) + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, LocalStatePath(dir))
}

// Alive reports whether pid runs (a zombie does not count).
func Alive(pid int) bool {
	if pid <= 0 || syscall.Kill(pid, 0) != nil {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true // no /proc: trust kill(0)
	}
	// The state follows the command name in parentheses.
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] != 'Z'
	}
	return true
}

// Ours reports whether pid runs an evolve server (an orchestrator or an
// engine). A state file outlives a reboot, and its PIDs may then name
// someone else's processes: those are never signalled, nor taken for a
// running cluster.
func Ours(pid int) bool {
	if !Alive(pid) {
		return false
	}
	args, err := cmdline(pid)
	if err != nil {
		return true // no /proc: trust kill(0)
	}
	return len(args) > 1 && (args[1] == "orchestrator" || args[1] == "engine")
}

// StartChild starts `exe args...` with its output in log and env added to
// its environment (secrets go there, not on command lines that ps shows).
// Children get their own process group, so that a Ctrl-C reaches only
// the parent, which stops them in order; detached ones get their own
// session.
func StartChild(exe, log string, detach bool, env []string, args ...string) (*exec.Cmd, error) {
	f, err := os.OpenFile(log, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}
	c := exec.Command(exe, args...)
	c.Env = append(os.Environ(), env...)
	c.Stdout, c.Stderr = f, f
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: !detach, Setsid: detach}
	if err := c.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", args[0], err)
	}
	f.Close()
	return c, nil
}

// StopAll stops the local cluster of dir recorded in st: the engines, then
// the orchestrator (SIGTERM, then SIGKILL after a grace period), and
// removes the record. waits, when not nil, has a channel per child of
// this process that closes when it ends. It returns the cluster's servers
// it left running: those it did not start (restarted by hand), whose data
// it keeps.
func StopAll(errw io.Writer, dir string, st *LocalState, waits map[int]chan struct{}) []Proc {
	// Of the recorded processes, only this process's children and those
	// that prove to be the cluster's: a PID reused by another cluster's
	// server is not.
	members := func(pids []int) []int {
		return slices.DeleteFunc(slices.Clone(pids), func(pid int) bool {
			_, child := waits[pid]
			return !child && !st.Member(dir, pid)
		})
	}
	StopPIDs(errw, members(st.Engines), waits, 15*time.Second)
	orchs := st.OrchestratorPIDs()
	StopPIDs(errw, members(orchs), waits, 15*time.Second)
	os.Remove(LocalStatePath(dir))
	var left []Proc
	for _, data := range st.DataDirs(dir) {
		for _, p := range StrayProcs(st, data) {
			if !slices.ContainsFunc(left, func(q Proc) bool { return q.PID == p.PID }) {
				left = append(left, p)
			}
		}
	}
	if slices.ContainsFunc(orchs, Alive) {
		return left
	}
	if len(left) == 0 {
		// No process of the cluster reads its tokens again.
		for _, f := range []string{st.ControlTokenFile, st.NATSTokenFile} {
			if f != "" {
				os.Remove(f)
			}
		}
	}
	for _, data := range st.DataDirs(dir) {
		// Its durable state (pinned roles) lives as long as the cluster:
		// it survives an orchestrator restart, but the next 'evolve up'
		// starts as its flags say, not with the pins of this one. Never
		// while an orchestrator started by hand still runs on it.
		if !slices.ContainsFunc(left, func(p Proc) bool { return strings.Contains(p.Command, data) }) {
			os.RemoveAll(data)
		}
	}
	return left
}

// StopPIDs stops the evolve servers among pids (SIGTERM, then SIGKILL
// after grace), waiting for each; others' processes are left alone.
func StopPIDs(errw io.Writer, pids []int, waits map[int]chan struct{}, grace time.Duration) {
	pids = slices.DeleteFunc(slices.Clone(pids), func(pid int) bool { return !Ours(pid) })
	for _, pid := range pids {
		if Alive(pid) {
			syscall.Kill(pid, syscall.SIGTERM)
		}
	}
	deadline := time.Now().Add(grace)
	for _, pid := range pids {
		for Alive(pid) {
			if ch, ok := waits[pid]; ok {
				select {
				case <-ch:
					continue
				case <-time.After(50 * time.Millisecond):
				}
			} else {
				time.Sleep(50 * time.Millisecond)
			}
			if time.Now().After(deadline) {
				fmt.Fprintf(errw, "process %d did not stop in %v; killing it\n", pid, grace)
				syscall.Kill(pid, syscall.SIGKILL)
				deadline = time.Now().Add(5 * time.Second)
			}
		}
	}
}

// Proc is an evolve server of the local cluster that evolve up did not
// start (or no longer records): an orchestrator restarted by hand on the
// cluster's data, an engine joined to its event plane.
type Proc struct {
	PID     int    `json:"pid"`
	Command string `json:"command"` // its command line, the event plane's token left out
}

// StrayProcs finds, in /proc, the evolve servers that belong to the local
// cluster st but are not among its recorded processes: an orchestrator
// whose --data-dir is dataDir, an engine whose event plane (its --nats, or
// $EVOLVE_ENGINE_NATS) is st's.
func StrayProcs(st *LocalState, dataDir string) []Proc {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	known := append(append(st.OrchestratorPIDs(), os.Getpid()), st.Engines...)
	natsHost := hostOf(st.NATSURL)
	var out []Proc
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || slices.Contains(known, pid) || !Alive(pid) {
			continue
		}
		args, err := cmdline(pid)
		if err != nil || len(args) < 2 || filepath.Base(args[0]) != "evolve" && !strings.HasSuffix(args[0], "/evolve") {
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
			out = append(out, Proc{PID: pid, Command: RedactURLs(strings.Join(args, " "))})
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

// hostOf is the host:port of a URL ("" if it names none).
func hostOf(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	return u.Host
}

// RedactURLs leaves the user information (an event plane's token) out of
// every URL in a command line, for a log or a report.
func RedactURLs(cmdline string) string {
	f := strings.Fields(cmdline)
	for i, w := range f {
		if u, err := url.Parse(w); err == nil && u.User != nil && u.Host != "" {
			u.User = url.User("REDACTED")
			f[i] = u.String()
		}
	}
	return strings.Join(f, " ")
}

// ServesControl reports whether controlURL is the control API of one of
// the cluster's orchestrators.
func (st *LocalState) ServesControl(controlURL string) bool {
	same := func(u string) bool { return u != "" && strings.TrimRight(u, "/") == strings.TrimRight(controlURL, "/") }
	if same(st.ControlURL) {
		return true
	}
	return slices.ContainsFunc(st.Orchestrators, func(o LocalOrchestrator) bool { return same(o.ControlURL) })
}
