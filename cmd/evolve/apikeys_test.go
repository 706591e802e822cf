package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// evolve up --api-key-file gives the router its keys (through the
// orchestrator's environment: the key is on no command line), and the
// agents' API refuses requests without one. evolve bench against the
// local cluster sends the key up kept; against a URL without --api-key
// it says the router wants one.
func TestAPIKeysThroughUpAndBench(t *testing.T) {
	file := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(file, []byte("# agents of team A\nteam-a sk-evolve-test-1\n\nsk-evolve-test-2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := upCluster(t, "--engines", "1", "--api-key-file", file)
	if c.up["api_keys"] != 2.0 {
		t.Fatalf("evolve up -o json: %v API keys, want 2", c.up["api_keys"])
	}
	if out, code := runBinOut(t, c.env, "status"); code != 0 || !strings.Contains(out, "api keys      2") {
		t.Fatalf("evolve status: exit %d\n%s", code, out)
	}
	ask := func(key string) int {
		req, _ := http.NewRequest("POST", c.state.RouterURL+"/v1/completions", strings.NewReader(`{"prompt": "hi", "max_tokens": 2}`))
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if s := ask(""); s != 401 {
		t.Fatalf("no key: %d", s)
	}
	if s := ask("sk-evolve-test-3"); s != 401 {
		t.Fatalf("a wrong key: %d", s)
	}
	if s := ask("sk-evolve-test-2"); s != 200 {
		t.Fatalf("the second key of the file: %d", s)
	}
	if b, err := os.ReadFile("/proc/" + strconv.Itoa(c.state.Orchestrator) + "/cmdline"); err == nil && strings.Contains(string(b), "sk-evolve") {
		t.Fatalf("the key is on the orchestrator's command line: %q", b)
	}

	out, code := runBinOut(t, c.env, "bench", "--workload", "math", "--agents", "2", "--duration", "2s", "-o", "json")
	var res struct {
		Requests int `json:"requests_completed"`
		Errors   int `json:"errors"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &res) != nil || res.Errors != 0 {
		t.Fatalf("bench against the local cluster: exit %d, %+v\n%s", code, res, out)
	}
	out, code = runBin(t, c.env, "bench", "--url", c.state.RouterURL, "--workload", "math", "--agents", "1", "--duration", "1s")
	if code == 0 || !strings.Contains(out, "wants an API key: pass one with --api-key") {
		t.Fatalf("bench without a key: exit %d\n%s", code, out)
	}
	out, code = runBin(t, c.env, "bench", "--url", c.state.RouterURL, "--api-key", "sk-evolve-test-1", "--workload", "math", "--agents", "1", "--duration", "1s")
	if code != 0 {
		t.Fatalf("bench with --api-key: exit %d\n%s", code, out)
	}

	// Each key's requests and tokens, by its name (team-a: bench's) or
	// its fingerprint (the one request with the unnamed key), and never
	// the key itself.
	sum := sha256.Sum256([]byte("sk-evolve-test-2"))
	unnamed := "sha256:" + hex.EncodeToString(sum[:4])
	if s := ask("sk-evolve-test-1"); s != 200 {
		t.Fatalf("team-a's key: %d", s)
	}
	if n := metric(t, c.state.RouterURL, `evolve_router_key_requests_total{key="team-a",outcome="ok"}`); n < 1 {
		t.Errorf("team-a's requests: %v ok, want at least the one just sent", n)
	}
	// bench sent team-a's key too; a request it finished as the run
	// ended may count as client_gone, so every outcome counts here.
	if n := keyRequests(t, c.state.RouterURL, "team-a"); n < float64(1+res.Requests) {
		t.Errorf("team-a's requests: %v, want at least 1 and the %d of the first bench", n, res.Requests)
	}
	if n := metric(t, c.state.RouterURL, `evolve_router_key_requests_total{key="`+unnamed+`",outcome="ok"}`); n != 1 {
		t.Errorf("the unnamed key's requests: %v, want 1", n)
	}
	if n := metric(t, c.state.RouterURL, `evolve_router_key_tokens_total{key="`+unnamed+`",kind="completion"}`); n != 2 {
		t.Errorf("the unnamed key's completion tokens: %v, want the 2 asked", n)
	}
	if p, d := metric(t, c.state.RouterURL, `evolve_router_key_tokens_total{key="team-a",kind="prompt"}`),
		metric(t, c.state.RouterURL, `evolve_router_key_tokens_total{key="team-a",kind="completion"}`); p == 0 || d == 0 {
		t.Errorf("team-a's tokens: %v prompt, %v completion", p, d)
	}
	if strings.Contains(strings.Join(scrape(t, http.DefaultClient, c.state.RouterURL), "\n"), "sk-evolve") {
		t.Error("a key shows in the router's metrics")
	}

	// An entry that is neither KEY nor NAME KEY stops up before it starts
	// anything.
	if out, code := runBin(t, c.env, "up", "--api-key", "team a sk-x", "--engines", "1"); code != 2 || !strings.Contains(out, "KEY or NAME KEY") {
		t.Errorf("up with a bad key entry: exit %d\n%s", code, out)
	}
}

// keyRequests is a key's requests of every outcome, from the router's
// metrics.
func keyRequests(t *testing.T, base, label string) float64 {
	t.Helper()
	total := 0.0
	for _, line := range scrape(t, http.DefaultClient, base) {
		if strings.HasPrefix(line, `evolve_router_key_requests_total{key="`+label+`",`) {
			total += sampleValue(line)
		}
	}
	return total
}
