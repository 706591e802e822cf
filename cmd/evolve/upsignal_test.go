package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/evolvellm/evolve/cluster"
	"github.com/evolvellm/evolve/internal/wait"
)

// The local cluster's processes run in their own process groups, so only
// `evolve up` hears a Ctrl-C, a closed terminal or a broken pipe. Whenever
// it stops, nothing it started may run on.

// clusterProcs lists the processes whose environment names stateHome:
// everything `evolve up` started under it, whatever became of up itself.
func clusterProcs(t *testing.T, stateHome string) []int {
	t.Helper()
	want := []byte("XDG_STATE_HOME=" + stateHome + "\x00")
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Skip("no /proc to find the cluster's processes in")
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil || !bytes.Contains(env, want) || !cluster.Alive(pid) {
			continue
		}
		pids = append(pids, pid)
	}
	return pids
}

// startUp runs `evolve up` with stderr on a pipe the test reads, and kills
// whatever is left of the cluster when the test ends.
func startUp(t *testing.T, args ...string) (cmd *exec.Cmd, stateHome string, stderr io.ReadCloser) {
	t.Helper()
	stateHome = t.TempDir()
	cmd = exec.Command(evolveBin, append([]string{"up", "--engines", "2", "--router-addr", "127.0.0.1:0", "--control-addr", "127.0.0.1:0"}, args...)...)
	cmd.Env = append(os.Environ(), "XDG_STATE_HOME="+stateHome)
	cmd.Stdout = new(bytes.Buffer) // read once up has exited
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		for _, pid := range clusterProcs(t, stateHome) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	return cmd, stateHome, stderr
}

// waitFor reads r until a line contains s, and returns what it read.
func waitFor(t *testing.T, r io.Reader, s string) string {
	t.Helper()
	return waitForLine(t, r, s, func(line string) bool { return strings.Contains(line, s) })
}

// waitReady reads up's stderr until the engines have registered.
func waitReady(t *testing.T, r io.Reader) string {
	t.Helper()
	return waitForLine(t, r, "the engines ready", func(line string) bool {
		return strings.HasPrefix(line, "starting 2 engines") && strings.HasSuffix(line, " ready")
	})
}

func waitForLine(t *testing.T, r io.Reader, s string, match func(string) bool) string {
	t.Helper()
	var seen strings.Builder
	found := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			seen.WriteString(sc.Text() + "\n")
			if match(sc.Text()) {
				found <- true
				return
			}
		}
		found <- false
	}()
	select {
	case ok := <-found:
		if !ok {
			t.Fatalf("evolve up ended before printing %q:\n%s", s, seen.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("evolve up did not print %q in 60s", s)
	}
	return seen.String()
}

// stoppedEverything waits for up to exit and checks that it took the
// cluster with it.
func stoppedEverything(t *testing.T, cmd *exec.Cmd, stateHome string) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("evolve up did not exit within 60s of the signal")
	}
	// Up waits for each child it stops; allow the kernel a moment to reap.
	deadline := time.Now().Add(5 * time.Second)
	for len(clusterProcs(t, stateHome)) > 0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if left := clusterProcs(t, stateHome); len(left) > 0 {
		t.Fatalf("evolve up exited and left %d of its processes running: %v", len(left), left)
	}
	if _, err := os.Stat(filepath.Join(stateHome, "evolve", "local", "cluster.json")); !os.IsNotExist(err) {
		t.Fatalf("the local cluster's record outlived it: %v", err)
	}
}

// A closed terminal (SSH dropped, tmux killed) stops the cluster as Ctrl-C
// does.
func TestUpStopsTheClusterOnHangup(t *testing.T) {
	cmd, home, stderr := startUp(t)
	waitReady(t, stderr)
	if n := len(clusterProcs(t, home)) - 1; n != 3 { // up itself is one
		t.Fatalf("%d processes besides up, want the orchestrator and 2 engines", n)
	}
	go io.Copy(io.Discard, stderr)
	cmd.Process.Signal(syscall.SIGHUP)
	stoppedEverything(t, cmd, home)
}

