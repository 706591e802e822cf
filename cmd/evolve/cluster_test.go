package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/evolvellm/evolve/cluster"
	"github.com/evolvellm/evolve/internal/wait"
	"github.com/evolvellm/evolve/workload"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// localCluster is a cluster started with `evolve up --detach` in a private
// state directory.
type localCluster struct {
	t     *testing.T
	env   []string
	state *cluster.LocalState
	up    map[string]any
}

func freePort(t *testing.T) string {
	t.Helper()
	// Below the kernel's ephemeral ports (32768 and up on Linux), which a
	// Listen on :0 would give: there, an outgoing connection of a test
	// running beside this one could take the port before the process the
	// test starts binds it ("bind: address already in use").
	for range 200 {
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", 20000+rand.IntN(12000)))
		if err != nil {
			continue
		}
		addr := l.Addr().String()
		l.Close()
		return addr
	}
	t.Fatal("no free port between 20000 and 32000")
	return ""
}

func upCluster(t *testing.T, args ...string) *localCluster {
	t.Helper()
	dir := t.TempDir()
	c := &localCluster{t: t, env: []string{"XDG_STATE_HOME=" + dir}}
	all := append([]string{"up", "--detach", "-o", "json", "--router-addr", "127.0.0.1:0", "--control-addr", "127.0.0.1:0"}, args...)
	out, code := runBinOut(t, c.env, all...)
	if code != 0 {
		t.Fatalf("evolve up: exit %d\n%s", code, out)
	}
	if err := json.Unmarshal([]byte(out), &c.up); err != nil {
		t.Fatalf("evolve up -o json: %v\n%s", err, out)
	}
	c.state = c.readState()
	t.Cleanup(func() {
		if t.Failed() {
			logs, _ := filepath.Glob(filepath.Join(c.state.LogDir, "*.log"))
			for _, l := range logs {
				t.Logf("%s:\n%s", filepath.Base(l), tail(l, 15))
			}
		}
		runBinOut(t, c.env, "down")
	})
	return c
}

func (c *localCluster) readState() *cluster.LocalState {
	c.t.Helper()
	var st cluster.LocalState
	b, err := os.ReadFile(filepath.Join(strings.TrimPrefix(c.env[0], "XDG_STATE_HOME="), "evolve", "local", "cluster.json"))
	if err != nil {
		c.t.Fatal(err)
	}
	if err := json.Unmarshal(b, &st); err != nil {
		c.t.Fatal(err)
	}
	if tok, err := os.ReadFile(st.ControlTokenFile); err == nil {
		for _, u := range append([]string{st.ControlURL}, orchestratorControlURLs(&st)...) {
			localTokens.Store(strings.TrimPrefix(u, "http://"), strings.TrimSpace(string(tok)))
		}
	}
	return &st
}

// tokenFor has the tests' calls send the cluster's control token to
// another control URL: an orchestrator of the cluster restarted by hand on
// its token file.
func (c *localCluster) tokenFor(controlURL string) {
	c.t.Helper()
	tok, err := os.ReadFile(c.state.ControlTokenFile)
	if err != nil {
		c.t.Fatal(err)
	}
	localTokens.Store(strings.TrimPrefix(controlURL, "http://"), strings.TrimSpace(string(tok)))
}

// orchestratorControlURLs are the control URLs of a local cluster of
// several orchestrators.
func orchestratorControlURLs(st *cluster.LocalState) []string {
	var urls []string
	for _, o := range st.Orchestrators {
		urls = append(urls, o.ControlURL)
	}
	return urls
}

func (c *localCluster) nodes() []map[string]any {
	c.t.Helper()
	out, code := runBinOut(c.t, c.env, "nodes", "-o", "json")
	if code != 0 {
		c.t.Fatalf("evolve nodes: %d %s", code, out)
	}
	var nodes []map[string]any
	if err := json.Unmarshal([]byte(out), &nodes); err != nil {
		c.t.Fatalf("evolve nodes -o json: %v: %s", err, out)
	}
	return nodes
}

func (c *localCluster) node(id string) map[string]any {
	for _, n := range c.nodes() {
		if n["id"] == id {
			return n
		}
	}
	c.t.Fatalf("no node %s", id)
	return nil
}

