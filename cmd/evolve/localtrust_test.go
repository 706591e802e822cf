package main

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/evolvellm/evolve/cluster"
	"github.com/evolvellm/evolve/internal/wait"
	"github.com/nats-io/nats.go"
)

// A local cluster is not open to every local process (issue #56: without
// a token on loopback, any process drained an engine and registered a
// fake engine that received users' prompts; engines served anyone who
// found their port). evolve up gives it an event-plane token and a control
// token, in files of its state directory only the user may read: a
// process without them cannot join the event plane (to register an
// engine, or command one), use the control API (to drain a node), or use
// an engine's port; the user's commands work as before.
func TestLocalClusterIsNotOpenToOtherLocalProcesses(t *testing.T) {
	c := upCluster(t, "--engines", "2", "--prefill", "1")
	secret := func(path string) string {
		t.Helper()
		fi, err := os.Stat(path)
		if err != nil || fi.Mode().Perm() != 0o600 || filepath.Dir(path) != filepath.Dir(cluster.LocalStatePath(filepath.Dir(c.state.LogDir))) {
			t.Fatalf("token file %q: %v %v, want mode 0600 in the state directory", path, fi, err)
		}
		b, _ := os.ReadFile(path)
		return strings.TrimSpace(string(b))
	}
	natsToken, controlToken := secret(c.state.NATSTokenFile), secret(c.state.ControlTokenFile)

	// The event plane: no engine joins it, and no one commands an engine
	// on it, without the token.
	if nc, err := nats.Connect(c.state.NATSURL, nats.MaxReconnects(0)); err == nil {
		nc.Close()
		t.Fatal("a NATS client without the token joined the local cluster's event plane")
	}
	nc, err := nats.Connect(c.state.NATSURL, nats.Token(natsToken), nats.MaxReconnects(0))
	if err != nil {
		t.Fatalf("the event plane refused its own token: %v", err)
	}
	nc.Close()

	// The control API: no drain (a role change) without the token.
	stranger := &http.Client{Timeout: 10 * time.Second}
	req, _ := http.NewRequest("POST", c.state.ControlURL+"/api/v1/nodes/engine-1/role", strings.NewReader(`{"role": "prefill"}`))
	resp, err := stranger.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Fatalf("a role change without the control token: %d, want 401", resp.StatusCode)
	}
	if s := statusOf(t, stranger, "GET", c.state.ControlURL+"/api/v1/nodes", ""); s != 401 {
		t.Fatalf("the node list without the control token: %d, want 401", s)
	}
	// The scheme in any case (RFC 7235).
	if s := statusOf(t, stranger, "GET", c.state.ControlURL+"/api/v1/nodes", "Bearer "+controlToken); s != 200 {
		t.Fatalf("the node list with the control token: %d, want 200", s)
	}

	// An engine's port: its API needs the engine token (the event
	// plane's), which the router sends; health stays open.
	engine := fmt.Sprint(c.node("engine-0")["address"])
	if !strings.HasPrefix(engine, "http") {
		engine = "http://" + engine
	}
	if s := statusOf(t, stranger, "GET", engine+"/v1/models", ""); s != 401 {
		t.Fatalf("an engine's /v1/models without the token: %d, want 401", s)
	}
	for _, scheme := range []string{"Bearer ", "bearer "} {
		if s := statusOf(t, stranger, "GET", engine+"/v1/models", scheme+natsToken); s != 200 {
			t.Fatalf("an engine's /v1/models with %q and the token: %d, want 200", scheme, s)
		}
	}
	if s := statusOf(t, stranger, "GET", engine+"/health", ""); s != 200 {
		t.Fatalf("an engine's /health: %d, want 200", s)
	}

	// The user's commands read the tokens and work as before.
	if code, _, body := post(t, c.state.RouterURL+"/v1/completions", map[string]any{"prompt": "hello", "max_tokens": 4}); code != 200 {
		t.Fatalf("a request through the router: %d %v", code, body)
	}
	if out, code := runBin(t, c.env, "role", "set", "engine-1", "prefill"); code != 0 || !strings.Contains(out, "now prefill") {
		t.Fatalf("evolve role set: exit %d\n%s", code, out)
	}
	for _, args := range [][]string{{"nodes"}, {"status"}, {"top", "--once", "-o", "json"}, {"planner"}, {"kv"},
		{"bench", "--workload", "math", "--agents", "1", "--duration", "2s"}} {
		if out, code := runBin(t, c.env, args...); code != 0 {
			t.Errorf("evolve %s: exit %d\n%s", strings.Join(args, " "), code, out)
		}
	}
}

