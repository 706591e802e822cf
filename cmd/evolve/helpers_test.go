package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/evolvellm/evolve/engine/vllm/vllmtest"
)

// evolveBin is the evolve binary built once for the tests in this package.
var evolveBin string

func TestMain(m *testing.M) {
	// The test binary stands in for a vLLM server when evolve engine
	// --backend vllm starts it (see vllm_test.go).
	if os.Getenv("EVOLVE_TEST_FAKE_VLLM") == "1" {
		os.Exit(vllmtest.Main(os.Args[1:]))
	}
	dir, err := os.MkdirTemp("", "evolve-test-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	evolveBin = filepath.Join(dir, "evolve")
	http.DefaultClient.Transport = userTransport{}
	build := exec.Command("go", "build", "-o", evolveBin, ".")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build evolve:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// localTokens are the control tokens of the local clusters the tests
// started, by their control APIs' host:port (localCluster.readState). The
// user's evolve commands send a local cluster's token, read from its
// state directory, and so do the tests' own calls through
// http.DefaultClient (http.Get, http.Post); a call as another local
// process would make it, with no token, uses a client of its own.
var localTokens sync.Map

// userTransport sends a local cluster's control token to its control API.
type userTransport struct{}

func (userTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if tok, ok := localTokens.Load(r.URL.Host); ok && r.Header.Get("Authorization") == "" {
		r = r.Clone(r.Context())
		r.Header.Set("Authorization", "Bearer "+tok.(string))
	}
	return http.DefaultTransport.RoundTrip(r)
}

// proc is an evolve process started by a test.
type proc struct {
	cmd  *exec.Cmd
	url  string
	id   string
	done chan struct{}
	mu   sync.Mutex
	log  []string
}

// startEngine runs `evolve engine` on a free port and waits until it is
// ready; the process is stopped when the test ends.
func startEngine(t *testing.T, args ...string) *proc {
	t.Helper()
	all := append([]string{"engine", "--listen", "127.0.0.1:0", "--log-format", "json"}, args...)
	cmd := exec.Command(evolveBin, all...)
	cmd.Env = append(os.Environ(), "XDG_CONFIG_HOME="+t.TempDir())
	pr, pw := io.Pipe()
	cmd.Stderr = pw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	ready := make(chan map[string]any, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			p.mu.Lock()
			p.log = append(p.log, line)
			p.mu.Unlock()
			var m map[string]any
			if json.Unmarshal([]byte(line), &m) == nil && m["msg"] == "engine ready" {
				select {
				case ready <- m:
				default:
				}
			}
		}
	}()
	go func() { cmd.Wait(); pw.Close(); close(p.done) }()
	t.Cleanup(func() {
		p.stop(t)
		if t.Failed() {
			t.Logf("engine log:\n%s", p.logText())
		}
	})
	select {
	case m := <-ready:
		p.url, p.id = m["url"].(string), m["id"].(string)
	case <-p.done:
		t.Fatalf("engine exited before ready: %v", cmd.ProcessState)
	case <-time.After(20 * time.Second):
		t.Fatal("engine not ready after 20 s")
	}
	return p
}

func (p *proc) stop(t *testing.T) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(35 * time.Second):
		// An engine may take its --shutdown-grace (30 s by default) to
		// hand its answers over before it exits.
		t.Errorf("engine did not stop on SIGTERM within its shutdown grace")
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// logText is what the engine has logged so far, a line a record.
func (p *proc) logText() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.log, "\n")
}

func (p *proc) kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

// post sends a JSON body and returns the status, headers and decoded body.
func post(t *testing.T, url string, body any) (int, http.Header, map[string]any) {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case string:
		rd = strings.NewReader(b)
	default:
		raw, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(raw)
	}
	resp, err := http.Post(url, "application/json", rd)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	raw, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("POST %s: status %d, body not JSON: %q", url, resp.StatusCode, raw)
	}
	return resp.StatusCode, resp.Header, out
}

// metric reads one sample of a metric (the first whose name matches) from
// a Prometheus text endpoint.
func metric(t *testing.T, base, name string) float64 {
	t.Helper()
	return metricVia(t, http.DefaultClient, base, name)
}

// metricVia is metric through client c (one that trusts a test's
// certificate).
func metricVia(t *testing.T, c *http.Client, base, name string) float64 {
	t.Helper()
	for _, line := range scrape(t, c, base) {
		if strings.HasPrefix(line, name+"{") || strings.HasPrefix(line, name+" ") {
			return sampleValue(line)
		}
	}
	t.Fatalf("metric %s not found", name)
	return 0
}

// scrape reads the lines of a Prometheus text endpoint.
func scrape(t *testing.T, c *http.Client, base string) []string {
	t.Helper()
	resp, err := c.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(string(b), "\n")
}

// sampleValue is the value of a sample line.
func sampleValue(line string) float64 {
	var v float64
	fields := strings.Fields(line)
	fmt.Sscan(fields[len(fields)-1], &v)
	return v
}

// eventually polls cond until it holds or the deadline passes.
// servingNodes counts the nodes the orchestrator at controlURL lists as
// serving.
func servingNodes(t *testing.T, controlURL string) int {
	var nodes []map[string]any
	getJSON(t, controlURL+"/api/v1/nodes", &nodes)
	serving := 0
	for _, n := range nodes {
		if n["state"] == "serving" {
			serving++
		}
	}
	return serving
}

func num(v any) float64 {
	f, _ := v.(float64)
	return f
}

func obj(v any) map[string]any {
	m, _ := v.(map[string]any)
	return m
}

func mustDelete(t *testing.T, url string) int {
	t.Helper()
	req, err := http.NewRequest("DELETE", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// statusOf is the status of a request sent with c, with the given
// Authorization ("" for none), its body read and closed.
func statusOf(t *testing.T, c *http.Client, method, url, auth string) int {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}
