package main

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/evolvellm/evolve/cluster"
	"github.com/evolvellm/evolve/internal/wait"
)

// restartByHand kills the cluster's orchestrator and starts it again with
// its command line and environment, as the README's recovery path (or a
// supervisor) does; it returns the new process, ready, with every engine
// serving again. The process is stopped when the test ends.
func restartByHand(t *testing.T, c *localCluster) (*exec.Cmd, readyInfo) {
	t.Helper()
	pid := c.state.Orchestrator
	args := procStrings(t, pid, "cmdline")
	env := procStrings(t, pid, "environ")
	syscall.Kill(pid, syscall.SIGKILL)
	wait.Until(t, 10*time.Second, "the orchestrator gone", func() bool { return !cluster.Alive(pid) })
	orch := exec.Command(evolveBin, args[1:]...)
	orch.Env = env
	var log lockedLog
	orch.Stdout, orch.Stderr = &log, &log
	if err := orch.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		orch.Process.Signal(syscall.SIGTERM)
		orch.Wait()
		if t.Failed() {
			t.Logf("the orchestrator restarted by hand:\n%s", log.String())
		}
	})
	ready := args[slices.Index(args, "--ready-file")+1]
	var info readyInfo
	wait.Until(t, 30*time.Second, "the restarted orchestrator ready", func() bool {
		b, err := os.ReadFile(ready)
		return err == nil && json.Unmarshal(b, &info) == nil && info.PID == orch.Process.Pid
	})
	c.tokenFor(info.ControlURL)
	wait.Until(t, 20*time.Second, "the engines back", func() bool { return servingNodes(t, info.ControlURL) == len(c.state.Engines) })
	return orch, info
}

// A second evolve up never stops what it did not prove dead (issue #56):
// with the orchestrator restarted by hand, cluster.json still names the
// dead one, and an up with the same addresses stopped the engines it
// recorded, then failed on the taken port, leaving the live cluster
// without engines. It now fails first, naming the orchestrator that
// serves them, and the cluster serves on; with other addresses as well.
func TestSecondUpStopsNothingOfALiveCluster(t *testing.T) {
	router, control := freePort(t), freePort(t)
	c := upCluster(t, "--engines", "2", "--router-addr", router, "--control-addr", control)
	orch, info := restartByHand(t, c)
	for _, addrs := range [][]string{{router, control}, {"127.0.0.1:0", "127.0.0.1:0"}} {
		out, code := runBin(t, c.env, "up", "--detach", "--engines", "2", "--router-addr", addrs[0], "--control-addr", addrs[1])
		if code != 1 || !strings.Contains(out, "still runs outside evolve up") || !strings.Contains(out, fmt.Sprintf("pid %d:", orch.Process.Pid)) ||
			strings.Contains(out, "stopping") {
			t.Fatalf("up --router-addr %s beside the cluster restarted by hand: exit %d\n%s", addrs[0], code, out)
		}
		for _, pid := range c.state.Engines {
			if !cluster.Alive(pid) {
				t.Fatalf("the failed up stopped engine %d of the live cluster", pid)
			}
		}
		if n := servingNodes(t, info.ControlURL); n != 2 {
			t.Fatalf("the live cluster serves %d engines after the failed up, want 2", n)
		}
	}
	if code, _, body := post(t, info.RouterURL+"/v1/completions", map[string]any{"prompt": "still here", "max_tokens": 4}); code != 200 {
		t.Fatalf("a request after the failed up: %d %v", code, body)
	}
}

