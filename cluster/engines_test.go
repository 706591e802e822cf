package cluster

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// running says whether process pid lives (a zombie, ended but not yet
// reaped by whichever process adopted it, does not).
func running(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return syscall.Kill(pid, 0) == nil // no /proc: a signal tells
	}
	_, after, _ := strings.Cut(string(b), ") ")
	return !strings.HasPrefix(after, "Z")
}

// pidAlive reads a pid file and says whether its process lives.
func pidAlive(t *testing.T, path string) (int, bool) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return pid, running(pid)
}

// waitGone waits for a process to end.
func waitGone(t *testing.T, pid int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); running(pid); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			st, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
			out, _ := exec.Command("ps", "-ef", "--forest").Output()
			t.Fatalf("process %d still runs: %s\n%s", pid, st, out)
		}
	}
}

// leftIn lists the files under dir, but for what the stand-in binary
// writes (its arguments).
func leftIn(dir string) []string {
	var left []string
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() && fi.Name() != "args" {
			left = append(left, p)
		}
		return nil
	})
	return left
}

// A host of several engines runs each as a service of its own, in its own
// folder, with its own ports and GPUs; when the file changes the number,
// the engines of the old layout stop and go, and down leaves nothing.
func TestUpRunsSeveralEnginesOnAHost(t *testing.T) {
	dir := t.TempDir()
	home := filepath.Join(dir, "a")
	hosts := &fakeHosts{homes: map[string]string{"a-0": home, "a-1": home, "a": home}}
	f, err := Parse("t.yaml", []byte(`apiVersion: evolve/v1
kind: Cluster
metadata: {name: t}
spec:
  defaults: {user: u, engine: {profile: tiny}}
  hosts:
    - {name: a, address: 127.0.0.1, gpus: 4, engines: 2, role: decode}
`))
	if err != nil {
		t.Fatal(err)
	}
	var progress []string
	var pmu sync.Mutex
	opt := UpOptions{Service: "process", Dial: hosts.dial, Binary: fakeBinary(t, dir, "v1"), NATS: "nats://10.0.0.1:4222",
		Progress: func(h, phase, d string) { pmu.Lock(); progress = append(progress, h+" "+phase+" "+d); pmu.Unlock() }}
	ctx := context.Background()
	t.Cleanup(func() { Down(ctx, f, opt) })
	state := filepath.Join(home, ".local/state/evolve/engine")

	res := Up(ctx, f, opt)
	if len(res) != 2 || res[0].Host != "a-0" || res[1].Host != "a-1" || res[0].Action != "started" || res[1].Action != "started" {
		t.Fatalf("up: %+v", res)
	}
	// The engines of a host share one binary: one of them uploads it.
	if up := []string{res[0].Upload, res[1].Upload}; !slices.Contains(up, "uploaded") || !slices.Contains(up, "unchanged") {
		t.Fatalf("uploads: %v, want one", up)
	}
	if _, err := os.Stat(filepath.Join(state, "bin/evolve")); err != nil {
		t.Fatalf("the host's binary: %v", err)
	}
	for i, want := range []struct{ args, gpus string }{
		{"engine --id a-0 --listen 0.0.0.0:8100 --advertise http://127.0.0.1:8100", "export CUDA_VISIBLE_DEVICES=0,1"},
		{"engine --id a-1 --listen 0.0.0.0:8101 --advertise http://127.0.0.1:8101", "export CUDA_VISIBLE_DEVICES=2,3"},
	} {
		t.Run(want.args, func(t *testing.T) {
			sub := filepath.Join(state, "a-"+strconv.Itoa(i))
			if args := waitFile(t, filepath.Join(sub, "args")); !strings.Contains(args, want.args) || !strings.Contains(args, "--role decode") {
				t.Errorf("engine %d runs %q, want %q", i, args, want.args)
			}
			if run, _ := os.ReadFile(filepath.Join(sub, "run.sh")); !strings.Contains(string(run), want.gpus) {
				t.Errorf("engine %d's run.sh lacks %q:\n%s", i, want.gpus, run)
			}
			if _, ok := pidAlive(t, filepath.Join(sub, "supervisor.pid")); !ok {
				t.Errorf("engine %d's supervisor does not run", i)
			}
		})
	}
	st := Status(ctx, f, opt)
	if len(st) != 2 || !st[0].Running || !st[1].Running || st[1].Host != "a-1" {
		t.Fatalf("status: %+v", st)
	}
	if res = Up(ctx, f, opt); res[0].Action != "unchanged" || res[1].Action != "unchanged" {
		t.Fatalf("a second up: %+v", res)
	}

	// One engine instead: the two stop and their folders go; the single
	// engine takes the host's folder and the first port.
	pid0, _ := pidAlive(t, filepath.Join(state, "a-0/supervisor.pid"))
	pid1, _ := pidAlive(t, filepath.Join(state, "a-1/supervisor.pid"))
	// Something else in the host's folder that looks like an engine's is
	// not ours to stop or remove.
	other := filepath.Join(state, "other")
	os.MkdirAll(other, 0o755)
	os.WriteFile(filepath.Join(other, "engine.log"), []byte("not evolve's"), 0o644)
	f.Spec.Hosts[0].Engines = 1
	if res = Up(ctx, f, opt); len(res) != 1 || res[0].Host != "a" || res[0].Action != "started" {
		t.Fatalf("up with one engine: %+v", res)
	}
	waitGone(t, pid0)
	waitGone(t, pid1)
	for _, sub := range []string{"a-0", "a-1"} {
		// Its files go, and the folder once empty (here the stand-in
		// binary's record of its arguments stays, so the folder does).
		if left := leftIn(filepath.Join(state, sub)); len(left) > 0 {
			t.Errorf("%s's files are left: %v", sub, left)
		}
	}
	// The host's binary stays, but the old engines are no longer installed.
	two, _ := Parse("t.yaml", []byte("apiVersion: evolve/v1\nkind: Cluster\nmetadata: {name: t}\nspec:\n  defaults: {user: u, engine: {profile: tiny}}\n  hosts:\n    - {name: a, address: 127.0.0.1, gpus: 4, engines: 2}\n"))
	if st := Status(ctx, two, opt); st[0].Installed || st[0].Running || st[1].Installed {
		t.Errorf("status of the retired engines: %+v", st)
	}
	if b, err := os.ReadFile(filepath.Join(other, "engine.log")); err != nil || string(b) != "not evolve's" {
		t.Fatalf("a folder not of the old layout was touched: %q %v", b, err)
	}
	os.RemoveAll(other)
	if args := waitFile(t, filepath.Join(state, "args")); !strings.Contains(args, "engine --id a --listen 0.0.0.0:8100") {
		t.Fatalf("the single engine runs %q", args)
	}
	pmu.Lock()
	if p := strings.Join(progress, "\n"); !strings.Contains(p, "a facts stopped the engine of the host's earlier layout in "+filepath.Join(state, "a-1")) {
		t.Errorf("progress does not say the old engines stopped:\n%s", p)
	}
	pmu.Unlock()

	// And back to two: the single engine stops, its config goes (its
	// binary stays for an orchestrator there), the two start.
	single, _ := pidAlive(t, filepath.Join(state, "supervisor.pid"))
	f.Spec.Hosts[0].Engines = 2
	if res = Up(ctx, f, opt); res[0].Action != "started" || res[1].Action != "started" {
		t.Fatalf("up with two engines again: %+v", res)
	}
	waitGone(t, single)
	for _, f := range []string{"run.sh", "config.hash", "engine.log"} {
		if _, err := os.Stat(filepath.Join(state, f)); err == nil {
			t.Fatalf("the single engine's %s is left: the next up would take it for an engine again", f)
		}
	}

	// Down removes every engine and the host's folder.
	res = Down(ctx, f, opt)
	if res[0].Action != "stopped" || res[1].Action != "stopped" {
		t.Fatalf("down: %+v", res)
	}
	if left := leftIn(state); len(left) > 0 {
		t.Fatalf("down left %v", left)
	}
}

