package cluster

import (
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/evolvellm/evolve/internal/wait"
)

// TestMain lets the test binary stand in for an evolve server: run with
// $CLUSTER_TEST_HELPER set, it sleeps (ignoring SIGTERM when the value
// says so) instead of running the tests, so that its command line reads
// "<binary> engine" as an engine's does.
func TestMain(m *testing.M) {
	switch os.Getenv("CLUSTER_TEST_HELPER") {
	case "":
		os.Exit(m.Run())
	case "ignore-term":
		signal.Ignore(syscall.SIGTERM)
	}
	fmt.Println("helper running")
	time.Sleep(time.Minute)
	os.Exit(0)
}

// startHelper starts the test binary as a stand-in server named role
// (engine or orchestrator), in its own process group, with its output in
// the test's folder.
func startHelper(t *testing.T, role, mode string, args ...string) *exec.Cmd {
	t.Helper()
	log := filepath.Join(t.TempDir(), role+".log")
	c, err := StartChild(os.Args[0], log, false, []string{"CLUSTER_TEST_HELPER=" + mode}, append([]string{role}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { c.Wait(); close(done) }()
	t.Cleanup(func() { c.Process.Kill(); <-done })
	wait.Until(t, 10*time.Second, role+" helper running", func() bool {
		b, _ := os.ReadFile(log)
		return strings.Contains(string(b), "helper running")
	})
	return c
}

// A local cluster's record reads back as written, and a missing or broken
// record is an error that names the file.
func TestLocalStateReadsBackAsWritten(t *testing.T) {
	dir := t.TempDir()
	if _, err := ReadLocalState(dir); err == nil {
		t.Fatal("no record read as a cluster")
	}
	st := &LocalState{RouterURL: "http://127.0.0.1:8000", ControlURL: "http://127.0.0.1:8001", NATSURL: "nats://127.0.0.1:4222",
		Orchestrator: 10, Engines: []int{11, 12}, LogDir: "/tmp/logs", Started: time.Unix(1700000000, 0).UTC(), APIKey: "sk-1"}
	if err := WriteLocalState(dir, st); err != nil {
		t.Fatal(err)
	}
	got, err := ReadLocalState(dir)
	if err != nil || fmt.Sprint(*got) != fmt.Sprint(*st) {
		t.Fatalf("read %+v, %v; wrote %+v", got, err, st)
	}
	if fi, _ := os.Stat(LocalStatePath(dir)); fi.Mode().Perm() != 0o600 {
		t.Fatalf("the record (with an API key) is %v, not the user's alone", fi.Mode().Perm())
	}
	os.WriteFile(LocalStatePath(dir), []byte("{half"), 0o600)
	if _, err := ReadLocalState(dir); err == nil || !strings.Contains(err.Error(), LocalStatePath(dir)) {
		t.Fatalf("a broken record: %v", err)
	}
}

// A child runs in its own process group, writes to its log, and counts
// as an evolve server by its command line; a process that is not one is
// not, and a dead or zombie child is not alive.
func TestStartedChildIsOursUntilItEnds(t *testing.T) {
	c := startHelper(t, "engine", "sleep")
	pid := c.Process.Pid
	if pgid, _ := syscall.Getpgid(pid); pgid != pid {
		t.Fatalf("child's process group %d, want its own (%d)", pgid, pid)
	}
	if !Alive(pid) || !Ours(pid) {
		t.Fatalf("a running engine: alive %v, ours %v", Alive(pid), Ours(pid))
	}
	other := exec.Command("sleep", "30")
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	defer other.Process.Kill()
	if !Alive(other.Process.Pid) || Ours(other.Process.Pid) {
		t.Fatal("a stranger's process taken for an evolve server")
	}
	// Killed and not yet reaped: a zombie, not alive.
	other.Process.Signal(syscall.SIGKILL)
	wait.Until(t, 5*time.Second, "the stranger a zombie", func() bool { return !Alive(other.Process.Pid) })
	other.Wait()
	if Alive(0) || Alive(-1) {
		t.Fatal("pid 0 or -1 alive")
	}
}

// StopPIDs stops the evolve servers it is given (SIGTERM; SIGKILL past the
// grace for one that ignores it, and says so) and leaves a stranger's
// process alone; StopAll removes the record and the cluster's data.
func TestStopStopsOursAndLeavesOthers(t *testing.T) {
	stubborn := startHelper(t, "orchestrator", "ignore-term")
	var out strings.Builder
	StopPIDs(&out, []int{stubborn.Process.Pid}, nil, 300*time.Millisecond)
	if Alive(stubborn.Process.Pid) || !strings.Contains(out.String(), fmt.Sprintf("process %d did not stop in 300ms; killing it", stubborn.Process.Pid)) {
		t.Fatalf("the server that ignored SIGTERM: alive %v, said %q", Alive(stubborn.Process.Pid), out.String())
	}

	polite := startHelper(t, "engine", "sleep", "--nats", "nats://127.0.0.1:4999")
	// An engine of another cluster, on another event plane, whose PID the
	// record names (reused after a reboot): not this cluster's to stop.
	elsewhere := startHelper(t, "engine", "sleep", "--nats", "nats://127.0.0.1:5999")
	other := exec.Command("sleep", "30")
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { other.Process.Kill(); other.Wait() }()
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "nats"), 0o700)
	st := &LocalState{Orchestrator: stubborn.Process.Pid, NATSURL: "nats://127.0.0.1:4999",
		Engines: []int{polite.Process.Pid, other.Process.Pid, elsewhere.Process.Pid}}
	if err := WriteLocalState(dir, st); err != nil {
		t.Fatal(err)
	}
	// The helpers are this test's children, reaped by their Wait: a
	// zombie does not count as running.
	left := StopAll(&out, dir, st, nil)
	if Alive(polite.Process.Pid) {
		t.Fatal("the engine still runs")
	}
	if !Alive(other.Process.Pid) {
		t.Fatal("a stranger's process was stopped")
	}
	if !Alive(elsewhere.Process.Pid) {
		t.Fatal("another cluster's engine was stopped")
	}
	if _, err := os.Stat(LocalStatePath(dir)); err == nil {
		t.Fatal("the record is still there")
	}
	if _, err := os.Stat(filepath.Join(dir, "nats")); err == nil {
		t.Fatal("the stopped cluster's data is still there")
	}
	if len(left) != 0 {
		t.Fatalf("left running: %v", left)
	}
}

// A command line in a report keeps no event-plane token.
func TestRedactURLs(t *testing.T) {
	got := RedactURLs("/usr/bin/evolve engine --nats nats://s3cret@10.0.0.5:4222 --listen 127.0.0.1:0")
	if strings.Contains(got, "s3cret") || !strings.Contains(got, "nats://REDACTED@10.0.0.5:4222") || !strings.Contains(got, "--listen 127.0.0.1:0") {
		t.Fatalf("redacted: %q", got)
	}
}
