package cluster

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// One process at a time holds a local cluster's lock; the next is told
// who holds it, and takes it once the first lets go.
func TestLocalLockNamesItsHolder(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "local")
	if HolderOf(dir) != nil {
		t.Fatal("a lock no one took has a holder")
	}
	first, err := LockLocal(dir)
	if err != nil {
		t.Fatal(err)
	}
	_, err = LockLocal(dir)
	var held *LockedError
	if !errors.As(err, &held) || held.PID != os.Getpid() || held.Since.IsZero() {
		t.Fatalf("a second lock: %v, want one naming pid %d", err, os.Getpid())
	}
	if h := HolderOf(dir); h == nil || h.PID != os.Getpid() {
		t.Fatalf("HolderOf while held: %v", h)
	}
	if fi, err := os.Stat(LockPath(dir)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the lock file: %v %v", fi, err)
	}
	first.Release()
	if HolderOf(dir) != nil {
		t.Fatal("a released lock still has a holder")
	}
	again, err := LockLocal(dir)
	if err != nil {
		t.Fatalf("the lock once released: %v", err)
	}
	again.Release()
}

// The holder of an address is found by its listening socket, on that
// address or on every one; a free port has none.
func TestPortHolderFindsTheListener(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	p, listening := PortHolder(addr)
	if !listening || p.PID != os.Getpid() || !strings.Contains(p.Command, filepath.Base(os.Args[0])) {
		t.Fatalf("PortHolder(%s) = %+v, %v; want this process (%d)", addr, p, listening, os.Getpid())
	}
	_, port, _ := net.SplitHostPort(addr)
	if p, listening := PortHolder("0.0.0.0:" + port); !listening || p.PID != os.Getpid() {
		t.Fatalf("PortHolder(0.0.0.0:%s) = %+v, %v", port, p, listening)
	}
	ln.Close()
	if p, listening := PortHolder(addr); listening {
		t.Fatalf("a closed port held by %+v", p)
	}
}

// An orchestrator is the cluster's when it runs on the cluster's data,
// an engine when it is on the cluster's event plane; other evolve servers
// are not, whatever PIDs the record names.
func TestMemberIsByDataAndEventPlane(t *testing.T) {
	dir := t.TempDir()
	st := &LocalState{NATSURL: "nats://127.0.0.1:4999"}
	ours := startHelper(t, "orchestrator", "sleep", "--data-dir", filepath.Join(dir, "nats"))
	theirs := startHelper(t, "orchestrator", "sleep", "--data-dir", "/elsewhere/nats")
	engine := startHelper(t, "engine", "sleep", "--nats", "nats://127.0.0.1:4999")
	stranger := startHelper(t, "engine", "sleep", "--nats", "nats://127.0.0.1:5999")
	for _, c := range []struct {
		name string
		pid  int
		want bool
	}{
		{"the orchestrator on the cluster's data", ours.Process.Pid, true},
		{"an orchestrator on other data", theirs.Process.Pid, false},
		{"an engine on the cluster's event plane", engine.Process.Pid, true},
		{"an engine on another", stranger.Process.Pid, false},
		{"this test", os.Getpid(), false},
	} {
		if got := st.Member(dir, c.pid); got != c.want {
			t.Errorf("%s: member %v, want %v", c.name, got, c.want)
		}
	}
}