// When the orchestrator is dead but an address this up needs is taken by
// another process, up fails naming that process, before it stops the
// engines the dead cluster left; once the address is free, it stops them
// and starts.
func TestSecondUpNamesWhatHoldsItsAddress(t *testing.T) {
	c := upCluster(t, "--engines", "2")
	home := strings.TrimPrefix(c.env[0], "XDG_STATE_HOME=")
	syscall.Kill(c.state.Orchestrator, syscall.SIGKILL)
	wait.Until(t, 10*time.Second, "the orchestrator gone", func() bool { return !cluster.Alive(c.state.Orchestrator) })
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	out, code := runBin(t, c.env, "up", "--detach", "--engines", "2", "--router-addr", taken.Addr().String(), "--control-addr", "127.0.0.1:0")
	if code != 1 || !strings.Contains(out, fmt.Sprintf("--router-addr %s: the address is in use by pid %d (", taken.Addr(), os.Getpid())) {
		t.Fatalf("up on a taken router address: exit %d\n%s", code, out)
	}
	for _, pid := range c.state.Engines {
		if !cluster.Alive(pid) {
			t.Fatalf("the failed up stopped engine %d before it found its address taken", pid)
		}
	}
	taken.Close()
	out, code = runBin(t, c.env, "up", "--detach", "--engines", "2", "--router-addr", "127.0.0.1:0", "--control-addr", "127.0.0.1:0")
	if code != 0 || !strings.Contains(out, "stopping the 2 engines it left running") {
		t.Fatalf("up once the address is free: exit %d\n%s", code, out)
	}
	if out, code := runBinOut(t, c.env, "down"); code != 0 {
		t.Fatalf("down: %d %s", code, out)
	}
	if left := clusterProcs(t, home); len(left) > 0 {
		t.Fatalf("after down, still running: %v", left)
	}
}

// Two evolve up at once start one cluster (issue #56: both succeeded, two
// orchestrators on one data directory and four engines, two ids used
// twice, and evolve down left three processes). The first holds the state
// directory's lock while it starts; here it is stopped (SIGSTOP) past its
// first child, so that the second surely comes while it starts. The
// second fails at once, naming the first; down says the first has not
// recorded its cluster yet; and once the first is up, down stops it all.
func TestTwoUpsAtOnceStartOneCluster(t *testing.T) {
	home := t.TempDir()
	env := []string{"XDG_STATE_HOME=" + home}
	up := func() *exec.Cmd {
		cmd := exec.Command(evolveBin, "up", "--detach", "--engines", "2", "--router-addr", "127.0.0.1:0", "--control-addr", "127.0.0.1:0")
		cmd.Env = append(os.Environ(), env...)
		return cmd
	}
	t.Cleanup(func() {
		for _, pid := range clusterProcs(t, home) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	first := up()
	var firstOut lockedLog
	first.Stdout, first.Stderr = &firstOut, &firstOut
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- first.Wait() }()
	wait.Until(t, 30*time.Second, "the first up starting its orchestrator", func() bool {
		_, err := os.Stat(filepath.Join(home, "evolve", "local", "logs", "orchestrator.log"))
		return err == nil
	})
	first.Process.Signal(syscall.SIGSTOP)
	second := up()
	out, err := second.CombinedOutput()
	want := fmt.Sprintf("another evolve up (pid %d, since ", first.Process.Pid)
	if err == nil || !strings.Contains(string(out), want) || !strings.Contains(string(out), "is starting a local cluster") {
		first.Process.Signal(syscall.SIGCONT)
		t.Fatalf("the second up while the first starts: %v\n%s", err, out)
	}
	if out, code := runBin(t, env, "down"); code != 1 || !strings.Contains(out, fmt.Sprintf("an evolve up (pid %d) is starting a local cluster", first.Process.Pid)) {
		first.Process.Signal(syscall.SIGCONT)
		t.Fatalf("down while the first up starts: exit %d\n%s", code, out)
	}
	first.Process.Signal(syscall.SIGCONT)
	if err := <-done; err != nil {
		t.Fatalf("the first up: %v\n%s", err, firstOut.String())
	}
	if out, code := runBinOut(t, env, "down"); code != 0 {
		t.Fatalf("down: %d %s", code, out)
	}
	if left := clusterProcs(t, home); len(left) > 0 {
		t.Fatalf("after down, still running: %v", left)
	}
}