func (c *localCluster) client() openai.Client {
	return openai.NewClient(option.WithBaseURL(c.state.RouterURL+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
}

// runBinOut runs evolve and returns its stdout alone, and the exit code.
func runBinOut(t *testing.T, env []string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(evolveBin, args...)
	cmd.Env = append(os.Environ(), env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if ee, ok := err.(*exec.ExitError); ok {
		return string(out) + stderr.String(), ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return string(out), 0
}

func TestLocalClusterEndToEnd(t *testing.T) {
	c := upCluster(t, "--engines", "4", "--prefill", "2", "--speedup", "20", "--log-level", "debug")
	for _, k := range []string{"router_url", "control_url"} {
		if c.up[k] == "" || c.up[k] == nil {
			t.Fatalf("evolve up -o json lacks %s: %v", k, c.up)
		}
	}
	nodes := c.nodes()
	if len(nodes) != 4 {
		t.Fatalf("%d nodes", len(nodes))
	}
	roles := map[string]int{}
	for _, n := range nodes {
		for _, k := range []string{"id", "role", "mode", "state", "address"} {
			if _, ok := n[k]; !ok {
				t.Fatalf("node without %s: %v", k, n)
			}
		}
		roles[n["role"].(string)]++
		if n["state"] != "serving" || n["mode"] != "auto" {
			t.Fatalf("node %v", n)
		}
	}
	if roles["prefill"] != 2 || roles["decode"] != 2 {
		t.Fatalf("roles %v", roles)
	}
	out, code := runBinOut(t, c.env, "status", "-o", "json")
	var st map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil || st["router_url"] != c.state.RouterURL || st["nodes"] == nil {
		t.Fatalf("evolve status -o json: %d %s", code, out)
	}
	// The engines run at 20x: the cluster says so, so that measured
	// (wall-clock) and predicted (modelled) latencies are read apart.
	if st["speedup"] != 20.0 {
		t.Fatalf("evolve status -o json: speedup %v, want 20: %s", st["speedup"], out)
	}

	// Pointed at the router's port by mistake, a command says so.
	if out, code := runBin(t, c.env, "nodes", "--server", c.state.RouterURL); code != 1 || !strings.Contains(out, "this is evolve's router") {
		t.Fatalf("evolve nodes --server ROUTER: exit %d\n%s", code, out)
	}
	// The shell completes node names from the live cluster, then roles.
	if out, _ := runBinOut(t, c.env, "__complete", "role", "set", ""); !strings.HasPrefix(out, "engine-0\tprefill, serving\nengine-1\tprefill, serving\nengine-2\tdecode, serving\nengine-3\tdecode, serving\n:4\n") {
		t.Fatalf("completion of role set's node: %q", out)
	}
	if out, _ := runBinOut(t, c.env, "__complete", "role", "set", "engine-1", ""); !strings.HasPrefix(out, "prefill\ndecode\n:4\n") {
		t.Fatalf("completion of role set's role: %q", out)
	}

	ctx := context.Background()
	oc := c.client()
	long := strings.Repeat("The agent reads the repository and plans the change. ", 80) // ~880 tokens: past the 512 the evolve policy keeps on a decode node
	resp, err := oc.Completions.New(ctx, openai.CompletionNewParams{
		Model: "evolve-tiny", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String(long)}, MaxTokens: openai.Int(10),
	})
	if err != nil {
		t.Fatal(err)
	}
	var ext struct {
		Transferred int `json:"transferred_tokens"`
	}
	json.Unmarshal([]byte(resp.JSON.ExtraFields["evolve"].Raw()), &ext)
	if resp.Usage.CompletionTokens != 10 || ext.Transferred == 0 {
		t.Fatalf("a long prompt should be prefilled on a prefill node and its KV moved: %+v, transferred %d", resp.Usage, ext.Transferred)
	}
	// The answer names the nodes that served it, and at --log-level debug
	// (passed on to the cluster's processes) the orchestrator's log says
	// why the router chose them.
	status, hdr, _ := post(t, c.state.RouterURL+"/v1/completions", fmt.Sprintf(`{"prompt": %q, "max_tokens": 3}`, long+" again"))
	reqID, pre, dec := hdr.Get("X-Request-Id"), hdr.Get("X-Evolve-Prefill-Node"), hdr.Get("X-Evolve-Decode-Node")
	if status != 200 || reqID == "" || !strings.HasPrefix(pre, "engine-") || !strings.HasPrefix(dec, "engine-") {
		t.Fatalf("answer %d with headers %v", status, hdr)
	}
	wait.Until(t, 5*time.Second, "the orchestrator logs the routing at debug level", func() bool {
		b, _ := os.ReadFile(filepath.Join(c.state.LogDir, "orchestrator.log"))
		for _, l := range strings.Split(string(b), "\n") {
			var rec map[string]any
			if json.Unmarshal([]byte(l), &rec) == nil && rec["msg"] == "routed" && rec["request"] == reqID &&
				rec["prefill"] == pre && rec["decode"] == dec && strings.HasPrefix(fmt.Sprint(rec["why"]), "evolve: ") {
				return true
			}
		}
		return false
	})
	for _, pid := range c.state.Engines {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil && !bytes.Contains(b, []byte("--log-level\x00debug\x00")) {
			t.Errorf("engine %d was not given --log-level debug: %q", pid, b)
		}
	}
	// Streamed chat through the router.
	stream := oc.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
		Model: "evolve-tiny", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(long)}, MaxTokens: openai.Int(12),
	})
	var acc openai.ChatCompletionAccumulator
	for stream.Next() {
		acc.AddChunk(stream.Current())
	}
	if err := stream.Err(); err != nil || acc.Choices[0].Message.Content == "" {
		t.Fatalf("stream: %v %+v", err, acc.ChatCompletion)
	}
	// A bad request is refused by the router itself.
	if status, _, body := post(t, c.state.RouterURL+"/v1/completions", `{"prompt": ""}`); status != 400 || obj(body["error"]) == nil {
		t.Fatalf("bad request: %d %v", status, body)
	}

	// Switch roles under load: no request fails.
	var failed, done atomic.Int64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				prompt := fmt.Sprintf("%s worker %d request %d", long, w, i)
				_, err := oc.Completions.New(ctx, openai.CompletionNewParams{
					Model: "evolve-tiny", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String(prompt)}, MaxTokens: openai.Int(30),
				})
				if err != nil {
					failed.Add(1)
					t.Logf("request failed during switch: %v", err)
				}
				done.Add(1)
			}
		}(w)
	}
	// The switches happen under load: requests end before and after them.
	underLoad := func(what string) {
		from := done.Load()
		wait.Until(t, 30*time.Second, "4 requests done "+what, func() bool { return done.Load() >= from+4 })
	}
	underLoad("before the switches")
	if out, code := runBinOut(t, c.env, "role", "set", "engine-0", "decode", "--pin"); code != 0 {
		t.Fatalf("role set: %d %s", code, out)
	}
	if out, code := runBinOut(t, c.env, "role", "set", "engine-3", "prefill"); code != 0 {
		t.Fatalf("role set: %d %s", code, out)
	}
	underLoad("after the switches")
	close(stop)
	wg.Wait()
	if failed.Load() != 0 || done.Load() < 8 {
		t.Fatalf("%d of %d requests failed while roles switched", failed.Load(), done.Load())
	}
	if n := c.node("engine-0"); n["role"] != "decode" || n["mode"] != "pinned" {
		t.Fatalf("engine-0 after switch: %v", n)
	}
	if n := c.node("engine-3"); n["role"] != "prefill" || n["mode"] != "auto" {
		t.Fatalf("engine-3 after switch: %v", n)
	}
	if out, code := runBinOut(t, c.env, "role", "auto", "engine-0"); code != 0 || !strings.Contains(out, "auto") {
		t.Fatalf("role auto: %d %s", code, out)
	}
	// A mistyped node: the answer names the nodes there are, in the
	// operator's words, not the control API's request.
	for _, args := range [][]string{{"role", "set", "nope", "decode"}, {"role", "auto", "nope"}} {
		if out, code := runBinOut(t, c.env, args...); code == 0 || !strings.Contains(out, `error: no node "nope" (nodes: engine-0, engine-1, engine-2, engine-3)`) || strings.Contains(out, "/api/") {
			t.Fatalf("%v: %d %s", args, code, out)
		}
	}

	// evolve down leaves no process behind.
	pids := append([]int{c.state.Orchestrator}, c.state.Engines...)
	if out, code := runBinOut(t, c.env, "down"); code != 0 {
		t.Fatalf("down: %d %s", code, out)
	}
	for _, pid := range pids {
		if cluster.Alive(pid) {
			t.Fatalf("process %d still running after evolve down", pid)
		}
	}
	if out, code := runBinOut(t, c.env, "down"); code != 0 {
		t.Fatalf("second down: %d %s", code, out)
	}
}