// Ctrl-C while the cluster is still coming up stops what had started.
func TestUpInterruptedWhileStartingStopsWhatStarted(t *testing.T) {
	cmd, home, stderr := startUp(t)
	waitFor(t, stderr, "starting orchestrator")
	go io.Copy(io.Discard, stderr)
	cmd.Process.Signal(os.Interrupt)
	stoppedEverything(t, cmd, home)
}

// `evolve up | tee log`, and Ctrl-C reaches tee too: up writes its goodbye
// into a broken pipe, which must not kill it before the teardown.
func TestUpStopsTheClusterWhenItsOutputIsGone(t *testing.T) {
	cmd, home, stderr := startUp(t)
	waitReady(t, stderr)
	stderr.Close()
	cmd.Process.Signal(os.Interrupt)
	stoppedEverything(t, cmd, home)
}

// With agents running, Ctrl-C prints their summary and stops the cluster,
// even when up's output is gone (| tee, and tee died of the same Ctrl-C)
// and the terminal closes during the teardown.
func TestUpWithAgentsStopsTheClusterWhateverFollowsCtrlC(t *testing.T) {
	for _, then := range []string{"output gone", "hangup"} {
		t.Run(then, func(t *testing.T) {
			cmd, home, stderr := startUp(t, "--agents", "2", "--workload", "math")
			waitFor(t, stderr, "running 2 math agents")
			if then == "output gone" {
				stderr.Close()
			} else {
				go io.Copy(io.Discard, stderr)
			}
			cmd.Process.Signal(os.Interrupt)
			if then == "hangup" {
				time.Sleep(100 * time.Millisecond)
				cmd.Process.Signal(syscall.SIGHUP)
			}
			stoppedEverything(t, cmd, home)
		})
	}
}

// Agents whose prompts no model context holds: up says so within seconds
// rather than at the end of --duration, fails with the way out, and stops
// the cluster it started.
func TestUpWithAgentsPastTheContextFails(t *testing.T) {
	cmd, home, stderr := startUp(t, "--agents", "4", "--workload", "coding", "--profile", "tiny", "--duration", "2m")
	var out strings.Builder
	copied := make(chan struct{})
	go func() { io.Copy(&out, stderr); close(copied) }()
	stoppedEverything(t, cmd, home)
	<-copied
	if code := cmd.ProcessState.ExitCode(); code != 1 || !strings.Contains(out.String(), "stopping the cluster") ||
		!strings.Contains(out.String(), "no request was sent") || !strings.Contains(out.String(), "--profile gb300-kimi-k2") {
		t.Fatalf("up --agents with prompts past the context: exit %d\n%s", code, out.String())
	}
}

// An orchestrator killed outright leaves its engines running: the next
// up stops them before its own cluster's record replaces the old one, so
// that down can still reach everything.
func TestUpStopsTheEnginesADeadOrchestratorLeft(t *testing.T) {
	c := upCluster(t, "--engines", "2", "--profile", "tiny")
	home := strings.TrimPrefix(c.env[0], "XDG_STATE_HOME=")
	syscall.Kill(c.state.Orchestrator, syscall.SIGKILL)
	wait.Until(t, 10*time.Second, "the orchestrator dies", func() bool { return !cluster.Alive(c.state.Orchestrator) })
	// Commands say what happened, and what to do.
	if out, code := runBinOut(t, c.env, "nodes"); code != 1 || !strings.Contains(out, "the local cluster's orchestrator is gone") {
		t.Fatalf("nodes with the orchestrator dead: exit %d\n%s", code, out)
	}
	out, code := runBin(t, c.env, "up", "--detach", "--router-addr", "127.0.0.1:0", "--control-addr", "127.0.0.1:0", "--engines", "2", "--profile", "tiny")
	if code != 0 || !strings.Contains(out, "stopping the 2 engines it left running") {
		t.Fatalf("up after the orchestrator died: exit %d\n%s", code, out)
	}
	for _, pid := range c.state.Engines {
		if cluster.Alive(pid) {
			t.Fatalf("engine %d of the dead cluster still runs", pid)
		}
	}
	if out, code := runBinOut(t, c.env, "down"); code != 0 {
		t.Fatalf("down: %d %s", code, out)
	}
	if left := clusterProcs(t, home); len(left) > 0 {
		t.Fatalf("after down, still running: %v", left)
	}
}

