package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/evolvellm/evolve/internal/wait"
)

// evolve up --api-key-file gives the router its keys (the file's path,
// which it reads again on change, and no key on any command line), and the
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

// A key file's limits hold in a running router: a name's requests beyond
// its max-concurrency get a 429 the moment it is reached (max-wait=0s),
// another name's do not, and an answer whose client goes away frees its
// slot. A change to the file takes effect without a restart.
func TestAKeyNamesConcurrencyLimitInARunningRouter(t *testing.T) {
	file := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(file, []byte("team-a sk-a max-concurrency=1 max-wait=0s\nteam-b sk-b\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	orch, log := startOrchestratorLog(t, "--api-key-file", file)
	// A tenth of real time: an answer of 500 tokens takes seconds.
	startEngine(t, "--profile", "tiny", "--speedup", "0.1", "--nats", orch.NATSURL)
	wait.Until(t, 10*time.Second, "the engine serving", func() bool { return servingNodes(t, orch.ControlURL) == 1 })
	send := func(ctx context.Context, key string, stream bool) *http.Response {
		t.Helper()
		body := fmt.Sprintf(`{"prompt": "Explain the scheduler.", "max_tokens": 500, "stream": %v}`, stream)
		req, _ := http.NewRequestWithContext(ctx, "POST", orch.RouterURL+"/v1/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	ctx, cancel := context.WithCancel(t.Context())
	long := send(ctx, "sk-a", true)
	if _, err := bufio.NewReader(long.Body).ReadString('\n'); err != nil || long.StatusCode != 200 {
		t.Fatalf("team-a's first answer: %d %v", long.StatusCode, err)
	}
	short, cancelShort := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancelShort()
	over := send(short, "sk-a", false)
	b, _ := io.ReadAll(over.Body)
	over.Body.Close()
	if over.StatusCode != 429 || over.Header.Get("Retry-After") == "" || !strings.Contains(string(b), "rate_limit_exceeded") {
		t.Fatalf("team-a's second while its first streams: %d %s", over.StatusCode, b)
	}
	other := send(short, "sk-b", true) // team-b has no limit
	if other.StatusCode != 200 {
		t.Fatalf("team-b's while team-a is at its limit: %d", other.StatusCode)
	}
	other.Body.Close()
	if n := metric(t, orch.RouterURL, `evolve_router_key_in_flight{key="team-a"}`); n != 1 {
		t.Fatalf("team-a in flight: %v", n)
	}
	if out, code := runBin(t, nil, "status", "--server", orch.ControlURL); code != 0 || !regexp.MustCompile(`\n  team-a +1 of 1 in flight\n`).MatchString(out) {
		t.Fatalf("evolve status: exit %d\n%s", code, out)
	}
	cancel() // the agent goes away mid-answer
	long.Body.Close()
	wait.Until(t, 10*time.Second, "team-a's slot freed", func() bool {
		return metric(t, orch.RouterURL, `evolve_router_key_in_flight{key="team-a"}`) == 0
	})
	again := send(short, "sk-a", true)
	again.Body.Close()
	if again.StatusCode != 200 {
		t.Fatalf("team-a's after its first went away: %d", again.StatusCode)
	}
	if n := metric(t, orch.RouterURL, `evolve_router_key_requests_total{key="team-a",outcome="rate_limited"}`); n != 1 {
		t.Fatalf("team-a's rate_limited requests: %v, want 1", n)
	}

	// The file is read again when it changes: team-a's key is rotated,
	// with no restart.
	if err := os.WriteFile(file, []byte("team-a sk-a2 max-concurrency=1 max-wait=0s\nteam-b sk-b\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	status := func(key string) int { // a model list: no answer to wait for
		return statusOf(t, http.DefaultClient, "GET", orch.RouterURL+"/v1/models", "Bearer "+key)
	}
	wait.Until(t, 10*time.Second, "the old key refused", func() bool { return status("sk-a") == 401 })
	if s := status("sk-a2"); s != 200 {
		t.Fatalf("team-a's new key: %d", s)
	}
	wait.Until(t, 5*time.Second, "the reload in the log", func() bool { return strings.Contains(log.String(), "API keys reloaded") })
}
