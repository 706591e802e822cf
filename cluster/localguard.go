package cluster

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// What keeps a second evolve up from harming the first: a lock on the
// state directory while one starts (or runs a cluster in the foreground),
// a process counted as the cluster's only when its command line says so,
// and the holder of an address named before anything is stopped.

// LockPath is the lock file of the local cluster of directory dir.
func LockPath(dir string) string { return filepath.Join(dir, "up.lock") }

// LocalLock is the lock evolve up holds on a local cluster's state
// directory while it starts the cluster, and for as long as a cluster in
// the foreground runs. Its file says who holds it.
type LocalLock struct{ f *os.File }

// LockedError is a lock another process holds: its pid and since when, as
// its file says (0 and the zero time when it had not said yet).
type LockedError struct {
	Path  string
	PID   int
	Since time.Time
}

func (e *LockedError) Error() string {
	who := "another evolve up"
	if e.PID > 0 {
		who = fmt.Sprintf("another evolve up (pid %d, since %s)", e.PID, e.Since.Local().Format("15:04:05"))
	}
	return who + " holds " + e.Path
}

// LockLocal takes the lock of dir's local cluster (flock, so that it goes
// with the process however it ends), or returns a *LockedError naming its
// holder. It does not wait.
func LockLocal(dir string) (*LocalLock, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("state directory: %w", err)
	}
	path := LockPath(dir)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("state directory lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, lockHolder(path)
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	// Who holds it, for the next one to say.
	if err := f.Truncate(0); err == nil {
		fmt.Fprintf(f, "%d %s\n", os.Getpid(), time.Now().UTC().Format(time.RFC3339))
	}
	return &LocalLock{f: f}, nil
}

// HolderOf returns the *LockedError of dir's lock while a process holds it,
// nil when none does.
func HolderOf(dir string) *LockedError {
	f, err := os.Open(LockPath(dir))
	if err != nil {
		return nil
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB); err == nil {
		syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		return nil
	}
	return lockHolder(LockPath(dir))
}

// lockHolder reads who holds the lock file at path.
func lockHolder(path string) *LockedError {
	e := &LockedError{Path: path}
	b, _ := os.ReadFile(path)
	if f := strings.Fields(string(b)); len(f) == 2 {
		e.PID, _ = strconv.Atoi(f[0])
		e.Since, _ = time.Parse(time.RFC3339, f[1])
	}
	return e
}

// Release lets the lock go.
func (l *LocalLock) Release() {
	if l != nil && l.f != nil {
		l.f.Close()
		l.f = nil
	}
}

// Member reports whether pid runs an evolve server of the local cluster
// of dir that st records: an orchestrator on one of its data directories,
// or an engine on its event plane. A live evolve server of another
// cluster (its PID reused after a reboot, or a second cluster's) is not.
// Without /proc to read, an evolve server counts (Ours).
func (st *LocalState) Member(dir string, pid int) bool {
	if !Ours(pid) {
		return false
	}
	args, err := cmdline(pid)
	if err != nil {
		return true
	}
	if len(args) < 2 {
		return false
	}
	switch args[1] {
	case "orchestrator":
		return slices.Contains(st.DataDirs(dir), flagValue(args, "data-dir"))
	case "engine":
		return slices.Contains(st.natsHosts(), hostOf(engineNATS(pid, args)))
	}
	return false
}

// natsHosts are the host:port of the cluster's event plane servers.
func (st *LocalState) natsHosts() []string {
	hosts := []string{hostOf(st.NATSURL)}
	for _, o := range st.Orchestrators {
		hosts = append(hosts, hostOf(o.NATSURL))
	}
	return slices.DeleteFunc(hosts, func(h string) bool { return h == "" })
}

// engineNATS is the event plane an engine's command line or environment
// names (the first, of several).
func engineNATS(pid int, args []string) string {
	u := flagValue(args, "nats")
	if u == "" {
		u = environValue(pid, "EVOLVE_ENGINE_NATS")
	}
	first, _, _ := strings.Cut(u, ",")
	return first
}

// cmdline is pid's command line from /proc; an error only when it cannot
// be read (no /proc, or the process is gone).
func cmdline(pid int) ([]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return nil, err
	}
	return strings.Split(strings.TrimRight(string(b), "\x00"), "\x00"), nil
}

// PortHolder finds, from /proc, the process that listens on addr's TCP
// port (on its address, or on every address). listening is false when
// none does; a holder this user may not see (another user's) has PID 0.
func PortHolder(addr string) (p Proc, listening bool) {
	host, portText, err := net.SplitHostPort(addr)
	port, perr := strconv.Atoi(portText)
	if err != nil || perr != nil || port == 0 {
		return Proc{}, false
	}
	ip := net.ParseIP(host)
	var inodes []string
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		inodes = append(inodes, listeners(table, ip, port)...)
	}
	if len(inodes) == 0 {
		return Proc{}, false
	}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		if err != nil {
			continue // another user's
		}
		for _, fd := range fds {
			link, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
			if err != nil || !strings.HasPrefix(link, "socket:[") {
				continue
			}
			if slices.Contains(inodes, strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")) {
				args, _ := cmdline(pid)
				return Proc{PID: pid, Command: RedactURLs(strings.Join(args, " "))}, true
			}
		}
	}
	return Proc{}, true
}

