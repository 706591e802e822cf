package main

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/evolvellm/evolve/internal/wait"
)

// llmdSim is the path of llm-d-inference-sim, a Go server that speaks
// vLLM's protocol but differs from vLLM: $EVOLVE_LLMD_SIM, else
// llm-d-inference-sim on the PATH; the test is skipped, saying how to
// build it, when there is none.
func llmdSim(t *testing.T) string {
	if p := os.Getenv("EVOLVE_LLMD_SIM"); p != "" {
		return p
	}
	p, err := exec.LookPath("llm-d-inference-sim")
	if err != nil {
		t.Skip("llm-d-inference-sim not found: build it from github.com/llm-d/llm-d-inference-sim (go build ./cmd/llm-d-inference-sim, " +
			"with a replace for github.com/llm-d/llm-d-router, which the module proxy does not serve) and set EVOLVE_LLMD_SIM to it")
	}
	return p
}

// startLLMDSim runs llm-d-inference-sim in its default KV-event format
// (first blocks' parents 0, sequences from 1, a PUB socket that connects,
// replies tagged with the topic) and returns its URL and event endpoints.
func startLLMDSim(t *testing.T, bin string) (url, events, replay string) {
	t.Helper()
	port, events, replay := freePort(t), "tcp://"+freePort(t), "tcp://"+freePort(t)
	cmd := exec.Command(bin, "--model", "fake/model", "--port", portOf(t, port), "--enable-kvcache", "--kv-cache-size", "4096",
		"--max-model-len", "32768", "--zmq-endpoint", events, "--kv-events-replay-endpoint", replay, "--force-dummy-tokenizer")
	cmd.Env = append(os.Environ(), "POD_IP=127.0.0.1") // it needs one for its KV cache
	log := &lockedLog{}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("llm-d-inference-sim on %s:\n%s", port, log.String())
		}
	})
	return "http://" + port, events, replay
}

// Three llm-d-inference-sim servers, attached as vLLM engines, serve
// through evolve's router: their KV events reach the directory (none
// left out in the simulator's default format), a prompt's prefix is
// found on a second turn, a long prompt is split into a prefill leg and a
// decode leg, and a node switched from decode to prefill serves as one.
func TestLLMDInferenceSimCluster(t *testing.T) {
	bin := llmdSim(t)
	orch := startOrchestrator(t)
	roles := []string{"prefill", "decode", "decode"}
	for i, role := range roles {
		url, events, replay := startLLMDSim(t, bin)
		startEngine(t, "--backend", "vllm", "--vllm-url", url, "--kv-events", events, "--kv-events-bind", "--kv-replay", replay,
			"--id", fmt.Sprint("sim", i), "--role", role, "--nats", orch.NATSURL)
	}
	wait.Until(t, 20*time.Second, "three simulators serving", func() bool { return servingNodes(t, orch.ControlURL) == 3 })

	context := strings.Repeat("the repository's context, read at every turn of the agent ", 60)
	ask := func(prompt string) http.Header {
		t.Helper()
		code, h, body := post(t, orch.RouterURL+"/v1/completions", map[string]any{"model": "fake/model", "prompt": prompt, "max_tokens": 8})
		if code != 200 {
			t.Fatalf("a request: %d %v", code, body)
		}
		return h
	}
	h := ask(context + "first turn")
	if h.Get("X-Evolve-Prefill-Node") != "sim0" || h.Get("X-Evolve-Decode-Node") == "sim0" {
		t.Fatalf("a long prompt was served by prefill %q, decode %q: want a split with sim0 prefilling",
			h.Get("X-Evolve-Prefill-Node"), h.Get("X-Evolve-Decode-Node"))
	}
	var kvst struct {
		Blocks       int   `json:"blocks"`
		GPUHitTokens int64 `json:"gpu_hit_tokens"`
	}
	wait.Until(t, 10*time.Second, "the first turn's blocks in the directory", func() bool {
		getJSON(t, orch.ControlURL+"/api/v1/kv", &kvst)
		return kvst.Blocks > 20
	})
	var nodes []map[string]any
	getJSON(t, orch.ControlURL+"/api/v1/nodes", &nodes)
	for _, n := range nodes {
		if n["kv_blocks_left_out"] != nil {
			t.Fatalf("node %v left %v blocks out: %v", n["id"], n["kv_blocks_left_out"], n["kv_left_out_why"])
		}
	}
	before := kvst.GPUHitTokens
	ask(context + "second turn")
	getJSON(t, orch.ControlURL+"/api/v1/kv", &kvst)
	if kvst.GPUHitTokens-before < 20*16 {
		t.Fatalf("the second turn found %d prompt tokens cached, want its shared prefix", kvst.GPUHitTokens-before)
	}

	// sim1 becomes a prefill node and prefills.
	if out, code := runBinOut(t, nil, "role", "set", "sim1", "prefill", "--server", orch.ControlURL); code != 0 {
		t.Fatalf("evolve role set: %d %s", code, out)
	}
	wait.Until(t, 20*time.Second, "sim1 prefilling", func() bool {
		getJSON(t, orch.ControlURL+"/api/v1/nodes", &nodes)
		for _, n := range nodes {
			if n["id"] == "sim1" {
				return n["role"] == "prefill" && n["state"] == "serving"
			}
		}
		return false
	})
	for i := range 6 {
		if h := ask(fmt.Sprintf("%d %s", i, context)); h.Get("X-Evolve-Decode-Node") != "sim2" {
			t.Fatalf("with sim0 and sim1 prefilling, a request decoded on %q", h.Get("X-Evolve-Decode-Node"))
		}
	}
}
