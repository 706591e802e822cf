package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// localConn is a fake transport: commands run in a local shell with HOME
// set to the host's own directory, so each "host" is a separate tree.
type localConn struct {
	home string
	mu   *sync.Mutex
	log  *[]string
}

func (c localConn) Run(ctx context.Context, cmd string) (string, error) {
	c.mu.Lock()
	*c.log = append(*c.log, cmd)
	c.mu.Unlock()
	x := exec.CommandContext(ctx, "sh", "-c", cmd)
	x.Env = append(os.Environ(), "HOME="+c.home)
	var errb strings.Builder
	x.Stderr = &errb
	out, err := x.Output()
	if err != nil {
		return string(out), fmt.Errorf("%w: %s", err, errb.String())
	}
	return string(out), nil
}

func (c localConn) Stream(ctx context.Context, cmd string, w io.Writer) error {
	x := exec.CommandContext(ctx, "sh", "-c", cmd)
	x.Env = append(os.Environ(), "HOME="+c.home)
	x.Stdout = w
	if err := x.Run(); err != nil && ctx.Err() == nil {
		return err
	}
	return nil
}

func (c localConn) Upload(_ context.Context, r io.Reader, path string, mode os.FileMode) error {
	os.MkdirAll(filepath.Dir(path), 0o755)
	b, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, mode)
}

func (c localConn) LocalAddr() string { return "127.0.0.1" }
func (c localConn) Close() error      { return nil }

type fakeHosts struct {
	mu    sync.Mutex
	homes map[string]string
	down  map[string]bool
	log   []string
}

func (f *fakeHosts) dial(_ context.Context, h Host) (Conn, error) {
	if f.down[h.Name] {
		return nil, errors.New("dial tcp: connection refused")
	}
	return localConn{home: f.homes[h.Name], mu: &f.mu, log: &f.log}, nil
}