// listeners are the inodes of the sockets of a /proc/net/tcp table that
// listen on port, on ip or on every address (ip nil: any).
func listeners(table string, ip net.IP, port int) []string {
	f, err := os.Open(table)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
		fs := strings.Fields(sc.Text())
		if len(fs) < 10 || fs[3] != "0A" { // 0A: LISTEN
			continue
		}
		hexIP, hexPort, ok := strings.Cut(fs[1], ":")
		if p, err := strconv.ParseUint(hexPort, 16, 16); !ok || err != nil || int(p) != port {
			continue
		}
		if local := procIP(hexIP); ip == nil || ip.IsUnspecified() || local == nil || local.IsUnspecified() || local.Equal(ip) {
			out = append(out, fs[9])
		}
	}
	return out
}

// procIP reads an address as /proc/net/tcp writes it: the IPv4 or IPv6
// bytes in hex, each 32-bit word in the host's (little-endian) order.
func procIP(h string) net.IP {
	if len(h) != 8 && len(h) != 32 {
		return nil
	}
	ip := make(net.IP, len(h)/2)
	for i := 0; i < len(ip); i += 4 {
		for j := 0; j < 4; j++ {
			b, err := strconv.ParseUint(h[2*(i+j):2*(i+j)+2], 16, 8)
			if err != nil {
				return nil
			}
			ip[i+3-j] = byte(b)
		}
	}
	return ip
}

// LastLocal is what a new evolve up finds of the last local cluster of a
// state directory, before it touches anything.
type LastLocal struct {
	State   *LocalState // its record; nil for none, or one that does not read
	Damaged error       // the record's *DamagedStateError, when it does not read
	// Running is an orchestrator of the record that runs.
	Running *LocalOrchestrator
	// Strays are orchestrators on its data that evolve up did not start
	// (restarted by hand or by a supervisor), and the holder of its
	// event plane's address: while one runs, the cluster is not dead.
	Strays []Proc
	// Left are the engines of the record that still run, on its event
	// plane, with every orchestrator of it gone.
	Left []int
	// DataDirs are the data directories it left (its role pins).
	DataDirs []string
}

// FindLastLocal looks for the last local cluster of dir: its record, and
// what of it runs.
func FindLastLocal(dir string) *LastLocal {
	last := &LastLocal{}
	st, err := ReadLocalState(dir)
	var damaged *DamagedStateError
	switch {
	case errors.As(err, &damaged):
		last.Damaged = err
	case err == nil:
		last.State = st
	}
	if st == nil {
		st = &LocalState{}
	}
	dirs := st.DataDirs(dir)
	more, _ := filepath.Glob(filepath.Join(dir, "nats-*"))
	for _, d := range more {
		if !slices.Contains(dirs, d) {
			dirs = append(dirs, d)
		}
	}
	for _, d := range dirs {
		if _, err := os.Stat(d); err == nil {
			last.DataDirs = append(last.DataDirs, d)
		}
	}
	if last.State != nil {
		for _, o := range last.orchestrators() {
			if st.Member(dir, o.PID) {
				last.Running = &o
				return last
			}
		}
	}
	for _, d := range dirs {
		for _, p := range StrayProcs(st, d) {
			if args, err := cmdline(p.PID); err == nil && len(args) > 1 && args[1] == "orchestrator" && !slices.ContainsFunc(last.Strays, func(q Proc) bool { return q.PID == p.PID }) {
				last.Strays = append(last.Strays, p)
			}
		}
	}
	for _, h := range st.natsHosts() {
		if p, listening := PortHolder(h); listening && !slices.ContainsFunc(last.Strays, func(q Proc) bool { return q.PID == p.PID && p.PID != 0 }) {
			if p.Command == "" {
				p.Command = "a process of another user"
			}
			last.Strays = append(last.Strays, p)
		}
	}
	for _, pid := range st.Engines {
		if st.Member(dir, pid) {
			last.Left = append(last.Left, pid)
		}
	}
	return last
}

// orchestrators are the record's orchestrators, the first one the
// record's own fields name.
func (l *LastLocal) orchestrators() []LocalOrchestrator {
	st := l.State
	all := []LocalOrchestrator{{Name: "orchestrator", PID: st.Orchestrator, RouterURL: st.RouterURL, ControlURL: st.ControlURL, NATSURL: st.NATSURL}}
	for _, o := range st.Orchestrators {
		if o.PID != st.Orchestrator {
			all = append(all, o)
		}
	}
	return all
}