// A state file can outlive a reboot, and its PIDs then name someone
// else's processes: down never signals them, and up does not take them
// for a running cluster.
func TestStateFilePIDsOfStrangersAreLeftAlone(t *testing.T) {
	stranger := exec.Command("sleep", "60")
	if err := stranger.Start(); err != nil {
		t.Fatal(err)
	}
	defer stranger.Process.Kill()
	home := t.TempDir()
	env := []string{"XDG_STATE_HOME=" + home}
	dir := filepath.Join(home, "evolve", "local")
	os.MkdirAll(dir, 0o700)
	pid := stranger.Process.Pid
	os.WriteFile(filepath.Join(dir, "cluster.json"), []byte(fmt.Sprintf(`{"router_url": "http://127.0.0.1:1", "orchestrator_pid": %d, "engine_pids": [%d]}`, pid, pid)), 0o600)
	if out, code := runBinOut(t, env, "down"); code != 0 {
		t.Fatalf("down: %d %s", code, out)
	}
	if !cluster.Alive(pid) {
		t.Fatal("evolve down killed a process that was not its own")
	}
	out, code := runBinOut(t, env, "up", "--detach", "--router-addr", "127.0.0.1:0", "--control-addr", "127.0.0.1:0", "--engines", "1")
	t.Cleanup(func() { runBinOut(t, env, "down") })
	if code != 0 || strings.Contains(out, "already running") {
		t.Fatalf("up beside a stranger's PID: exit %d\n%s", code, out)
	}
	if !cluster.Alive(pid) {
		t.Fatal("evolve up killed a process that was not its own")
	}
}

// An engine that stops on its own while up runs in the foreground is
// reported there, with the end of its log; Ctrl-C still stops the rest.
func TestUpReportsAnEngineThatStops(t *testing.T) {
	cmd, home, stderr := startUp(t)
	waitReady(t, stderr)
	st := readStateIn(t, home)
	syscall.Kill(st.Engines[1], syscall.SIGKILL)
	seen := waitFor(t, stderr, "stopped on its own")
	if !strings.Contains(seen, "engine-1 stopped on its own (signal: killed); the cluster serves on without it") {
		t.Fatalf("up said:\n%s", seen)
	}
	go io.Copy(io.Discard, stderr)
	cmd.Process.Signal(os.Interrupt)
	stoppedEverything(t, cmd, home)
}

func readStateIn(t *testing.T, home string) cluster.LocalState {
	t.Helper()
	var st cluster.LocalState
	b, err := os.ReadFile(filepath.Join(home, "evolve", "local", "cluster.json"))
	if err != nil || json.Unmarshal(b, &st) != nil || len(st.Engines) < 2 {
		t.Fatalf("the local cluster's record: %v %s", err, b)
	}
	return st
}

// With agents running in the foreground, an orchestrator that dies
// (killed, crashed) stops them at once rather than leaving every call to
// fail until --duration ends: up says how it exited, prints what the
// agents measured, fails, and stops the engines.
func TestUpWithAgentsStopsWhenTheOrchestratorDies(t *testing.T) {
	cmd, home, stderr := startUp(t, "--agents", "2", "--workload", "math", "--duration", "10m")
	waitFor(t, stderr, "t=5s/") // the first progress line: the agents are at work
	var out strings.Builder
	copied := make(chan struct{})
	go func() { io.Copy(&out, stderr); close(copied) }()
	st := readStateIn(t, home)
	syscall.Kill(st.Orchestrator, syscall.SIGKILL)
	stoppedEverything(t, cmd, home)
	<-copied
	summary := cmd.Stdout.(*bytes.Buffer).String()
	if code := cmd.ProcessState.ExitCode(); code != 1 ||
		!strings.Contains(out.String(), "the orchestrator exited (signal: killed); the agents stopped") ||
		!strings.Contains(out.String(), "error: the orchestrator exited while the agents ran") ||
		!regexp.MustCompile(`(?m)^workload +math, 2 agents`).MatchString(summary) { // the label column widens with error rows
		t.Fatalf("up --agents after the orchestrator died: exit %d\n%s\nstdout:\n%s", code, out.String(), summary)
	}
}