// readCompletions reads a streamed completion to its end; with at > 0 it
// calls kill after chunk at (the stream must get that far). It returns
// the text and the ids the chunks carried.
func readCompletions(t *testing.T, oc openai.Client, params openai.CompletionNewParams, at int, kill func()) (string, map[string]bool, error) {
	t.Helper()
	stream := oc.Completions.NewStreaming(context.Background(), params)
	var b strings.Builder
	ids := map[string]bool{}
	got := 0
	deadline := time.AfterFunc(60*time.Second, func() { t.Error("stream hung after the engine died") })
	defer deadline.Stop()
	for stream.Next() {
		ch := stream.Current()
		ids[ch.ID] = true
		for _, x := range ch.Choices {
			b.WriteString(x.Text)
		}
		if got++; got == at {
			kill()
		}
	}
	if at > 0 && got < at {
		t.Fatalf("stream ended after %d chunks, before the kill", got)
	}
	return b.String(), ids, stream.Err()
}

// readReference reads the answer to params with nothing killed: the one
// a stream whose engine dies must still read.
func readReference(t *testing.T, oc openai.Client, params openai.CompletionNewParams) string {
	t.Helper()
	ref, _, err := readCompletions(t, oc, params, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	return ref
}

// resumedOnce checks a stream read while its engine was killed: it ended
// well, it is the reference answer with one id, and the router resumed it
// once.
func resumedOnce(t *testing.T, c *localCluster, text, ref string, ids map[string]bool, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("the stream failed with its engine: %v", err)
	}
	if text != ref || len(ids) != 1 {
		t.Fatalf("the answer changed when its engine died (%d of %d bytes, ids %v)", len(text), len(ref), ids)
	}
	if v := metric(t, c.state.RouterURL, `evolve_router_resumed_answers_total{cause="engine_failed",outcome="continued"}`); v != 1 {
		t.Fatalf("answers resumed: %v", v)
	}
}

