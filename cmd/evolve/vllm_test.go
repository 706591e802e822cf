package main

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/evolvellm/evolve/engine/vllm/vllmtest"
	"github.com/evolvellm/evolve/internal/wait"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// startOrchestrator runs `evolve orchestrator` on free ports with the
// planner off and returns its URLs.
func startOrchestrator(t *testing.T) readyInfo {
	info, _ := startOrchestratorLog(t)
	return info
}

// lockedLog is a process's stderr, safe to read while it writes.
type lockedLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startOrchestratorLog is startOrchestrator that also returns its log;
// extra flags come after (and override) the usual ones.
func startOrchestratorLog(t *testing.T, extra ...string) (readyInfo, *lockedLog) {
	t.Helper()
	dir := t.TempDir()
	ready := filepath.Join(dir, "ready.json")
	cmd := exec.Command(evolveBin, append([]string{"orchestrator", "--router-addr", "127.0.0.1:0", "--control-addr", "127.0.0.1:0",
		"--nats-listen", "127.0.0.1:0", "--data-dir", filepath.Join(dir, "data"), "--planner", "off", "--ready-file", ready}, extra...)...)
	cmd.Env = append(os.Environ(), "XDG_CONFIG_HOME="+dir)
	log := &lockedLog{}
	cmd.Stderr = log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("orchestrator log:\n%s", log.String())
		}
	})
	var info readyInfo
	wait.Until(t, 20*time.Second, "the orchestrator's ready file", func() bool {
		b, err := os.ReadFile(ready)
		return err == nil && json.Unmarshal(b, &info) == nil
	})
	return info, log
}

// useFakeVLLM has the vLLM commands this test starts run the stand-in
// vLLM (this test binary, which TestMain turns into one), and returns that
// command and the file where it writes the arguments it was given.
func useFakeVLLM(t *testing.T) (exe, argsFile string) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	argsFile = filepath.Join(t.TempDir(), "vllm-args")
	t.Setenv("EVOLVE_TEST_FAKE_VLLM", "1")
	t.Setenv("FAKE_VLLM_ARGS_FILE", argsFile)
	return exe, argsFile
}

func getJSON(t *testing.T, url string, out any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
}

