package main

import (
	"encoding/json"
	"fmt"
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
	"github.com/nats-io/nats.go"
)

// An engine stopped by SIGSTOP for longer than the heartbeat limit is
// marked down; continued, it serves again within seconds, and a request
// reaches it. Before, it stayed down for good while its heartbeats
// arrived.
func TestStoppedEngineServesAgainWhenContinued(t *testing.T) {
	c := upCluster(t, "--engines", "2", "--speedup", "10")
	pid := c.state.Engines[0]
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	continued := false
	t.Cleanup(func() {
		if !continued {
			syscall.Kill(pid, syscall.SIGCONT)
		}
	})
	wait.Until(t, 15*time.Second, "engine-0 marked down while stopped", func() bool {
		return c.node("engine-0")["state"] == "down"
	})
	time.Sleep(2 * time.Second)
	syscall.Kill(pid, syscall.SIGCONT)
	continued = true
	wait.Until(t, 10*time.Second, "engine-0 serving again after SIGCONT", func() bool {
		return c.node("engine-0")["state"] == "serving"
	})
	// It takes requests again: made the only decode node (which the
	// control requests it answers show too), it decodes them all.
	for id, role := range map[string]string{"engine-0": "decode", "engine-1": "prefill"} {
		t.Run(id, func(t *testing.T) {
			if out, code := runBinOut(t, c.env, "role", "set", id, role); code != 0 {
				t.Fatalf("evolve role set %s %s: %d %s", id, role, code, out)
			}
		})
	}
	wait.Until(t, 20*time.Second, "engine-0 decoding, engine-1 prefilling", func() bool {
		return c.node("engine-0")["role"] == "decode" && c.node("engine-0")["state"] == "serving" &&
			c.node("engine-1")["role"] == "prefill" && c.node("engine-1")["state"] == "serving"
	})
	served := map[string]bool{}
	for i := 0; i < 20 && !served["engine-0"]; i++ {
		code, hdr, body := post(t, c.state.RouterURL+"/v1/completions", map[string]any{"prompt": strings.Repeat("after the stop, a long prompt to prefill ", 40+i), "max_tokens": 2})
		if code != 200 {
			t.Fatalf("request %d after SIGCONT: %d %v", i, code, body)
		}
		served[hdr.Get("X-Evolve-Decode-Node")] = true
		served[hdr.Get("X-Evolve-Prefill-Node")] = true
	}
	if !served["engine-0"] {
		t.Fatalf("20 requests after SIGCONT, none served by engine-0: %v", served)
	}
}

// An embedded event plane off loopback without a token is refused: anyone
// who reached it could drain engines or join as one and receive prompts.
// With a token from a file, it starts; a client without the token is
// refused, an engine given the token in a file joins, and neither command
// line shows the token.
func TestEventPlaneOffLoopbackNeedsAToken(t *testing.T) {
	dir := t.TempDir()
	out, code := runBinOut(t, nil, "orchestrator", "--router-addr", "127.0.0.1:0", "--control-addr", "127.0.0.1:0",
		"--nats-listen", "0.0.0.0:0", "--data-dir", dir)
	if code != 2 || !strings.Contains(out, "not loopback") || !strings.Contains(out, "--nats-token-file") {
		t.Fatalf("an open event plane off loopback: exit %d\n%s", code, out)
	}

	secret := filepath.Join(dir, "nats-token")
	os.WriteFile(secret, []byte("fil3-s3cret\n"), 0o600)
	orch, _ := startOrchestratorLog(t, "--nats-listen", "0.0.0.0:0", "--nats-token-file", secret)
	addr := strings.TrimPrefix(orch.NATSURL, "nats://")
	if nc, err := nats.Connect("nats://127.0.0.1:"+addr[strings.LastIndex(addr, ":")+1:], nats.MaxReconnects(0)); err == nil {
		nc.Close()
		t.Fatal("a NATS client without the token joined the event plane")
	}
	e := startEngine(t, "--profile", "tiny", "--id", "e-file", "--nats", orch.NATSURL, "--nats-token-file", secret)
	wait.Until(t, 10*time.Second, "the engine with the token from a file serving", func() bool { return servingNodes(t, orch.ControlURL) == 1 })
	cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", e.cmd.Process.Pid))
	if strings.Contains(string(cmdline), "fil3-s3cret") || strings.Contains(e.logText(), "fil3-s3cret") {
		t.Fatalf("the token shows: %q\n%s", cmdline, e.logText())
	}
	// A token on the command line still works, and is warned about.
	e2 := startEngine(t, "--profile", "tiny", "--id", "e-flag", "--nats", withToken(orch.NATSURL, "fil3-s3cret"))
	wait.Until(t, 10*time.Second, "the engine with the token in --nats serving", func() bool { return servingNodes(t, orch.ControlURL) == 2 })
	if !strings.Contains(e2.logText(), "shows it in ps") {
		t.Fatalf("no warning for a token on the command line:\n%s", e2.logText())
	}
}