// An engine killed mid-stream does not end the agent's stream: the router
// goes on with the answer on the node that is left, from the tokens the
// agent has read, and the agent reads the answer it would have read had
// nothing died.
func TestEngineKilledMidStreamThroughRouter(t *testing.T) {
	c := upCluster(t, "--engines", "2", "--prefill", "1", "--speedup", "1")
	oc := c.client()
	// A short prompt stays on a decode node: kill it mid-stream.
	params := openai.CompletionNewParams{
		Model: "evolve-tiny", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("tell a very long story")},
		MaxTokens: openai.Int(1500), Seed: openai.Int(7),
	}
	params.SetExtraFields(map[string]any{"ignore_eos": true}) // all 1,500 tokens, to kill the engine mid-way
	ref := readReference(t, oc, params)
	text, ids, err := readCompletions(t, oc, params, 5, func() {
		// Once its heartbeat says so, so that the status has load to
		// forget.
		wait.Until(t, 10*time.Second, "engine-1 reports the stream", func() bool { return c.node("engine-1")["running"] == 1.0 })
		syscall.Kill(c.state.Engines[1], syscall.SIGKILL) // engine-1 is the decode node
	})
	resumedOnce(t, c, text, ref, ids, err)
	wait.Until(t, 10*time.Second, "the killed node shows down", func() bool { return c.node("engine-1")["state"] == "down" })
	// Its last heartbeat said it was running this stream: no longer true.
	if n := c.node("engine-1"); n["running"] != 0.0 || n["waiting"] != 0.0 || n["gpu_kv_usage"] != 0.0 {
		t.Fatalf("a down node shows load: %v", n)
	}
	// The cluster still answers on the node that is left.
	resp, err := oc.Completions.New(context.Background(), openai.CompletionNewParams{
		Model: "evolve-tiny", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("still there?")}, MaxTokens: openai.Int(3),
	})
	if err != nil || resp.Usage.CompletionTokens != 3 {
		t.Fatalf("after the kill: %v %+v", err, resp)
	}
}

// An engine killed far into an answer leaves the next node more to
// recompute (the output so far) than a decode node computes for a new
// request: the prefill node computes that KV, the other decode node pulls
// it and writes the rest, and the agent reads the answer it would have
// read had nothing died.
func TestEngineKilledFarIntoAnAnswerThroughRouter(t *testing.T) {
	c := upCluster(t, "--engines", "3", "--prefill", "1", "--speedup", "1")
	oc := c.client()
	params := openai.CompletionNewParams{
		Model: "evolve-tiny", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("reason about this at great length")},
		MaxTokens: openai.Int(2500), Seed: openai.Int(9),
	}
	params.SetExtraFields(map[string]any{"ignore_eos": true})
	// Past 512 output tokens, with seconds of the answer still to come
	// when the heartbeat names the node.
	const killAt = 600
	ref := readReference(t, oc, params)
	killed := ""
	text, ids, err := readCompletions(t, oc, params, killAt, func() {
		// The decode node writing it, once its heartbeat says so.
		wait.Until(t, 10*time.Second, "a decode node reports the stream", func() bool {
			for _, id := range []string{"engine-1", "engine-2"} {
				if c.node(id)["running"] == 1.0 {
					killed = id
					return true
				}
			}
			return false
		})
		syscall.Kill(c.state.Engines[map[string]int{"engine-1": 1, "engine-2": 2}[killed]], syscall.SIGKILL)
	})
	resumedOnce(t, c, text, ref, ids, err)
	if v := metric(t, c.state.RouterURL, `evolve_router_resume_prefilled_total`); v != 1 {
		t.Fatalf("resumed answers whose KV the prefill node computed: %v", v)
	}
	wait.Until(t, 10*time.Second, "the killed node shows down", func() bool { return c.node(killed)["state"] == "down" })
}