func portOf(t *testing.T, addr string) string {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Two vLLM servers join a cluster: one the agent starts (the command
// after --) and one already running that the agent joins. Requests through
// the router are split into vLLM's prefill and decode legs across them, the
// router tokenizes with vLLM's /tokenize so that the directory, fed by
// vLLM's ZMQ KV events over NATS, finds a conversation's earlier turns on
// the prefill node; stopping the agent stops the server it started.
func TestVLLMEnginesServeThroughTheRouter(t *testing.T) {
	orch := startOrchestrator(t)
	exe, argsFile := useFakeVLLM(t)
	listen := freePort(t)
	pre := startEngine(t, "--backend", "vllm", "--listen", listen, "--id", "vllm-pre", "--role", "prefill",
		"--kv-events-port", portOf(t, freePort(t)), "--kv-replay-port", portOf(t, freePort(t)), "--nats", orch.NATSURL,
		"--", exe, "serve", "fake/model")
	if pre.url != "http://"+listen {
		t.Fatalf("started vLLM advertised as %s, want http://%s", pre.url, listen)
	}
	b, err := os.ReadFile(argsFile)
	if err != nil {
		t.Fatal(err)
	}
	args := string(b)
	for _, want := range []string{"serve\nfake/model\n", "--port\n" + portOf(t, listen), `"enable_kv_cache_events":true`,
		`"replay_endpoint":"tcp://*:`, `"kv_connector":"NixlConnector","kv_role":"kv_both"`} {
		if !strings.Contains(args, want) {
			t.Fatalf("vLLM started with\n%s\nlacking %q", args, want)
		}
	}
	// A release the agent cannot read (here no Python script) is not
	// given a flag it may refuse.
	if strings.Contains(args, "forward-pass") {
		t.Fatalf("vLLM of an unknown release started with --forward-pass-metrics-port:\n%s", args)
	}

	srv, err := vllmtest.Start(t.Context(), vllmtest.Options{}, "", "", "")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	startEngine(t, "--backend", "vllm", "--vllm-url", srv.URL, "--kv-events", srv.Events, "--kv-replay", srv.Replay,
		"--id", "vllm-dec", "--role", "decode", "--gpus", "4", "--nats", orch.NATSURL)

	wait.Until(t, 20*time.Second, "both vLLM engines serving", func() bool { return servingNodes(t, orch.ControlURL) == 2 })

	client := openai.NewClient(option.WithBaseURL(orch.RouterURL+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	ctx := t.Context()
	history := []openai.ChatCompletionMessageParamUnion{
		openai.SystemMessage(strings.Repeat("You are a coding agent working in a large repository. ", 200)),
		openai.UserMessage("Read the scheduler and tell me what it does."),
	}
	ask := func() string {
		t.Helper()
		resp, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "fake/model", Messages: history,
			MaxTokens: openai.Int(6)})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Choices) != 1 || resp.Choices[0].Message.Content == "" {
			t.Fatalf("answer %+v", resp)
		}
		return resp.Choices[0].Message.Content
	}
	answer := ask()
	var kvst struct {
		Blocks       int   `json:"blocks"`
		GPUHitTokens int64 `json:"gpu_hit_tokens"`
		PromptTokens int64 `json:"prompt_tokens"`
		Nodes        []struct {
			ID        string `json:"id"`
			GPUCached int    `json:"gpu_cached_blocks"`
		} `json:"nodes"`
	}
	// Both servers hold the first turn's prefix: the prefill server
	// computed it, the decode server pulled it.
	wait.Until(t, 10*time.Second, "the first turn's blocks on both nodes in the directory", func() bool {
		getJSON(t, orch.ControlURL+"/api/v1/kv", &kvst)
		held := 0
		for _, n := range kvst.Nodes {
			if n.GPUCached >= 100 {
				held++
			}
		}
		return held == 2
	})
	history = append(history, openai.AssistantMessage(answer), openai.UserMessage("Now run its tests."))
	ask()
	getJSON(t, orch.ControlURL+"/api/v1/kv", &kvst)
	if kvst.GPUHitTokens < 20*vllmtest.BlockSize {
		t.Fatalf("the second turn found %d of %d prompt tokens on GPU: the router's chains do not match vLLM's events",
			kvst.GPUHitTokens, kvst.PromptTokens)
	}
	// The first turn: prefilled on the prefill node, decoded on the decode
	// node (which kept the KV it pulled); the second: prefilled where its
	// context now lives, on the decode node, with nothing to move.
	if st := srv.Stats(); st.DecodeLegs != 1 || st.PrefillLegs != 0 || st.Requests != 2 {
		t.Fatalf("decode server saw %+v", st)
	}
	if n := metric(t, pre.url, "vllm:prompt_tokens_total"); n < 100*vllmtest.BlockSize {
		t.Fatalf("the prefill server computed %v prompt tokens", n)
	}

	// A stream comes through from vLLM.
	stream := client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: "fake/model", Messages: history,
		MaxTokens: openai.Int(5)})
	chunks := 0
	for stream.Next() {
		if len(stream.Current().Choices) > 0 && stream.Current().Choices[0].Delta.Content != "" {
			chunks++
		}
	}
	if err := stream.Err(); err != nil || chunks != 5 {
		t.Fatalf("stream: %d chunks, err %v", chunks, err)
	}

	// An agent that speaks Anthropic's Messages API is served by vLLM
	// engines too: vLLM tokenizes the translated request, and the KV of
	// the conversation so far is reused.
	ac := anthropic.NewClient(aoption.WithBaseURL(orch.RouterURL), aoption.WithAPIKey("unused"), aoption.WithMaxRetries(0))
	am := ac.Messages.NewStreaming(ctx, anthropic.MessageNewParams{Model: "fake/model", MaxTokens: 4,
		System:   []anthropic.TextBlockParam{{Text: strings.Repeat("You are a coding agent working in a large repository. ", 200)}},
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Read the scheduler and tell me what it does."))}})
	var msg anthropic.Message
	for am.Next() {
		if err := msg.Accumulate(am.Current()); err != nil {
			t.Fatal(err)
		}
	}
	if err := am.Err(); err != nil || len(msg.Content) != 1 || msg.Content[0].Text == "" || msg.Usage.OutputTokens != 4 ||
		msg.Usage.CacheReadInputTokens < 20*vllmtest.BlockSize {
		t.Fatalf("Anthropic stream from vLLM: err %v, message %+v", err, msg)
	}

	// A completion whose prompt is a list of one string is vLLM's to
	// tokenize too: asked again, it finds its KV (hashed over evolve's
	// token ids, the router would see none).
	listPrompt := []string{strings.Repeat("The scheduler orders the runnable tasks by deadline. ", 100)}
	wait.Until(t, 10*time.Second, "a list prompt asked again found on GPU", func() bool {
		var before, after struct {
			GPUHitTokens int64 `json:"gpu_hit_tokens"`
		}
		getJSON(t, orch.ControlURL+"/api/v1/kv", &before)
		if status, _, body := post(t, orch.RouterURL+"/v1/completions", map[string]any{"model": "fake/model",
			"prompt": listPrompt, "max_tokens": 2}); status != 200 {
			t.Fatalf("list prompt: %d %v", status, body)
		}
		getJSON(t, orch.ControlURL+"/api/v1/kv", &after)
		return after.GPUHitTokens-before.GPUHitTokens >= 20*vllmtest.BlockSize
	})

	// A prompt vLLM refuses is the client's error, refused as vLLM does
	// (by the router, before vLLM's /tokenize is asked).
	status, _, body := post(t, orch.RouterURL+"/v1/chat/completions", map[string]any{"model": "fake/model",
		"messages": []map[string]any{{"role": "wizard", "content": "abracadabra"}}})
	if status != 400 || !strings.Contains(obj(body["error"])["message"].(string), `"wizard"`) {
		t.Fatalf("bad prompt: %d %v", status, body)
	}

	// evolve bench runs agents against vLLM engines; their KV is reported
	// as vLLM reports it (cached tokens), there being no evolve breakdown.
	out, code := runBinOut(t, nil, "bench", "--url", orch.RouterURL, "--workload", "coding", "--agents", "2", "--duration", "3s")
	if code != 0 || !strings.Contains(out, "errors") || !strings.Contains(out, "cached, as the engines report it") || strings.Contains(out, " 0 completed") {
		t.Fatalf("bench against vLLM engines: exit %d\n%s", code, out)
	}

	// Their throughput shows, counted from vLLM's token counters.
	wait.Until(t, 10*time.Second, "tokens per second of the vLLM nodes", func() bool {
		var nodes []map[string]any
		getJSON(t, orch.ControlURL+"/api/v1/nodes", &nodes)
		busy := 0
		for _, n := range nodes {
			if num(n["tokens_per_s"]) > 0 {
				busy++
			}
		}
		return busy > 0
	})

	// Stopping the agent stops the vLLM it started, and the node leaves.
	pre.stop(t)
	if c, err := net.DialTimeout("tcp", listen, time.Second); err == nil {
		c.Close()
		t.Fatal("the started vLLM still listens after its agent stopped")
	}
	wait.Until(t, 10*time.Second, "the prefill node gone", func() bool {
		var nodes []map[string]any
		getJSON(t, orch.ControlURL+"/api/v1/nodes", &nodes)
		for _, n := range nodes {
			if n["id"] == "vllm-pre" && n["state"] == "serving" {
				return false
			}
		}
		return true
	})
}

// vLLM without a KV connector cannot hand a prefill's KV to a decode
// engine: the request is served on the decode engine alone, and the
// orchestrator's log says which flag vLLM needs.
func TestVLLMWithoutConnectorSaysWhy(t *testing.T) {
	orch, log := startOrchestratorLog(t)
	for _, role := range []string{"prefill", "decode"} {
		srv, err := vllmtest.Start(t.Context(), vllmtest.Options{NoConnector: true}, "", "", "")
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Close()
		base := srv.URL
		if role == "decode" {
			base += "/v1/" // an OpenAI client's base URL names the server too
		}
		startEngine(t, "--backend", "vllm", "--vllm-url", base, "--kv-events", srv.Events, "--kv-replay", srv.Replay,
			"--id", "v-"+role, "--role", role, "--nats", orch.NATSURL)
	}
	wait.Until(t, 20*time.Second, "both serving", func() bool {
		var nodes []map[string]any
		getJSON(t, orch.ControlURL+"/api/v1/nodes", &nodes)
		return len(nodes) == 2 && nodes[0]["state"] == "serving" && nodes[1]["state"] == "serving"
	})
	status, _, body := post(t, orch.RouterURL+"/v1/completions", map[string]any{"model": "fake/model", "max_tokens": 2,
		"prompt": strings.Repeat("a long prompt that is worth prefilling elsewhere ", 200)})
	if status != 200 {
		t.Fatalf("without a connector: %d %v", status, body)
	}
	// The orchestrator's log reaches the test through a pipe, maybe after
	// the answer.
	wait.Until(t, 10*time.Second, "the orchestrator's log to say what vLLM lacks", func() bool {
		return strings.Contains(log.String(), `needs --kv-transfer-config '{\"kv_connector\":\"NixlConnector\"`)
	})
}

// A vLLM server of several data-parallel ranks publishes each rank's KV
// events on a port of its own, which the agent does not follow: it says
// so, and what to run instead.
func TestVLLMDataParallelRanksAreNamed(t *testing.T) {
	orch := startOrchestrator(t)
	exe, _ := useFakeVLLM(t)
	p := startEngine(t, "--backend", "vllm", "--listen", freePort(t), "--id", "vllm-dp",
		"--kv-events-port", portOf(t, freePort(t)), "--kv-replay-port", portOf(t, freePort(t)), "--nats", orch.NATSURL,
		"--", exe, "serve", "fake/model", "--data-parallel-size", "2")
	log := p.logText()
	if !strings.Contains(log, `"level":"WARN","msg":"vLLM runs 2 data-parallel ranks`) || !strings.Contains(log, "engines: N") {
		t.Fatalf("the agent does not warn of the ranks it cannot follow:\n%s", log)
	}
}

// A server that names a first block's parent 0 (llm-d-inference-sim's
// default format) has its blocks in the directory: before, every one was
// dropped as an orphan, silently, and the node showed none. One whose
// first blocks name a parent never stored has them left out, and says so:
// in evolve nodes -o wide and -o json, in a metric, and in the engine's
// log, with the cause.
func TestVLLMKVBlocksLeftOutAreCountedAndZeroParentsKept(t *testing.T) {
	orch := startOrchestrator(t)
	zero, lost := uint64(0), uint64(0xdead)
	var engines []*proc
	var servers []*vllmtest.Server
	for i, parent := range []*uint64{&zero, &lost} {
		srv, err := vllmtest.Start(t.Context(), vllmtest.Options{FirstParent: parent}, "", "", "")
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Close()
		servers = append(servers, srv)
		engines = append(engines, startEngine(t, "--backend", "vllm", "--vllm-url", srv.URL, "--kv-events", srv.Events, "--kv-replay", srv.Replay,
			"--id", fmt.Sprint("v", i), "--role", "decode", "--nats", orch.NATSURL))
	}
	var nodes []map[string]any
	sent, last := 0, time.Time{}
	wait.Until(t, 15*time.Second, "v0's blocks in the directory and v1's counted as left out", func() bool {
		if time.Since(last) > 300*time.Millisecond {
			// Requests straight to the servers, a new prompt each time (the
			// first may go before the agents' subscriptions are up).
			last, sent = time.Now(), sent+1
			for i, srv := range servers {
				body := map[string]any{"model": "fake/model", "prompt": fmt.Sprint(sent, strings.Repeat(" a prompt long enough for several blocks", 20)), "max_tokens": 2}
				if code, _, out := post(t, srv.URL+"/v1/completions", body); code != 200 {
					t.Fatalf("server %d: %d %v", i, code, out)
				}
			}
		}
		getJSON(t, orch.ControlURL+"/api/v1/nodes", &nodes)
		got := map[string]map[string]any{}
		for _, n := range nodes {
			got[fmt.Sprint(n["id"])] = n
		}
		return got["v0"] != nil && got["v1"] != nil && got["v0"]["gpu_blocks_cached"].(float64) > 5 &&
			got["v0"]["kv_blocks_left_out"] == nil && got["v1"]["kv_blocks_left_out"] != nil
	})
	for _, n := range nodes {
		if n["id"] == "v1" && !strings.Contains(fmt.Sprint(n["kv_left_out_why"]), "parent block 57005 was never stored") {
			t.Fatalf("why v1's blocks were left out: %v", n["kv_left_out_why"])
		}
	}
	out, code := runBinOut(t, nil, "nodes", "-o", "wide", "--server", orch.ControlURL)
	if code != 0 || !strings.Contains(out, "LEFT-OUT") {
		t.Fatalf("evolve nodes -o wide: %d\n%s", code, out)
	}
	wait.Until(t, 5*time.Second, "the engine's log says why", func() bool {
		return strings.Contains(engines[1].logText(), "KV blocks left out of the router's directory")
	})
	found := false
	for _, line := range scrape(t, http.DefaultClient, orch.RouterURL) {
		if strings.HasPrefix(line, `evolve_node_kv_blocks_left_out_total{node="v1"}`) && sampleValue(line) > 0 {
			found = true
		}
	}
	if !found {
		t.Fatal("no evolve_node_kv_blocks_left_out_total for v1 above 0")
	}
}