// evolve up with its event plane off loopback makes a token and hands it
// to its children through their environment.
func TestUpOffLoopbackGivesTheEventPlaneAToken(t *testing.T) {
	c := upCluster(t, "--engines", "1", "--nats-addr", "0.0.0.0:0")
	if n := c.node("engine-0"); n["state"] != "serving" {
		t.Fatalf("engine-0: %v", n)
	}
	u := c.state.NATSURL
	if nc, err := nats.Connect("nats://127.0.0.1:"+u[strings.LastIndex(u, ":")+1:], nats.MaxReconnects(0)); err == nil {
		nc.Close()
		t.Fatal("a NATS client without the token joined evolve up's event plane")
	}
	// The tokens' files are on the children's command lines; the tokens
	// are not.
	var secrets []string
	for _, f := range []string{c.state.NATSTokenFile, c.state.ControlTokenFile} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		secrets = append(secrets, strings.TrimSpace(string(b)))
	}
	for _, pid := range append([]int{c.state.Orchestrator}, c.state.Engines...) {
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if strings.Contains(string(cmdline), "@") || strings.Contains(string(cmdline), secrets[0]) || strings.Contains(string(cmdline), secrets[1]) {
			t.Fatalf("a secret on a child's command line: %q", cmdline)
		}
	}
}

// An orchestrator killed and started again by a supervisor with the same
// command line (evolve up's: --nats-listen 127.0.0.1:0) listens where its
// engines look for it, on the port it picked the first time, and every
// engine rejoins. Before, it picked a new port and orphaned them all.
func TestOrchestratorRestartedBySupervisorKeepsItsEngines(t *testing.T) {
	c := upCluster(t, "--engines", "2", "--speedup", "10")
	pid := c.state.Orchestrator
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		t.Fatal(err)
	}
	args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
	if !slices.Contains(args, "127.0.0.1:0") {
		t.Fatalf("evolve up's orchestrator no longer asks for a free NATS port: %q", args)
	}
	syscall.Kill(pid, syscall.SIGKILL)
	wait.Until(t, 10*time.Second, "orchestrator gone", func() bool { return !cluster.Alive(pid) })
	// At once, as a supervisor restarts it.
	orch := exec.Command(evolveBin, args[1:]...)
	orch.Env = append(os.Environ(), c.env...)
	var log lockedLog
	orch.Stderr = &log
	if err := orch.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		orch.Process.Signal(syscall.SIGTERM)
		orch.Wait()
		if t.Failed() {
			t.Logf("restarted orchestrator:\n%s", log.String())
		}
	})
	c.state.Orchestrator = orch.Process.Pid
	ready := args[slices.Index(args, "--ready-file")+1]
	var info readyInfo
	wait.Until(t, 30*time.Second, "the restarted orchestrator ready", func() bool {
		b, err := os.ReadFile(ready)
		return err == nil && json.Unmarshal(b, &info) == nil && info.PID == orch.Process.Pid
	})
	if info.NATSURL != c.state.NATSURL {
		t.Fatalf("the event plane moved from %s to %s", c.state.NATSURL, info.NATSURL)
	}
	c.tokenFor(info.ControlURL)
	wait.Until(t, 20*time.Second, "both engines rejoin", func() bool { return servingNodes(t, info.ControlURL) == 2 })
	if code, _, body := post(t, info.RouterURL+"/v1/completions", map[string]any{"prompt": "after the restart", "max_tokens": 4}); code != 200 {
		t.Fatalf("a request after the restart: %d %v", code, body)
	}

	// evolve down stops what evolve up started, and says what it leaves:
	// the orchestrator restarted by hand, whose data it keeps.
	data := args[slices.Index(args, "--data-dir")+1]
	out, code := runBinOut(t, c.env, "down")
	if code != 1 || !strings.Contains(out, fmt.Sprintf("pid %d:", orch.Process.Pid)) || !strings.Contains(out, "still running") {
		t.Fatalf("evolve down with a hand-started orchestrator: exit %d\n%s", code, out)
	}
	if !cluster.Alive(orch.Process.Pid) {
		t.Fatal("evolve down stopped a process it did not start")
	}
	if _, err := os.Stat(data); err != nil {
		t.Fatalf("evolve down removed the live orchestrator's data: %v", err)
	}
}