// An engine killed while it writes a whole (not streamed) answer does not
// cost the agent that answer, nor what the engine had written of it: the
// engine names each token to the router ahead of the answer, and the
// router goes on with it elsewhere; the agent gets the answer it would
// have got had nothing died.
func TestEngineKilledMidAWholeAnswerThroughRouter(t *testing.T) {
	c := upCluster(t, "--engines", "3", "--prefill", "1", "--speedup", "1")
	oc := c.client()
	params := openai.CompletionNewParams{
		Model: "evolve-tiny", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("work this out in full")},
		MaxTokens: openai.Int(2500), Seed: openai.Int(5),
	}
	params.SetExtraFields(map[string]any{"ignore_eos": true})
	ref, err := oc.Completions.New(context.Background(), params)
	if err != nil {
		t.Fatal(err)
	}
	generated := func(id string) float64 {
		return metric(t, c.node(id)["address"].(string), "vllm:generation_tokens_total")
	}
	before := map[string]float64{"engine-1": generated("engine-1"), "engine-2": generated("engine-2")}
	type answer struct {
		resp *openai.Completion
		err  error
	}
	got := make(chan answer, 1)
	go func() {
		r, err := oc.Completions.New(context.Background(), params)
		got <- answer{r, err}
	}()
	killed := ""
	wait.Until(t, 20*time.Second, "a decode node has written 300 tokens of the answer", func() bool {
		for id, b := range before {
			if generated(id)-b >= 300 {
				killed = id
				return true
			}
		}
		return false
	})
	syscall.Kill(c.state.Engines[map[string]int{"engine-1": 1, "engine-2": 2}[killed]], syscall.SIGKILL)
	a := <-got
	if a.err != nil {
		t.Fatalf("the answer failed with its engine: %v", a.err)
	}
	if len(a.resp.Choices) != 1 || a.resp.Choices[0].Text != ref.Choices[0].Text || a.resp.Usage.CompletionTokens != 2500 {
		t.Fatalf("the answer changed when its engine died (%d completion tokens)", a.resp.Usage.CompletionTokens)
	}
	if v := metric(t, c.state.RouterURL, `evolve_router_resumed_answers_total{cause="engine_failed",outcome="continued"}`); v != 1 {
		t.Fatalf("answers resumed: %v", v)
	}
}

func TestOrchestratorRestartKeepsPins(t *testing.T) {
	natsAddr := freePort(t)
	c := upCluster(t, "--engines", "2", "--prefill", "1", "--speedup", "10", "--nats-addr", natsAddr)
	if out, code := runBinOut(t, c.env, "role", "set", "engine-1", "prefill", "--pin"); code != 0 {
		t.Fatalf("role set: %d %s", code, out)
	}
	// Stop the orchestrator and start a new one on the same addresses and data.
	syscall.Kill(c.state.Orchestrator, syscall.SIGTERM)
	wait.Until(t, 15*time.Second, "orchestrator stops", func() bool { return !cluster.Alive(c.state.Orchestrator) })
	dir := strings.TrimPrefix(c.env[0], "XDG_STATE_HOME=")
	orch := exec.Command(evolveBin, "orchestrator", "--router-addr", strings.TrimPrefix(c.state.RouterURL, "http://"),
		"--control-addr", strings.TrimPrefix(c.state.ControlURL, "http://"), "--nats-listen", natsAddr,
		"--data-dir", filepath.Join(dir, "evolve", "local", "nats"))
	orch.Env = append(os.Environ(), c.env...)
	if err := orch.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { orch.Process.Signal(syscall.SIGTERM); orch.Wait() })
	c.state.Orchestrator = orch.Process.Pid
	wait.Until(t, 20*time.Second, "engines re-register with the new orchestrator", func() bool {
		out, code := runBinOut(t, c.env, "nodes", "-o", "json")
		var nodes []map[string]any
		if code != 0 || json.Unmarshal([]byte(out), &nodes) != nil || len(nodes) != 2 {
			return false
		}
		for _, n := range nodes {
			if n["state"] != "serving" {
				return false
			}
		}
		return true
	})
	if n := c.node("engine-1"); n["role"] != "prefill" || n["mode"] != "pinned" {
		t.Fatalf("after restart engine-1 is %v %v, want prefill pinned", n["role"], n["mode"])
	}
	if n := c.node("engine-0"); n["mode"] != "auto" {
		t.Fatalf("engine-0 after restart: %v", n)
	}
}

