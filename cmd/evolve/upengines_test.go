package main

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// twoFreePorts returns a port p such that p and p+1 are free now.
func twoFreePorts(t *testing.T) int {
	for range 50 {
		p := port(t)
		if l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p+1)); err == nil {
			l.Close()
			return p
		}
	}
	t.Fatal("no two free ports in a row")
	return 0
}

// A host of two engines over real SSH: evolve up -f installs both, each
// registers with the orchestrator under its own name and port and serves;
// status, logs and down take them one by one.
func TestUpRunsSeveralEnginesOnAHostOverSSH(t *testing.T) {
	dir := t.TempDir()
	key, kh, hs := sshHosts(t, dir, 1)
	h := hs[0]
	file := filepath.Join(dir, "cluster.yaml")
	engine := twoFreePorts(t)
	os.WriteFile(file, []byte(fmt.Sprintf(`apiVersion: evolve/v1
kind: Cluster
metadata: {name: pair}
spec:
  orchestrator: {routerPort: %d, controlPort: %d, natsPort: %d, advertise: 127.0.0.1}
  defaults: {user: root, keyPath: %s, engine: {profile: tiny}}
  hosts:
    - {name: gpu, address: 127.0.0.1, port: %d, dir: %s/h, engines: 2, engine: {port: %d}}
`, port(t), port(t), port(t), key, h.Port, dir, engine)), 0o600)
	env := []string{"XDG_STATE_HOME=" + filepath.Join(dir, "state"), "SSH_AUTH_SOCK=", "EVOLVE_UP_SERVICE=process"}
	t.Cleanup(func() { runBinOut(t, env, "down", "-f", file, "--yes", "--known-hosts", kh) })

	if out, code := runBinOut(t, env, "up", "-f", file, "--dry-run"); code != 0 || !strings.Contains(out, "cluster pair, 1 host, 2 engines, valid") ||
		!strings.Contains(out, "gpu: 2 engines (root@127.0.0.1:") || !strings.Contains(out, fmt.Sprintf("engine 1: port %d", engine+1)) || !strings.Contains(out, "start each engine on its port") {
		t.Fatalf("up --dry-run: exit %d\n%s", code, out)
	}
	res, out := upJSON(t, env, file, kh, "up -f")
	if len(res.Hosts) != 2 {
		t.Fatalf("up -f:\n%s", out)
	}
	for i, r := range res.Hosts {
		if r.Host != fmt.Sprintf("gpu-%d", i) || r.Action != "started" {
			t.Fatalf("engine %d: %+v", i, r)
		}
	}
	state := filepath.Join(dir, "state", "evolve", "clusters", "pair", "state.json")
	for i := range 2 {
		if id := fmt.Sprintf("gpu-%d", i); !serving(t, state, id) {
			t.Fatalf("%s is not serving", id)
		}
	}
	// Each engine listens on its own port, as its own process.
	for _, p := range []int{engine, engine + 1} {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/health", p))
		if err != nil {
			t.Fatalf("engine port %d: %v", p, err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("engine port %d: %s", p, resp.Status)
		}
	}
	if status, _, body := post(t, res.RouterURL+"/v1/completions", `{"prompt": "hello engines", "max_tokens": 4}`); status != 200 {
		t.Fatalf("request through the router: %d %v", status, body)
	}

	st, out, code := fileStatusOf(t, env, file, kh)
	if code != 0 || len(st.Hosts) != 2 || !st.Hosts[0].Running || !st.Hosts[1].Running || st.Hosts[1].Host != "gpu-1" {
		t.Fatalf("status -f: exit %d\n%s", code, out)
	}
	if out, code = runBinOut(t, env, "logs", "-f", file, "--known-hosts", kh, "gpu-1", "--tail", "-1"); code != 0 || !strings.Contains(out, "gpu-1") {
		t.Fatalf("logs of gpu-1: exit %d\n%s", code, out)
	}
	if out, code = runBinOut(t, env, "logs", "-f", file, "--known-hosts", kh, "gpu"); code == 0 || !strings.Contains(out, "gpu-0, gpu-1") {
		t.Fatalf("logs of the host's name: exit %d\n%s", code, out)
	}

	if out, code = runBinOut(t, env, "down", "-f", file, "--yes", "--known-hosts", kh); code != 0 {
		t.Fatalf("down: exit %d\n%s", code, out)
	}
	if _, err := os.Stat(filepath.Join(dir, "h")); err == nil {
		left, _ := filepath.Glob(filepath.Join(dir, "h", "*"))
		t.Fatalf("down left the host's folder: %v", left)
	}
}