// A local cluster's record cut short does not send the commands to the
// default address, which on a shared machine may be another user's
// cluster (issue #56: evolve nodes fell back to it silently): they fail
// and say which file, and how to go on; evolve up sets it aside.
func TestDamagedRecordIsSaidNotSkipped(t *testing.T) {
	home := t.TempDir()
	env := []string{"XDG_STATE_HOME=" + home}
	dir := filepath.Join(home, "evolve", "local")
	os.MkdirAll(dir, 0o700)
	record := filepath.Join(dir, "cluster.json")
	os.WriteFile(record, []byte(`{"router_url": "http://127.0.0.1:1", "control_url": "http://127.0.0.1:2", "orchestr`), 0o600)
	for _, args := range [][]string{{"nodes"}, {"role", "set", "engine-0", "decode"}, {"bench", "--agents", "1", "--duration", "1s"}} {
		out, code := runBin(t, env, args...)
		if code != 1 || !strings.Contains(out, record+" does not read (it is cut short") || !strings.Contains(out, "--") ||
			strings.Contains(out, "127.0.0.1:800") {
			t.Errorf("evolve %s with a damaged record: exit %d\n%s", strings.Join(args, " "), code, out)
		}
	}
	if out, code := runBin(t, env, "down"); code != 1 || !strings.Contains(out, "cannot tell what it started") {
		t.Errorf("down with a damaged record: exit %d\n%s", code, out)
	}
	// --server goes where it says, whatever the record.
	if out, code := runBin(t, env, "nodes", "--server", "http://127.0.0.1:1"); code != 1 || !strings.Contains(out, "cannot reach the orchestrator at http://127.0.0.1:1") {
		t.Errorf("nodes --server with a damaged record: exit %d\n%s", code, out)
	}
	out, code := runBin(t, env, "up", "--detach", "--engines", "1", "--router-addr", "127.0.0.1:0", "--control-addr", "127.0.0.1:0")
	t.Cleanup(func() { runBinOut(t, env, "down") })
	if code != 0 || !strings.Contains(out, "set it aside as "+record+".damaged") {
		t.Fatalf("up with a damaged record: exit %d\n%s", code, out)
	}
	if out, code := runBin(t, env, "nodes"); code != 0 || !strings.Contains(out, "engine-0") {
		t.Fatalf("nodes of the new cluster: exit %d\n%s", code, out)
	}
}

// A cluster that did not stop with evolve down (its orchestrator killed)
// leaves its data, role pins among them; the next evolve up clears it and
// says so, so that its engines start with the split it prints (issue #56:
// an earlier pin applied while up printed another split).
func TestUpOnADeadClustersDataStartsAsItSays(t *testing.T) {
	args := []string{"--engines", "2", "--prefill", "1", "--planner", "off"}
	c := upCluster(t, args...)
	if out, code := runBin(t, c.env, "role", "set", "engine-1", "prefill", "--pin"); code != 0 {
		t.Fatalf("role set --pin: exit %d\n%s", code, out)
	}
	syscall.Kill(c.state.Orchestrator, syscall.SIGKILL)
	wait.Until(t, 10*time.Second, "the orchestrator gone", func() bool { return !cluster.Alive(c.state.Orchestrator) })
	up := append([]string{"up", "--detach", "--router-addr", "127.0.0.1:0", "--control-addr", "127.0.0.1:0"}, args...)
	out, code := runBin(t, c.env, up...)
	if code != 0 || !strings.Contains(out, "(1 prefill, 1 decode)") || !strings.Contains(out, "its data (role pins) in") {
		t.Fatalf("up on the dead cluster's data: exit %d\n%s", code, out)
	}
	if n := c.node("engine-1"); n["role"] != "decode" || n["mode"] != "auto" {
		t.Fatalf("engine-1 after up --prefill 1 printed 1 prefill, 1 decode: %v %v", n["role"], n["mode"])
	}
}