func TestBenchAgainstLocalCluster(t *testing.T) {
	c := upCluster(t, "--engines", "3", "--prefill", "1", "--profile", "gb300-kimi-k2", "--speedup", "50")
	// An OpenAI client's base URL, /v1 included, names the router too.
	out, code := runBinOut(t, c.env, "bench", "--url", c.state.RouterURL+"/v1/", "--workload", "coding", "--agents", "3", "--duration", "4s", "--speedup", "50", "-o", "json")
	if code != 0 {
		t.Fatalf("bench: exit %d: %s", code, out)
	}
	var res struct {
		Requests     int     `json:"requests_completed"`
		Errors       int     `json:"errors"`
		PromptTokens int64   `json:"prompt_tokens"`
		Cached       int64   `json:"cached_tokens"`
		TokensPerSec float64 `json:"output_tokens_per_s"`
		TTFT         struct {
			N   int     `json:"n"`
			P50 float64 `json:"p50_s"`
		} `json:"ttft"`
		E2E struct {
			P99 float64 `json:"p99_s"`
		} `json:"e2e"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("bench -o json: %v\n%s", err, out)
	}
	if res.Requests < 3 || res.Errors != 0 || res.TTFT.N != res.Requests || res.TTFT.P50 <= 0 || res.E2E.P99 < res.TTFT.P50 || res.TokensPerSec <= 0 {
		t.Fatalf("bench result: %+v", res)
	}
	// Coding agents share a 20K-token system prompt: most prompt tokens are cached.
	if res.Cached*2 < res.PromptTokens {
		t.Fatalf("only %d of %d prompt tokens cached", res.Cached, res.PromptTokens)
	}
	// The control address is not a router: bench says what it found.
	if out, code := runBin(t, c.env, "bench", "--url", c.state.ControlURL, "--duration", "2s"); code != 1 ||
		!strings.Contains(out, c.state.ControlURL+" is evolve's control API, not its router") {
		t.Errorf("bench --url CONTROL: exit %d\n%s", code, out)
	}
	// Nothing listening: bench says so, and where evolve's router would be.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String()
	ln.Close()
	if out, code := runBin(t, c.env, "bench", "--url", closed, "--duration", "2s"); code != 1 ||
		!strings.Contains(out, "cannot reach a router at "+closed+": connection refused (nothing listens there) (is a cluster up?") ||
		strings.Contains(out, "dial tcp") {
		t.Errorf("bench --url CLOSED: exit %d\n%s", code, out)
	}
	for _, bad := range [][]string{{"--workload", "poetry"}, {"--duration", "-1s"}, {"--unreachable-timeout", "-1s"}, {"--speedup", "0"}, {"--trace", "/dev/null", "--playback", "0"}} {
		// Refused: --playback 0 or --speedup 0 once ran at 1x unasked.
		if out, code := runBinOut(t, c.env, append([]string{"bench"}, bad...)...); code != 2 || strings.Contains(out, "requests") {
			t.Errorf("bench %v: exit %d %s", bad, code, out)
		}
	}
}

func TestUpWithAgentsRunsAndStops(t *testing.T) {
	state := t.TempDir()
	env := []string{"XDG_STATE_HOME=" + state}
	out, code := runBinOut(t, env, "up", "--agents", "2", "--workload", "computer-use", "--duration", "3s", "--engines", "2",
		"--speedup", "50", "--router-addr", "127.0.0.1:0", "--control-addr", "127.0.0.1:0")
	if code != 0 || !strings.Contains(out, "requests") || !strings.Contains(out, "ttft") {
		t.Fatalf("up --agents: exit %d\n%s", code, out)
	}
	// Its control API is gone. (Asked by its own address: a cluster
	// another user runs on the default ports would answer a plain status.)
	control := regexp.MustCompile(`control\s+(http://\S+)`).FindStringSubmatch(out)
	if control == nil {
		t.Fatalf("up --agents does not say its control URL:\n%s", out)
	}
	if out, _ := runBinOut(t, env, "status", "--server", control[1]); !strings.Contains(out, "cannot reach") {
		t.Fatalf("cluster still up after the agents' run: %s", out)
	}
	if _, err := os.Stat(filepath.Join(state, "evolve", "local", "cluster.json")); !os.IsNotExist(err) {
		t.Fatalf("the local cluster's record outlived it: %v", err)
	}
}

func TestBenchRecordsAndReplaysTraces(t *testing.T) {
	c := upCluster(t, "--engines", "2", "--profile", "gb300-kimi-k2", "--speedup", "50")
	trace := filepath.Join(t.TempDir(), "fleet.jsonl")
	out, code := runBinOut(t, c.env, "bench", "--workload", "computer-use", "--agents", "2", "--duration", "2s", "--speedup", "50", "--record", trace, "-o", "json")
	if code != 0 {
		t.Fatalf("bench --record: %d %s", code, out)
	}
	b, err := os.ReadFile(trace)
	if err != nil || len(strings.Split(strings.TrimSpace(string(b)), "\n")) < 2 {
		t.Fatalf("recorded trace: %v %q", err, b)
	}
	// A run that cannot start leaves the recording whole, and no stray
	// file beside it.
	if out, code := runBinOut(t, c.env, "bench", "--url", "http://127.0.0.1:1", "--agents", "2", "--record", trace); code == 0 {
		t.Fatalf("bench against nothing: exit 0: %s", out)
	}
	if again, _ := os.ReadFile(trace); string(again) != string(b) {
		t.Fatal("a bench that never started overwrote the recorded trace")
	}
	if ents, _ := os.ReadDir(filepath.Dir(trace)); len(ents) != 1 {
		t.Fatalf("files beside the trace: %v", ents)
	}
	// Without --speedup, bench follows the local cluster's engines (50x),
	// so the recording is in modelled time; a reader of its progress that
	// goes away (| head -1) neither kills it nor loses the recording.
	followed := filepath.Join(t.TempDir(), "followed.jsonl")
	// (6 s: a progress line at 5 s meets the closed pipe.)
	cmd := exec.Command(evolveBin, "bench", "--workload", "computer-use", "--agents", "2", "--duration", "6s", "--record", followed)
	cmd.Env = append(os.Environ(), c.env...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	first, _ := bufio.NewReader(stderr).ReadString('\n')
	stderr.Close()
	if err := cmd.Wait(); err != nil || !strings.Contains(first, "engines run 50x") {
		t.Fatalf("bench with its stderr closed: %v; first line %q", err, first)
	}
	fi, err := os.Stat(followed)
	if err != nil || fi.Mode().Perm() != 0o644 {
		t.Fatalf("the recording: %v %v", err, fi)
	}
	fb, _ := os.ReadFile(followed)
	recs, err := workload.ReadTrace(bytes.NewReader(fb))
	if err != nil || len(recs) < 2 || recs[len(recs)-1].Timestamp < 30_000 {
		t.Fatalf("a 6 s run at 50x should span modelled minutes: %v %d records, last at %.0f ms", err, len(recs), recs[len(recs)-1].Timestamp)
	}

	// The first 60 requests of the Mooncake sample (12 s of trace) at 20x.
	head, err := os.ReadFile("../../workload/testdata/mooncake_conversation_head.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	mooncake := filepath.Join(t.TempDir(), "mooncake60.jsonl")
	lines := strings.SplitAfter(string(head), "\n")
	if err := os.WriteFile(mooncake, []byte(strings.Join(lines[:60], "")), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tr := range []string{trace, mooncake} {
		out, code = runBinOut(t, c.env, "bench", "--trace", tr, "--playback", "20", "--duration", "30s", "-o", "json")
		var res struct {
			Requests int `json:"requests_completed"`
			Errors   int `json:"errors"`
		}
		if code != 0 || json.Unmarshal([]byte(out), &res) != nil || res.Requests < 2 || res.Errors != 0 {
			t.Fatalf("replay of %s: exit %d %s", tr, code, out)
		}
	}
	// A replay at the recorded pace against sped-up engines gets a hint,
	// not a changed speedup.
	if out, code := runBin(t, c.env, "bench", "--trace", mooncake, "--duration", "1s"); code != 0 ||
		!strings.Contains(out, "--playback 50 replays the trace in their time") || strings.Contains(out, "think and tool times") ||
		!strings.Contains(out, "trace replay, ") {
		t.Fatalf("replay at 1x against engines at 50x: exit %d\n%s", code, out)
	}
	if out, code := runBinOut(t, c.env, "bench", "--trace", "/nonexistent.jsonl"); code != 2 {
		t.Fatalf("missing trace: %d %s", code, out)
	}
}

// Coding agents against a model whose context cannot hold their prompts:
// no request can be sent, and bench says why instead of reporting an
// empty success, and says so within seconds, not at the end of its two
// minutes, with no latency of 0 in its table.
func TestBenchSaysWhenPromptsOutgrowTheContext(t *testing.T) {
	c := upCluster(t, "--engines", "2", "--speedup", "50") // the tiny profile: an 8K-token context
	out, code := runBinOut(t, c.env, "bench", "--workload", "coding", "--agents", "4", "--duration", "2m", "--speedup", "50")
	if code != 1 || !strings.Contains(out, "no request was sent") || !strings.Contains(out, "max_model_len") || !strings.Contains(out, "--profile") ||
		!strings.Contains(out, "stopped early") || !regexp.MustCompile(`e2e \(s\)\s+-\s+-\s+-\s+-\n`).MatchString(out) {
		t.Fatalf("bench with prompts past the context: exit %d\n%s", code, out)
	}
}

// evolve nodes --watch prints the table, then a row each time a node's
// role, mode or state changes, as a switch goes through its phases; with
// -o json a line per update. Ctrl-C ends it with status 0.
func TestNodesWatchFollowsASwitch(t *testing.T) {
	c := upCluster(t, "--engines", "2", "--prefill", "1", "--profile", "tiny")
	table, tout := startBin(t, c.env, "nodes", "--watch")
	js, jout := startBin(t, c.env, "nodes", "-w", "-o", "json")
	wait.Until(t, 10*time.Second, "the first table", func() bool {
		return strings.Count(tout.String(), "\n") >= 3 && strings.Count(jout.String(), "\n") >= 2
	})
	if out, code := runBinOut(t, c.env, "role", "set", "engine-1", "prefill"); code != 0 {
		t.Fatalf("role set: %d %s", code, out)
	}
	switched := regexp.MustCompile(`(?m)^engine-1 +D decode +auto +switching->prefill \(\w+\)`)
	done := regexp.MustCompile(`(?m)^engine-1 +P prefill +auto +serving`)
	wait.Until(t, 10*time.Second, "the switch's rows", func() bool {
		s := tout.String()
		return switched.MatchString(s) && done.MatchString(s)
	})
	if lines := strings.Split(tout.String(), "\n"); !strings.HasPrefix(lines[0], "ID ") || strings.Count(tout.String(), "ID ") != 1 {
		t.Fatalf("one header, first:\n%s", tout.String())
	}
	wait.Until(t, 10*time.Second, "a JSON line with engine-1 as prefill", func() bool {
		for _, l := range strings.Split(strings.TrimSpace(jout.String()), "\n") {
			var n struct{ ID, Role, State string }
			if json.Unmarshal([]byte(l), &n) != nil {
				t.Fatalf("not a JSON object per line: %q", l)
			}
			if n.ID == "engine-1" && n.Role == "prefill" && n.State == "serving" {
				return true
			}
		}
		return false
	})
	for i, p := range []struct {
		cmd *exec.Cmd
		out *lockedLog
	}{{table, tout}, {js, jout}} {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			if interrupt(t, p.cmd, p.out); p.cmd.ProcessState.ExitCode() != 0 {
				t.Fatalf("nodes --watch after Ctrl-C: exit %d", p.cmd.ProcessState.ExitCode())
			}
		})
	}
	if out, code := runBinOut(t, c.env, "nodes", "-w", "-o", "yaml"); code != 2 {
		t.Fatalf("nodes -w -o yaml: exit %d %s", code, out)
	}
	// No cluster there: it says so at once.
	start := time.Now()
	if out, code := runBinOut(t, c.env, "nodes", "-w", "--server", "http://127.0.0.1:1"); code != 1 || !strings.Contains(out, "cannot reach") || time.Since(start) > 5*time.Second {
		t.Fatalf("nodes -w without a cluster: exit %d after %v: %s", code, time.Since(start), out)
	}
}

// A local cluster brought down and up again starts as its flags say: the
// pins of the one before do not come back (they survive an orchestrator
// restart within a cluster's life; see TestOrchestratorRestartKeepsPins).
func TestUpAfterDownStartsAsItsFlagsSay(t *testing.T) {
	args := []string{"--engines", "2", "--prefill", "1", "--profile", "tiny"}
	c := upCluster(t, args...)
	if out, code := runBinOut(t, c.env, "role", "set", "engine-1", "prefill", "--pin"); code != 0 {
		t.Fatalf("role set: %d %s", code, out)
	}
	if out, code := runBinOut(t, c.env, "down"); code != 0 {
		t.Fatalf("down: %d %s", code, out)
	}
	up := append([]string{"up", "--detach", "--router-addr", "127.0.0.1:0", "--control-addr", "127.0.0.1:0"}, args...)
	if out, code := runBinOut(t, c.env, up...); code != 0 {
		t.Fatalf("up again: %d %s", code, out)
	}
	if n := c.node("engine-1"); n["role"] != "decode" || n["mode"] != "auto" {
		t.Fatalf("engine-1 after down and up --prefill 1: %v", n)
	}
}

// An address in use is named with its flag before anything starts (it
// used to surface as the orchestrator's log); a malformed one is a usage
// error.
func TestUpNamesTheAddressInUse(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	env := []string{"XDG_STATE_HOME=" + t.TempDir()}
	out, code := runBinOut(t, env, "up", "--detach", "--router-addr", "127.0.0.1:0", "--control-addr", l.Addr().String())
	if code != 1 || !strings.Contains(out, "--control-addr "+l.Addr().String()+": the address is in use") || strings.Contains(out, "starting orchestrator") {
		t.Fatalf("control address in use: exit %d\n%s", code, out)
	}
	if out, code := runBinOut(t, env, "up", "--router-addr", "8000"); code != 2 || !strings.Contains(out, "--router-addr") {
		t.Fatalf("malformed address: exit %d\n%s", code, out)
	}
}