// Under systemd, each engine of a host is a unit of its own, and going
// back to one engine disables and removes those units.
func TestSeveralEnginesAreUnitsOfTheirOwn(t *testing.T) {
	dir := t.TempDir()
	runDir, unitDir := filepath.Join(dir, "run-systemd"), filepath.Join(dir, "units")
	os.MkdirAll(runDir, 0o755)
	os.MkdirAll(unitDir, 0o755)
	fakeSystemctl(t, dir, unitDir)
	home := filepath.Join(dir, "a")
	hosts := &fakeHosts{homes: map[string]string{"a-0": home, "a-1": home, "a": home}}
	f, err := Parse("t.yaml", []byte("apiVersion: evolve/v1\nkind: Cluster\nmetadata: {name: t}\nspec:\n  defaults: {user: u, engine: {profile: tiny}}\n  hosts:\n    - {name: a, address: 127.0.0.1, engines: 2}\n"))
	if err != nil {
		t.Fatal(err)
	}
	opt := UpOptions{Dial: hosts.dial, Binary: fakeBinary(t, dir, "v1"), NATS: "nats://10.0.0.1:4222", Systemd: Systemd{RunDir: runDir, UnitDir: unitDir}}
	ctx := context.Background()
	t.Cleanup(func() { Down(ctx, f, opt) })
	state := filepath.Join(home, ".local/state/evolve/engine")

	if res := Up(ctx, f, opt); res[0].Action != "started" || res[1].Action != "started" {
		t.Fatalf("up: %+v", res)
	}
	st := Status(ctx, f, opt)
	for i, name := range []string{"a-0", "a-1"} {
		unitFile := filepath.Join(unitDir, "evolve-engine-"+name+".service")
		unit, err := os.ReadFile(unitFile)
		if err != nil {
			t.Fatalf("engine %s has no unit of its own: %v", name, err)
		}
		if !strings.Contains(string(unit), "WorkingDirectory="+filepath.Join(state, name)+"\n") || !strings.Contains(string(unit), "engine --id "+name) {
			t.Fatalf("unit of %s:\n%s", name, unit)
		}
		if !st[i].Running || st[i].Service != "systemd "+unitFile {
			t.Fatalf("status of %s: %+v", name, st[i])
		}
	}
	if _, err := os.Stat(filepath.Join(unitDir, "evolve-engine.service")); err == nil {
		t.Fatal("a shared unit name: two engines of a host would replace each other")
	}

	f.Spec.Hosts[0].Engines = 1
	if res := Up(ctx, f, opt); res[0].Action != "started" {
		t.Fatalf("up with one engine: %+v", res)
	}
	for _, name := range []string{"a-0", "a-1"} {
		if _, err := os.Stat(filepath.Join(unitDir, "evolve-engine-"+name+".service")); err == nil {
			t.Errorf("the unit of %s, no longer in the file, is left", name)
		}
		if _, err := os.Stat(filepath.Join(unitDir, "evolve-engine-"+name+".service.pid")); err == nil {
			t.Errorf("the unit of %s still runs", name)
		}
	}
	if st := Status(ctx, f, opt); !st[0].Running || st[0].Service != "systemd "+filepath.Join(unitDir, "evolve-engine.service") {
		t.Fatalf("status of the single engine: %+v", st[0])
	}
}
