package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/evolvellm/evolve/internal/wait"
)

// spec.orchestrator.host names a host of the cluster: evolve up runs the
// orchestrator there as a supervised service, the engines join its event
// plane, requests go through its router; a re-run leaves it alone; status
// reads it over SSH; down stops it and removes its files.
func TestUpRunsTheOrchestratorOnAHost(t *testing.T) {
	dir := t.TempDir()
	key, kh, hs := sshHosts(t, dir, 2)
	h1, h2 := hs[0], hs[1]
	// The host's certificate (for its address), which the operator's
	// machine trusts as a private CA's.
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	writeCert(t, certFile, keyFile, 1)
	pool := x509.NewCertPool()
	pem, _ := os.ReadFile(certFile)
	pool.AppendCertsFromPEM(pem)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	file := filepath.Join(dir, "cluster.yaml")
	os.WriteFile(file, []byte(fmt.Sprintf(`apiVersion: evolve/v1
kind: Cluster
metadata: {name: remote-orch}
spec:
  orchestrator: {host: gpu-01, routerPort: %d, controlPort: %d, natsPort: %d, modelAliases: [gpt-4o], tls: {certFile: %s, keyFile: %s}}
  defaults: {user: root, keyPath: %s, engine: {profile: tiny, env: {SSL_CERT_FILE: %s}}}
  hosts:
    - {name: gpu-01, address: 127.0.0.1, port: %d, dir: %s/h1, role: prefill, engine: {port: %d}}
    - {name: gpu-02, address: 127.0.0.1, port: %d, dir: %s/h2, engine: {port: %d}}
`, port(t), port(t), port(t), certFile, keyFile, key, certFile, h1.Port, dir, port(t), h2.Port, dir, port(t))), 0o600)
	env := []string{"XDG_STATE_HOME=" + filepath.Join(dir, "state"), "SSH_AUTH_SOCK=", "EVOLVE_UP_SERVICE=process", // never units on the machine running the tests
		"EVOLVE_UP_API_KEY=sk-remote-1,sk-remote-2", "EVOLVE_UP_POLICY=round-robin", "SSL_CERT_FILE=" + certFile}
	t.Cleanup(func() { runBinOut(t, env, "down", "-f", file, "--yes", "--known-hosts", kh) })

	res, out := upJSON(t, env, file, kh, "up -f")
	if len(res.Hosts) != 2 || res.Orchestrator.Host != "gpu-01" || res.Orchestrator.Action != "started" {
		t.Fatalf("up -f:\n%s", out)
	}
	// The orchestrator's files live on the host; its script is private.
	if fi, err := os.Stat(filepath.Join(dir, "h1", "orchestrator", "run.sh")); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("the orchestrator's service script on gpu-01: %v %v", fi, err)
	}
	// The router listens on every interface, over HTTPS with the file's
	// certificate, behind the keys given, and takes the file's model alias.
	if !strings.HasPrefix(res.RouterURL, "https://") {
		t.Fatalf("router %s: want HTTPS", res.RouterURL)
	}
	if resp, err := client.Post(res.RouterURL+"/v1/completions", "application/json", strings.NewReader(`{"prompt": "hello from afar", "max_tokens": 4}`)); err != nil || resp.StatusCode != 401 {
		t.Fatalf("request without a key through the host's router: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	req, _ := http.NewRequest("POST", res.RouterURL+"/v1/completions", strings.NewReader(`{"model": "gpt-4o", "prompt": "hello from afar", "max_tokens": 4}`))
	req.Header.Set("Authorization", "Bearer sk-remote-2")
	if resp, err := client.Do(req); err != nil || resp.StatusCode != 200 {
		t.Fatalf("request with a key through the host's router: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	// The control API is on the host, behind the cluster's token.
	var st fileClusterState
	b, _ := os.ReadFile(res.TokenFile)
	json.Unmarshal(b, &st)
	if st.OrchHost != "gpu-01" || st.Orchestrator != 0 || st.ControlToken == "" {
		t.Fatalf("local state %+v", st)
	}
	// The engines joined the event plane over TLS, trusting the
	// certificate through the environment the file gives them.
	if !strings.HasPrefix(st.NATSURL, "tls://127.0.0.1:") {
		t.Fatalf("event plane %s: want TLS", st.NATSURL)
	}
	out, code := runBinOut(t, env, "nodes", "--server", st.ControlURL, "--token", st.ControlToken, "-o", "json")
	if code != 0 || !strings.Contains(out, "gpu-02") {
		t.Fatalf("nodes through the host's control API: exit %d\n%s", code, out)
	}
	if _, code = runBinOut(t, env, "nodes", "--server", st.ControlURL, "-o", "json"); code == 0 {
		t.Fatal("the host's control API answered without the token")
	}
	// The hosts' logs, over SSH: an engine's, the orchestrator's, and the
	// orchestrator's followed as it writes.
	if out, code = runBinOut(t, env, "logs", "gpu-02", "-f", file, "--known-hosts", kh, "--tail", "20", "-o", "json"); code != 0 || !strings.Contains(out, `"msg":"engine ready"`) {
		t.Fatalf("logs gpu-02 -f: exit %d\n%s", code, out)
	}
	if st.NATSToken == "" || strings.Contains(out, st.NATSToken) {
		t.Fatalf("the engine's log shows the event plane's token %q:\n%s", st.NATSToken, out)
	}
	if out, code = runBinOut(t, env, "logs", "gpu-03", "-f", file, "--known-hosts", kh); code != 2 || !strings.Contains(out, "orchestrator, gpu-01, gpu-02") {
		t.Fatalf("logs of no host: exit %d\n%s", code, out)
	}
	lines, stop, _ := followLog(t, env, "orchestrator", "-f", file, "--known-hosts", kh, "--tail", "-1")
	waitLine(t, lines, " INFO  orchestrator ready  router_url=https://")
	if out, code := runBinOut(t, env, "role", "set", "gpu-02", "prefill", "--server", st.ControlURL, "--token", st.ControlToken); code != 0 {
		t.Fatalf("role set: exit %d\n%s", code, out)
	}
	waitLine(t, lines, " INFO  role switched  ")
	if err := stop(); err != nil {
		t.Fatalf("logs --follow over SSH after Ctrl-C: %v", err)
	}
	// The operator's routing policy reached the host's orchestrator.
	creq, _ := http.NewRequest("GET", st.ControlURL+"/api/v1/cluster", nil)
	creq.Header.Set("Authorization", "Bearer "+st.ControlToken)
	var cs struct {
		Policy string `json:"policy"`
	}
	if !strings.HasPrefix(st.ControlURL, "https://") {
		t.Fatalf("control API %s: want HTTPS off loopback", st.ControlURL)
	}
	if resp, err := client.Do(creq); err != nil || json.NewDecoder(resp.Body).Decode(&cs) != nil || cs.Policy != "round-robin" {
		t.Fatalf("the host's orchestrator routes with %q, want round-robin (%v)", cs.Policy, err)
	} else {
		resp.Body.Close()
	}

	// A re-run leaves everything alone.
	if res, out = upJSON(t, env, file, kh, "re-run"); res.Hosts[0].Action != "unchanged" || res.Orchestrator.Action != "unchanged" {
		t.Fatalf("re-run:\n%s", out)
	}
	// A re-run with other keys rotates them with no restart: the keys
	// are in a private file on the host that the orchestrator reads
	// again, never on its command line.
	if fi, err := os.Stat(filepath.Join(dir, "h1", "orchestrator", "api-keys")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the orchestrator's key file on gpu-01: %v %v", fi, err)
	}
	rotated := append(slices.Clone(env), "EVOLVE_UP_API_KEY=sk-remote-2,team-c sk-remote-3")
	if res, out = upJSON(t, rotated, file, kh, "re-run with other keys"); res.Orchestrator.Action != "unchanged" {
		t.Fatalf("re-run with other keys:\n%s", out)
	}
	withKey := func(key string) int { return statusOf(t, client, "GET", res.RouterURL+"/v1/models", "Bearer "+key) }
	wait.Until(t, 10*time.Second, "sk-remote-3 taken and sk-remote-1 refused", func() bool {
		return withKey("sk-remote-3") == 200 && withKey("sk-remote-1") == 401
	})
	if withKey("sk-remote-2") != 200 {
		t.Fatal("the key kept across the rotation is refused")
	}
	env = rotated
	out, code = runBinOut(t, env, "status", "-f", file, "--known-hosts", kh, "-o", "json")
	if code != 0 || !strings.Contains(out, `"orchestrator": "running on host gpu-01"`) {
		t.Fatalf("status -f: exit %d\n%s", code, out)
	}

	out, code = runBinOut(t, env, "down", "-f", file, "--yes", "--known-hosts", kh)
	if code != 0 {
		t.Fatalf("down: exit %d\n%s", code, out)
	}
	if _, err := os.Stat(filepath.Join(dir, "h1")); err == nil {
		entries, _ := os.ReadDir(filepath.Join(dir, "h1"))
		t.Fatalf("gpu-01 keeps %v after down", entries)
	}
	if resp, err := client.Post(res.RouterURL+"/v1/completions", "application/json", strings.NewReader(`{"prompt": "x"}`)); err == nil {
		resp.Body.Close()
		t.Fatalf("the host's router still answers after down: %d", resp.StatusCode)
	}
}

// An orchestrator host that cannot be reached fails the bring-up at once,
// naming the host and the phase: no engine is installed without it.
func TestUpFailsWhenTheOrchestratorHostIsDown(t *testing.T) {
	dir := t.TempDir()
	key, kh, hs := sshHosts(t, dir, 1)
	h := hs[0]
	file := filepath.Join(dir, "cluster.yaml")
	os.WriteFile(file, []byte(fmt.Sprintf(`apiVersion: evolve/v1
kind: Cluster
metadata: {name: headless}
spec:
  orchestrator: {host: brain, routerPort: %d, controlPort: %d, natsPort: %d}
  defaults: {user: root, keyPath: %s, engine: {profile: tiny}}
  hosts:
    - {name: brain, address: 127.0.0.1, port: %d, dir: %s/brain}
    - {name: gpu-01, address: 127.0.0.1, port: %d, dir: %s/h1, engine: {port: %d}}
`, port(t), port(t), port(t), key, port(t), dir, h.Port, dir, port(t))), 0o600)
	env := []string{"XDG_STATE_HOME=" + filepath.Join(dir, "state"), "SSH_AUTH_SOCK=", "EVOLVE_UP_SERVICE=process"} // never units on the machine running the tests
	out, code := runBinOut(t, env, "up", "-f", file, "--known-hosts", kh)
	if code == 0 || !strings.Contains(out, "the orchestrator on host brain failed at connect") {
		t.Fatalf("up with the orchestrator's host down: exit %d\n%s", code, out)
	}
	if _, err := os.Stat(filepath.Join(dir, "h1", "bin", "evolve")); err == nil {
		t.Fatal("an engine was installed though the orchestrator could not start")
	}
}

// spec.orchestrator.hosts runs an orchestrator on each of three hosts
// (each with ports of its own: they share this machine): up starts them
// together as one NATS cluster, every router serves, one leads; killed
// with -9, the leader's supervisor restarts it while another leads; the
// engines follow whichever serves; status, logs and down cover each.
func TestUpRunsOrchestratorsOnThreeHosts(t *testing.T) {
	dir := t.TempDir()
	key, kh, hs := sshHosts(t, dir, 3)
	var hosts strings.Builder
	for i, h := range hs {
		fmt.Fprintf(&hosts, "    - {name: gpu-0%d, address: 127.0.0.1, port: %d, dir: %s/h%d, engine: {port: %d}, orchestrator: {routerPort: %d, controlPort: %d, natsPort: %d, clusterPort: %d}}\n",
			i+1, h.Port, dir, i+1, port(t), port(t), port(t), port(t), port(t))
	}
	file := filepath.Join(dir, "cluster.yaml")
	os.WriteFile(file, []byte(fmt.Sprintf(`apiVersion: evolve/v1
kind: Cluster
metadata: {name: trio}
spec:
  orchestrator: {hosts: [gpu-01, gpu-02, gpu-03]}
  defaults: {user: root, keyPath: %s, engine: {profile: tiny}}
  hosts:
%s`, key, hosts.String())), 0o600)
	env := []string{"XDG_STATE_HOME=" + filepath.Join(dir, "state"), "SSH_AUTH_SOCK=", "EVOLVE_UP_SERVICE=process"} // never units on the machine running the tests
	t.Cleanup(func() { runBinOut(t, env, "down", "-f", file, "--yes", "--known-hosts", kh) })

	if out, code := runBinOut(t, env, "up", "-f", file, "--known-hosts", kh, "--dry-run"); code != 0 || !strings.Contains(out, "start orchestrator gpu-02, one of 3") {
		t.Fatalf("dry run: exit %d\n%s", code, out)
	}
	res, out := upJSON(t, env, file, kh, "up -f")
	if len(res.Hosts) != 3 || len(res.Orchestrators) != 3 {
		t.Fatalf("up -f: want 3 hosts and 3 orchestrators\n%s", out)
	}
	for _, o := range res.Orchestrators {
		if o.Action != "started" || o.RouterURL == "" {
			t.Fatalf("orchestrator %+v\n%s", o, out)
		}
		if code, _, body := post(t, o.RouterURL+"/v1/completions", `{"prompt": "hello trio", "max_tokens": 4}`); code != 200 {
			t.Fatalf("a request through the router on %s: %d %v", o.Host, code, body)
		}
	}
	var st fileClusterState
	b, _ := os.ReadFile(res.TokenFile)
	json.Unmarshal(b, &st)
	if n := strings.Count(st.NATSURL, "nats://127.0.0.1:"); n != 3 {
		t.Fatalf("the engines are given %q: want the three orchestrators' event plane", st.NATSURL)
	}
	status := func(o fileOrchestrator) (s struct {
		Leader        string `json:"leader"`
		Orchestrators []struct {
			Name      string `json:"name"`
			NATSPeers int    `json:"nats_peers"`
			Leader    bool   `json:"leader"`
			Term      uint64 `json:"term"`
		} `json:"orchestrators"`
	}) {
		out, code := runBinOut(t, env, "status", "--server", o.ControlURL, "--token", st.ControlToken, "-o", "json")
		if code == 0 {
			json.Unmarshal([]byte(out), &s)
		}
		return s
	}
	byHost := map[string]fileOrchestrator{}
	for _, o := range res.Orchestrators {
		byHost[o.Host] = o
	}
	var leader string
	var term uint64
	wait.Until(t, 20*time.Second, "three orchestrators named after their hosts, each with two NATS peers, and a leader", func() bool {
		s := status(res.Orchestrators[0])
		peers := 0
		for _, o := range s.Orchestrators {
			if _, ok := byHost[o.Name]; ok && o.NATSPeers == 2 {
				peers++
			}
			if o.Leader {
				term = o.Term
			}
		}
		leader = s.Leader
		return peers == 3 && leader != "" && term > 0
	})

	// Prometheus is told of every router, each at its host's address
	// (they listen on every interface: the NATS routes say where).
	out, code := runBinOut(t, env, "monitoring", "scrape", "-o", "json", "--server", res.Orchestrators[0].ControlURL, "--token", st.ControlToken)
	for _, o := range res.Orchestrators {
		if code != 0 || !strings.Contains(out, `"`+strings.TrimPrefix(o.RouterURL, "http://")+`"`) {
			t.Fatalf("monitoring scrape lacks the router on %s (%s): exit %d\n%s", o.Host, o.RouterURL, code, out)
		}
	}

	// The leader killed -9: a new term begins within 10 s (another
	// orchestrator's, or the killed one's, restarted by its supervisor a
	// second later, which takes its own lease back), and the others'
	// routers serve throughout.
	pid, _ := os.ReadFile(filepath.Join(dir, "h"+strings.TrimPrefix(leader, "gpu-0"), "orchestrator", "child.pid"))
	var p int
	if _, err := fmt.Sscan(string(pid), &p); err != nil || syscall.Kill(p, syscall.SIGKILL) != nil {
		t.Fatalf("the leader %s's pid %q: %v", leader, pid, err)
	}
	var other fileOrchestrator
	for _, o := range res.Orchestrators {
		if o.Host != leader {
			other = o
		}
	}
	killed := time.Now()
	wait.Until(t, 10*time.Second, "a new leadership term", func() bool {
		for _, o := range status(other).Orchestrators {
			if o.Leader && o.Term > term {
				t.Logf("%s leads in term %d (was %s in %d), %v after the kill", o.Name, o.Term, leader, term, time.Since(killed).Round(100*time.Millisecond))
				return true
			}
		}
		return false
	})
	if code, _, body := post(t, other.RouterURL+"/v1/completions", `{"prompt": "still there?", "max_tokens": 4}`); code != 200 {
		t.Fatalf("a request through %s after the leader died: %d %v", other.Host, code, body)
	}
	wait.Until(t, 30*time.Second, "the killed orchestrator restarted by its supervisor, serving again", func() bool {
		// Refused until it listens again: asked without failing the test.
		resp, err := http.Post(byHost[leader].RouterURL+"/v1/completions", "application/json", strings.NewReader(`{"prompt": "back?", "max_tokens": 2}`))
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200 && len(status(byHost[leader]).Orchestrators) == 3
	})

	// status -f says each runs; logs reads one's; a re-run changes nothing.
	out, code = runBinOut(t, env, "status", "-f", file, "--known-hosts", kh, "-o", "json")
	if code != 0 || !strings.Contains(out, `"orchestrator": "3 of 3 running"`) || strings.Count(out, `"state": "running"`) != 3 {
		t.Fatalf("status -f: exit %d\n%s", code, out)
	}
	if out, code := runBinOut(t, env, "logs", "orchestrator@gpu-02", "-f", file, "--known-hosts", kh, "--tail", "-1", "-o", "json"); code != 0 || !strings.Contains(out, `"msg":"orchestrator ready"`) {
		t.Fatalf("logs orchestrator@gpu-02: exit %d\n%s", code, out)
	}
	if out, code := runBinOut(t, env, "logs", "orchestrator", "-f", file, "--known-hosts", kh); code != 2 || !strings.Contains(out, "orchestrator@gpu-01, orchestrator@gpu-02, orchestrator@gpu-03, gpu-01") {
		t.Fatalf("logs orchestrator of three: exit %d\n%s", code, out)
	}
	if res, out = upJSON(t, env, file, kh, "re-run"); res.Orchestrators[1].Action != "unchanged" || res.Hosts[2].Action != "unchanged" {
		t.Fatalf("re-run:\n%s", out)
	}

	// No engine lost the event plane for good on the way (an engine whose
	// NATS client gave up after authorization errors while the killed
	// orchestrator's server was gone stayed down).
	for i := range hs {
		if b, _ := os.ReadFile(filepath.Join(dir, fmt.Sprintf("h%d", i+1), "engine.log")); strings.Contains(string(b), "connection closed") {
			t.Fatalf("gpu-0%d's engine lost its NATS connection:\n%s", i+1, b)
		}
	}
	if out, code := runBinOut(t, env, "down", "-f", file, "--yes", "--known-hosts", kh); code != 0 {
		t.Fatalf("down: exit %d\n%s", code, out)
	}
	for _, o := range res.Orchestrators {
		if resp, err := http.Get(o.RouterURL + "/health"); err == nil {
			resp.Body.Close()
			t.Errorf("the router on %s still answers after down", o.Host)
		}
	}
}
