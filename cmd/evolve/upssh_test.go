package main

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/evolvellm/evolve/cluster/sshtest"
	"github.com/evolvellm/evolve/controlapi"
	"github.com/evolvellm/evolve/internal/wait"
)

// evolve up -f against real OpenSSH servers standing for hosts (each its
// own host key and directory; one reached through a bastion): engines are installed and started over
// SSH, register with the orchestrator started here, and serve requests
// through the router; a re-run changes nothing; an unreachable host is a
// partial success (exit 3) that names its phase and cause; down removes
// everything.
func TestUpOverSSH(t *testing.T) {
	dir := t.TempDir()
	key, kh, hs := sshHosts(t, dir, 4)
	h1, h2, h3, jump := hs[0], hs[1], hs[2], hs[3]
	free := func() int { return port(t) }
	dead := free() // nothing listens there
	file := filepath.Join(dir, "cluster.yaml")
	ports := []int{free(), free(), free(), free(), free(), free(), free()}
	writeFile := func(extra string) {
		y := fmt.Sprintf(`apiVersion: evolve/v1
kind: Cluster
metadata: {name: lab}
spec:
  orchestrator: {routerPort: %d, controlPort: %d, natsPort: %d, advertise: 127.0.0.1}
  defaults: {user: root, keyPath: %s, engine: {profile: tiny}}
  hosts:
    - {name: gpu-01, address: 127.0.0.1, port: %d, dir: %s/h1, role: prefill, engine: {port: %d}}
    - {name: gpu-02, address: 127.0.0.1, port: %d, dir: %s/h2, engine: {port: %d}}
    - {name: gpu-03, address: 127.0.0.1, port: %d, dir: %s/h3, engine: {port: %d}, bastion: {address: 127.0.0.1, port: %d}}
%s`, ports[0], ports[1], ports[2], key, h1.Port, dir, ports[3], h2.Port, dir, ports[4], h3.Port, dir, ports[6], jump.Port, extra)
		if err := os.WriteFile(file, []byte(y), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	writeFile("")
	env := []string{"XDG_STATE_HOME=" + filepath.Join(dir, "state"), "SSH_AUTH_SOCK=", "EVOLVE_UP_SERVICE=process", // never units on the machine running the tests
		"EVOLVE_UP_MODEL_ALIAS=gpt-4.1,gpt-4o"}
	t.Cleanup(func() { runBinOut(t, env, "down", "-f", file, "--yes", "--known-hosts", kh) })
	if out, code := runBinOut(t, env, "up", "-f", file, "--known-hosts", kh, "--policy", "fastest"); code != 2 || !strings.Contains(out, "--policy") {
		t.Fatalf("up -f with an unknown policy: exit %d\n%s", code, out)
	}

	res, out := upJSON(t, env, file, kh, "up -f")
	if len(res.Hosts) != 3 {
		t.Fatalf("up -f:\n%s", out)
	}
	for _, h := range res.Hosts {
		if h.Action != "started" || h.Upload != "uploaded" || h.Facts.OS != "linux" {
			t.Fatalf("host %+v", h)
		}
	}
	// The cluster serves through its router.
	status, _, body := post(t, res.RouterURL+"/v1/completions", `{"prompt": "hello hosts", "max_tokens": 4}`)
	if status != 200 {
		t.Fatalf("request through the router: %d %v", status, body)
	}
	// evolve up's own flags reach the orchestrator it starts for the file.
	if status, _, body := post(t, res.RouterURL+"/v1/completions", `{"model": "gpt-4o", "prompt": "hello hosts", "max_tokens": 4}`); status != 200 {
		t.Fatalf("request for the alias evolve up was given: %d %v", status, body)
	}
	// The token file is private.
	if fi, err := os.Stat(res.TokenFile); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("token file %s: %v %v", res.TokenFile, fi, err)
	}

	// evolve status -f reads what each host runs, over SSH.
	st, out, code := fileStatusOf(t, env, file, kh)
	if code != 0 || st.Orchestrator != "running" || len(st.Hosts) != 3 || !st.Hosts[0].Running || !strings.HasPrefix(st.Hosts[1].Version, "evolve ") {
		t.Fatalf("status -f: exit %d\n%s", code, out)
	}

	// Re-running converges: nothing uploaded, nothing restarted.
	if res, out = upJSON(t, env, file, kh, "re-run"); res.Hosts[0].Action != "unchanged" || res.Hosts[1].Upload != "unchanged" {
		t.Fatalf("re-run:\n%s", out)
	}

	// A fourth host that does not answer: partial success.
	writeFile(fmt.Sprintf("    - {name: gpu-04, address: 127.0.0.1, port: %d, dir: %s/h4, engine: {port: %d}}\n", dead, dir, ports[5]))
	out, code = runBinOut(t, env, "up", "-f", file, "--known-hosts", kh)
	if code != 3 || !strings.Contains(out, "failed on 1 host:") || !strings.Contains(out, "gpu-04: connect:") || !strings.Contains(out, "debug log") {
		t.Fatalf("unreachable host: exit %d\n%s", code, out)
	}

	// Down stops and removes what up installed.
	out, code = runBinOut(t, env, "down", "-f", file, "--yes", "--known-hosts", kh)
	if code != 3 || !strings.Contains(out, "gpu-01") { // gpu-04 still cannot be reached
		t.Fatalf("down: exit %d\n%s", code, out)
	}
	for _, h := range []string{"h1", "h2", "h3"} {
		if _, err := os.Stat(filepath.Join(dir, h, "bin", "evolve")); err == nil {
			t.Fatalf("%s: the binary is still installed", h)
		}
	}
	if resp, err := http.Post(res.RouterURL+"/v1/completions", "application/json", strings.NewReader(`{"prompt": "x"}`)); err == nil {
		resp.Body.Close()
		t.Fatalf("the router still answers after down: %d", resp.StatusCode)
	}
}

// A host whose key is not known is refused before anything is uploaded.
func TestUpRefusesAnUnknownHostKey(t *testing.T) {
	dir := t.TempDir()
	key := filepath.Join(dir, "id_ed25519")
	h := sshtest.Start(t, sshtest.NewKey(t, key))
	file := filepath.Join(dir, "cluster.yaml")
	os.WriteFile(file, []byte(fmt.Sprintf(`apiVersion: evolve/v1
kind: Cluster
metadata: {name: strict}
spec:
  orchestrator: {routerPort: %d, controlPort: %d, natsPort: %d}
  hosts:
    - {name: gpu-01, address: 127.0.0.1, port: %d, user: root, keyPath: %s, dir: %s/h1, engine: {profile: tiny}}
`, port(t), port(t), port(t), h.Port, key, dir)), 0o600)
	t.Cleanup(func() {
		runBinOut(t, []string{"XDG_STATE_HOME=" + filepath.Join(dir, "state")}, "down", "-f", file, "--yes", "--known-hosts", filepath.Join(dir, "known_hosts"))
	})
	env := []string{"XDG_STATE_HOME=" + filepath.Join(dir, "state"), "SSH_AUTH_SOCK=", "EVOLVE_UP_SERVICE=process"} // never units on the machine running the tests
	out, code := runBinOut(t, env, "up", "-f", file, "--known-hosts", filepath.Join(dir, "known_hosts"))
	if code == 0 || !strings.Contains(out, "host key") || !strings.Contains(out, "--accept-new-host-keys") {
		t.Fatalf("unknown host key: exit %d\n%s", code, out)
	}
	if _, err := os.Stat(filepath.Join(dir, "h1", "bin", "evolve")); err == nil {
		t.Fatal("a binary was uploaded to a host whose key was not checked")
	}
}

type upResult struct {
	RouterURL    string `json:"router_url"`
	Orchestrator struct {
		Host   string `json:"host"`
		Action string `json:"action"`
	} `json:"orchestrator"`
	Orchestrators []fileOrchestrator `json:"orchestrators"`
	TokenFile     string             `json:"control_token_file"`
	Hosts         []struct {
		Host   string `json:"host"`
		Action string `json:"action"`
		Upload string `json:"upload"`
		Facts  struct {
			OS string `json:"os"`
		} `json:"facts"`
	} `json:"hosts"`
}

// lastJSON is the JSON object at the end of out (progress lines come first).
// fileStatus is what evolve status -f -o json says.
type fileStatus struct {
	Orchestrator string `json:"orchestrator"`
	Hosts        []struct {
		Host    string `json:"host"`
		Running bool   `json:"running"`
		Version string `json:"version"`
	} `json:"hosts"`
}

// fileStatusOf runs evolve status -f on a cluster file; a status it cannot
// read fails the test.
func fileStatusOf(t *testing.T, env []string, file, knownHosts string) (fileStatus, string, int) {
	t.Helper()
	out, code := runBinOut(t, env, "status", "-f", file, "--known-hosts", knownHosts, "-o", "json")
	var st fileStatus
	if err := json.Unmarshal([]byte(lastJSON(out)), &st); err != nil {
		t.Fatalf("status -f: exit %d, %v\n%s", code, err, out)
	}
	return st, out, code
}

// sshHosts starts n SSH servers that trust one new key, kept in dir: it
// returns the key's file, a known_hosts file that names them all, and
// the servers.
func sshHosts(t *testing.T, dir string, n int) (key, knownHosts string, hosts []*sshtest.Server) {
	t.Helper()
	key = filepath.Join(dir, "id_ed25519")
	pub := sshtest.NewKey(t, key)
	var lines strings.Builder
	for range n {
		h := sshtest.Start(t, pub)
		hosts = append(hosts, h)
		lines.WriteString(h.KnownHostsLine() + "\n")
	}
	knownHosts = filepath.Join(dir, "known_hosts")
	if err := os.WriteFile(knownHosts, []byte(lines.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return key, knownHosts, hosts
}

// upJSON runs evolve up -f file -o json and returns its result and its
// output; what names the run in the failure it reports when up fails or
// prints no result.
func upJSON(t *testing.T, env []string, file, kh, what string) (upResult, string) {
	t.Helper()
	out, code := runBinOut(t, env, "up", "-f", file, "--known-hosts", kh, "-o", "json")
	var res upResult
	if code != 0 || json.Unmarshal([]byte(lastJSON(out)), &res) != nil {
		t.Fatalf("%s: exit %d\n%s", what, code, out)
	}
	return res, out
}

func lastJSON(out string) string {
	if i := strings.Index(out, "\n{"); i >= 0 {
		return out[i+1:]
	}
	return out
}

func port(t *testing.T) int {
	_, p, _ := net.SplitHostPort(freePort(t))
	n, _ := strconv.Atoi(p)
	return n
}

// A vllm host over real SSH: evolve up installs the agent, which starts
// the host's vLLM (here a stand-in: this test binary) with the engine's
// environment; the engine serves chat through the router; down stops the
// agent and, through it, vLLM.
func TestUpVLLMHostOverSSH(t *testing.T) {
	dir := t.TempDir()
	key, kh, hs := sshHosts(t, dir, 1)
	h := hs[0]
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	enginePort := port(t)
	file := filepath.Join(dir, "cluster.yaml")
	os.WriteFile(file, []byte(fmt.Sprintf(`apiVersion: evolve/v1
kind: Cluster
metadata: {name: vllm-lab}
spec:
  orchestrator: {routerPort: %d, controlPort: %d, natsPort: %d, advertise: 127.0.0.1}
  hosts:
    - name: gpu-01
      address: 127.0.0.1
      port: %d
      user: root
      keyPath: %s
      dir: %s/h1
      gpus: 1
      engine:
        backend: vllm
        port: %d
        kvEventsPort: %d
        kvReplayPort: %d
        nixlPort: %d
        command: [%s, serve]
        args: [fake/model, --served-model-name, fake/model]
        env: {EVOLVE_TEST_FAKE_VLLM: "1"}
`, port(t), port(t), port(t), h.Port, key, dir, enginePort, port(t), port(t), port(t), exe)), 0o600)
	env := []string{"XDG_STATE_HOME=" + filepath.Join(dir, "state"), "SSH_AUTH_SOCK=", "EVOLVE_UP_SERVICE=process"} // never units on the machine running the tests
	t.Cleanup(func() { runBinOut(t, env, "down", "-f", file, "--yes", "--known-hosts", kh) })

	res, out := upJSON(t, env, file, kh, "up -f")
	if len(res.Hosts) != 1 || res.Hosts[0].Action != "started" {
		t.Fatalf("up -f:\n%s", out)
	}
	status, _, body := post(t, res.RouterURL+"/v1/chat/completions", map[string]any{"model": "fake/model", "max_tokens": 3,
		"messages": []map[string]string{{"role": "user", "content": "hello from the other side of SSH"}}})
	if status != 200 || len(body["choices"].([]any)) != 1 {
		t.Fatalf("chat through the router: %d %v", status, body)
	}
	if out, code := runBinOut(t, env, "down", "-f", file, "--yes", "--known-hosts", kh); code != 0 {
		t.Fatalf("down: exit %d\n%s", code, out)
	}
	wait.Until(t, 15e9, "vLLM stopped with its agent", func() bool {
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", enginePort))
		if err == nil {
			c.Close()
		}
		return err != nil
	})
}

// Ctrl-C while a host hangs in its SSH handshake cuts the bring-up short,
// not the process: the summary names the host that did not finish and how
// to go on, the host that finished serves, and down -f removes it all.
func TestUpFileInterruptedSaysWhereEachHostStands(t *testing.T) {
	dir := t.TempDir()
	key, kh, hs := sshHosts(t, dir, 1)
	h1 := hs[0]
	// gpu-02 accepts the connection and never speaks.
	mute, stopMute := sshtest.StartMute(t)
	defer stopMute() // before the cleanup's down -f, which would wait for it
	enginePort := port(t)
	file := filepath.Join(dir, "cluster.yaml")
	os.WriteFile(file, []byte(fmt.Sprintf(`apiVersion: evolve/v1
kind: Cluster
metadata: {name: cut}
spec:
  orchestrator: {routerPort: %d, controlPort: %d, natsPort: %d, advertise: 127.0.0.1}
  defaults: {user: root, keyPath: %s, engine: {profile: tiny}}
  hosts:
    - {name: gpu-01, address: 127.0.0.1, port: %d, dir: %s/h1, engine: {port: %d}}
    - {name: gpu-02, address: 127.0.0.1, port: %d, dir: %s/h2, engine: {port: %d}}
`, port(t), port(t), port(t), key, h1.Port, dir, enginePort, mute, dir, port(t))), 0o600)
	env := []string{"XDG_STATE_HOME=" + filepath.Join(dir, "state"), "SSH_AUTH_SOCK=", "EVOLVE_UP_SERVICE=process"}
	t.Cleanup(func() { runBinOut(t, env, "down", "-f", file, "--yes", "--known-hosts", kh) })

	// --ssh-timeout: gpu-02's handshake would give up only after an hour.
	cmd, out := startBin(t, env, "up", "-f", file, "--known-hosts", kh, "--ssh-timeout", "1h")
	// Interrupt once gpu-01's engine serves in the cluster; gpu-02 is
	// still in its handshake.
	started := time.Now()
	for !serving(t, filepath.Join(dir, "state", "evolve", "clusters", "cut", "state.json"), "gpu-01") {
		if time.Since(started) > 60*time.Second {
			t.Fatalf("gpu-01's engine never served:\n%s", out.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	interrupt(t, cmd, out)
	s := out.String()
	for _, want := range []string{"interrupted: 1 of 2 hosts did not finish", "gpu-02: interrupted at connect", "serving: gpu-01", "evolve up -f " + file + "' again", "evolve down -f " + file} {
		if !strings.Contains(s, want) {
			t.Fatalf("no %q in what up -f said:\n%s", want, s)
		}
	}
	if cmd.ProcessState.ExitCode() != 1 {
		t.Fatalf("exit %d after Ctrl-C, want 1:\n%s", cmd.ProcessState.ExitCode(), s)
	}
	// What finished stays up, and down -f finds it.
	if resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/health", enginePort)); err != nil {
		t.Fatalf("gpu-01 stopped serving: %v", err)
	} else {
		resp.Body.Close()
	}

	// down -f, interrupted in turn while gpu-02 hangs: gpu-01 is stopped,
	// and the orchestrator stays for what may still run.
	down, downOut := startBin(t, env, "down", "-f", file, "--yes", "--known-hosts", kh, "--ssh-timeout", "1h")
	for started := time.Now(); !regexp.MustCompile(`(?m)^gpu-01 +start stopped$`).MatchString(downOut.String()); {
		if time.Since(started) > 60*time.Second {
			t.Fatalf("down -f never stopped gpu-01:\n%s", downOut.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	interrupt(t, down, downOut)
	s = downOut.String()
	for _, want := range []string{"interrupted: 1 of 2 hosts not stopped", "gpu-02: interrupted at connect", "the orchestrator still runs", "evolve down -f " + file + "' again"} {
		if !strings.Contains(s, want) {
			t.Fatalf("no %q in what down -f said:\n%s", want, s)
		}
	}
	if down.ProcessState.ExitCode() != 1 {
		t.Fatalf("down -f: exit %d after Ctrl-C, want 1:\n%s", down.ProcessState.ExitCode(), s)
	}
	if _, err := os.Stat(filepath.Join(dir, "state", "evolve", "clusters", "cut", "state.json")); err != nil {
		t.Fatalf("an interrupted down -f forgot the orchestrator: %v", err)
	}
	// --ssh-timeout bounds the wait for the mute host.
	o, code := runBinOut(t, env, "status", "-f", file, "--known-hosts", kh, "--ssh-timeout", "500ms")
	if code == 0 || !strings.Contains(o, "no SSH handshake from 127.0.0.1:") || !strings.Contains(o, "within 500ms") {
		t.Fatalf("status -f --ssh-timeout 500ms: exit %d\n%s", code, o)
	}
}

// serving reports whether the orchestrator of the cluster whose state file
// is at path has node id serving.
func serving(t *testing.T, path, id string) bool {
	var st fileClusterState
	if b, err := os.ReadFile(path); err != nil || json.Unmarshal(b, &st) != nil {
		return false
	}
	var nodes []struct{ ID, State string }
	c := &controlapi.Client{Base: st.ControlURL, Token: st.ControlToken, HTTP: http.DefaultClient}
	if c.Do(t.Context(), "GET", "/api/v1/nodes", nil, &nodes) != nil {
		return false
	}
	for _, n := range nodes {
		if n.ID == id && n.State == "serving" {
			return true
		}
	}
	return false
}

// startBin starts the evolve binary with env added; what it prints is
// read while it runs, and it is killed at the test's end if still there.
func startBin(t *testing.T, env []string, args ...string) (*exec.Cmd, *lockedLog) {
	t.Helper()
	cmd := exec.Command(evolveBin, args...)
	cmd.Env = append(os.Environ(), env...)
	out := &lockedLog{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill() })
	return cmd, out
}

// interrupt sends cmd (started by startBin) a Ctrl-C and waits for it to
// exit; out is shown if it does not within 30 s.
func interrupt(t *testing.T, cmd *exec.Cmd, out *lockedLog) {
	t.Helper()
	signalAndWait(t, cmd, os.Interrupt, out)
}

// signalAndWait sends cmd sig and waits for it to exit; out is shown if
// it does not within 30 s.
func signalAndWait(t *testing.T, cmd *exec.Cmd, sig os.Signal, out *lockedLog) {
	t.Helper()
	cmd.Process.Signal(sig)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not exit within 30 s of %v:\n%s", strings.Join(cmd.Args, " "), sig, out.String())
	}
}