func testFile(t *testing.T, hosts ...string) *File {
	var b strings.Builder
	b.WriteString("apiVersion: evolve/v1\nkind: Cluster\nmetadata: {name: t}\nspec:\n  defaults: {user: u, engine: {profile: tiny}}\n  hosts:\n")
	for _, h := range hosts {
		fmt.Fprintf(&b, "    - {name: %s, address: 127.0.0.1}\n", h)
	}
	f, err := Parse("t.yaml", []byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// fakeBinary stands for evolve on the hosts: it records its arguments in
// its working directory (its service's folder) and sleeps like an engine.
func fakeBinary(t *testing.T, dir, tag string) string {
	p := filepath.Join(dir, "evolve-"+tag)
	os.WriteFile(p, []byte("#!/bin/sh\n# "+tag+"\n[ \"$1\" = version ] && { echo "+tag+"; exit 0; }\necho \"$@ NATS=$EVOLVE_ENGINE_NATS\" > args\nexec sleep 300\n"), 0o755)
	return p
}

func TestUpConvergesAndDownRemoves(t *testing.T) {
	dir := t.TempDir()
	hosts := &fakeHosts{homes: map[string]string{"a": filepath.Join(dir, "a"), "b": filepath.Join(dir, "b"), "c": filepath.Join(dir, "c")},
		down: map[string]bool{"c": true}}
	f := testFile(t, "a", "b", "c")
	var progress []string
	var pmu sync.Mutex
	opt := UpOptions{Service: "process", Dial: hosts.dial, Binary: fakeBinary(t, dir, "v1"), NATS: "nats://10.0.0.1:4222", NATSToken: "s3cret",
		Progress: func(h, phase, d string) { pmu.Lock(); progress = append(progress, h+" "+phase); pmu.Unlock() }}
	ctx := context.Background()
	t.Cleanup(func() { Down(ctx, f, opt) })

	res := Up(ctx, f, opt)
	if res[0].Action != "started" || res[1].Action != "started" || res[0].Upload != "uploaded" {
		t.Fatalf("first up: %+v", res)
	}
	// The unreachable host failed where and why; the others kept their work.
	if res[2].Action != "failed" || res[2].Phase != PhaseConnect || !strings.Contains(res[2].Error, "connection refused") {
		t.Fatalf("unreachable host: %+v", res[2])
	}
	// The engine runs with the file's settings.
	args := waitFile(t, filepath.Join(dir, "a/.local/state/evolve/engine/args"))
	for _, want := range []string{"engine --id a", "--listen 0.0.0.0:8100", "--profile tiny", "NATS=nats://s3cret@10.0.0.1:4222"} {
		if !strings.Contains(args, want) {
			t.Fatalf("engine args %q lack %q", args, want)
		}
	}
	// The event plane's token is in the environment, from a script only
	// the host's user can read, not on the command line.
	if strings.Contains(strings.Split(args, " NATS=")[0], "s3cret") {
		t.Fatalf("the token is on the command line: %q", args)
	}
	if fi, err := os.Stat(filepath.Join(dir, "a/.local/state/evolve/engine/run.sh")); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("run.sh: %v %v", fi, err)
	}
	// Re-running changes nothing.
	hosts.log = nil
	res = Up(ctx, f, opt)
	if res[0].Action != "unchanged" || res[1].Action != "unchanged" || res[0].Upload != "unchanged" {
		t.Fatalf("second up: %+v", res)
	}
	for _, cmd := range hosts.log {
		if strings.Contains(cmd, "nohup") || strings.Contains(cmd, "run.sh.new") {
			t.Fatalf("a converged re-run touched the host: %s", cmd)
		}
	}
	// A changed setting restarts that host's engine only.
	f.Spec.Hosts[1].Engine.Args = []string{"--speedup", "10"}
	res = Up(ctx, f, opt)
	if res[0].Action != "unchanged" || res[1].Action != "restarted" {
		t.Fatalf("after a config change: %+v", res)
	}
	// A new binary is uploaded and restarts both.
	opt.Binary = fakeBinary(t, dir, "v2")
	res = Up(ctx, f, opt)
	if res[0].Upload != "uploaded" || res[0].Action != "restarted" || res[1].Action != "restarted" {
		t.Fatalf("after a new binary: %+v", res)
	}
	// Down stops the engines and removes what up installed.
	res = Down(ctx, f, opt)
	if res[0].Action != "stopped" || res[1].Action != "stopped" || res[2].Action != "failed" {
		t.Fatalf("down: %+v", res)
	}
	for _, h := range []string{"a", "b"} {
		state := filepath.Join(dir, h, ".local/state/evolve/engine")
		for _, f := range []string{"bin/evolve", "run.sh", "config.hash", "supervisor.pid"} {
			if _, err := os.Stat(filepath.Join(state, f)); err == nil {
				t.Fatalf("%s: %s left behind", h, f)
			}
		}
	}
	pmu.Lock()
	defer pmu.Unlock()
	if len(progress) == 0 || !strings.Contains(strings.Join(progress, "\n"), "a upload") {
		t.Fatalf("progress: %v", progress)
	}
}

// A port taken by something else on the host fails the host at facts,
// before anything is installed.
func TestUpRefusesABusyPort(t *testing.T) {
	if _, err := exec.LookPath("ss"); err != nil {
		t.Skip("no ss here")
	}
	l, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	dir := t.TempDir()
	hosts := &fakeHosts{homes: map[string]string{"a": filepath.Join(dir, "a")}}
	f := testFile(t, "a")
	f.Spec.Hosts[0].Engine.Port = l.Addr().(*net.TCPAddr).Port
	res := Up(context.Background(), f, UpOptions{Service: "process", Dial: hosts.dial, Binary: fakeBinary(t, dir, "v1"), NATS: "nats://x:1"})
	if res[0].Action != "failed" || res[0].Phase != PhaseFacts || !strings.Contains(res[0].Error, "in use") {
		t.Fatalf("busy port: %+v", res[0])
	}
	if _, err := os.Stat(filepath.Join(dir, "a/.local/state/evolve/engine/bin/evolve")); err == nil {
		t.Fatal("installed on a host whose port is taken")
	}
}

func waitFile(t *testing.T, path string) string {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if b, err := os.ReadFile(path); err == nil && len(b) > 0 {
			return string(b)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never appeared", path)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A state folder the user cannot create needs passwordless sudo: without
// it the host fails at facts saying so, and nothing is installed.
func TestUpNeedsSudoForASystemFolder(t *testing.T) {
	dir := t.TempDir()
	hosts := &fakeHosts{homes: map[string]string{"a": filepath.Join(dir, "a")}}
	f := testFile(t, "a")
	f.Spec.Hosts[0].Dir = "/proc/evolve-cannot-be-here" // not even root makes this
	// A sudo that asks for a password: -n makes it fail.
	bin := filepath.Join(dir, "path")
	os.MkdirAll(bin, 0o755)
	os.WriteFile(filepath.Join(bin, "sudo"), []byte("#!/bin/sh\necho 'sudo: a password is required' >&2\nexit 1\n"), 0o755)
	t.Setenv("PATH", bin+":"+os.Getenv("PATH"))
	res := Up(context.Background(), f, UpOptions{Service: "process", Dial: hosts.dial, Binary: fakeBinary(t, dir, "v1"), NATS: "nats://x:1"})
	if res[0].Phase != PhaseFacts || !strings.Contains(res[0].Error, "sudo -n true fails") || !strings.Contains(res[0].Error, "spec.hosts[].dir") {
		t.Fatalf("unwritable dir: %+v", res[0])
	}
	for _, cmd := range hosts.log {
		if strings.Contains(cmd, "sudo -n mkdir") {
			t.Fatalf("went on after sudo -n true failed: %s", cmd)
		}
	}
}

// A vllm host runs the agent with the vLLM command after --, from the PATH
// its environment gives; a host without vLLM fails at facts, saying so,
// with nothing installed.
func TestUpVLLMHost(t *testing.T) {
	dir := t.TempDir()
	hosts := &fakeHosts{homes: map[string]string{"a": filepath.Join(dir, "a"), "b": filepath.Join(dir, "b")}}
	venv := filepath.Join(dir, "venv", "bin")
	os.MkdirAll(venv, 0o755)
	os.WriteFile(filepath.Join(venv, "vllm"), []byte("#!/bin/sh\nexit 0\n"), 0o755)
	f, err := Parse("t.yaml", []byte(`apiVersion: evolve/v1
kind: Cluster
metadata: {name: t}
spec:
  defaults: {user: u, gpus: 0, engine: {profile: tiny}}
  hosts:
    - name: a
      address: 127.0.0.1
      role: prefill
      engine: {backend: vllm, args: [Qwen/Qwen3-8B, --tensor-parallel-size, "2"], passMetricsPort: 20380, env: {PATH: "`+venv+`:/usr/bin:/bin"}}
    - name: b
      address: 127.0.0.1
      engine: {backend: vllm, command: [/opt/nowhere/vllm, serve], args: [Qwen/Qwen3-8B]}
`))
	if err != nil {
		t.Fatal(err)
	}
	opt := UpOptions{Service: "process", Dial: hosts.dial, Binary: fakeBinary(t, dir, "v1"), NATS: "nats://10.0.0.1:4222"}
	ctx := context.Background()
	t.Cleanup(func() { Down(ctx, f, opt) })
	res := Up(ctx, f, opt)
	if res[0].Action != "started" {
		t.Fatalf("vllm host: %+v", res[0])
	}
	args := waitFile(t, filepath.Join(dir, "a/.local/state/evolve/engine/args"))
	for _, want := range []string{"engine --id a", "--listen 0.0.0.0:8100", "--role prefill", "--backend vllm",
		"--kv-events-port 5557", "--pass-metrics-port 20380 -- vllm serve Qwen/Qwen3-8B --tensor-parallel-size 2"} {
		if !strings.Contains(args, want) {
			t.Fatalf("engine args %q lack %q", args, want)
		}
	}
	if strings.Contains(args, "--profile") {
		t.Fatalf("a vllm engine got a sim profile: %q", args)
	}
	if res[1].Action != "failed" || res[1].Phase != PhaseFacts || !strings.Contains(res[1].Error, "/opt/nowhere/vllm is not installed") {
		t.Fatalf("host without vLLM: %+v", res[1])
	}
	if _, err := os.Stat(filepath.Join(dir, "b/.local/state/evolve/engine/bin/evolve")); err == nil {
		t.Fatal("installed on a host without vLLM")
	}
	plan := f.Plan()
	if !strings.Contains(strings.Join(plan[0].Steps, "\n"), "vllm: vllm serve Qwen/Qwen3-8B --tensor-parallel-size 2 --forward-pass-metrics-port 20380") {
		t.Fatalf("dry-run plan: %v", plan[0].Steps)
	}
}
