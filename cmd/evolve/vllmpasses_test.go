package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/evolvellm/evolve/engine/vllm/vllmtest"
	"github.com/evolvellm/evolve/internal/wait"
)

// A vLLM engine started with --pass-metrics-port runs vLLM with
// --forward-pass-metrics-port and hands its forward passes to the
// orchestrator's planner, which learns the engine's pass costs from them
// with no profile: the stand-in times its passes by fixed coefficients,
// and evolve planner reports those coefficients.
func TestVLLMForwardPassesTeachThePlanner(t *testing.T) {
	orch, _ := startOrchestratorLog(t, "--planner", "recommend")
	exe, argsFile := useFakeVLLM(t)
	listen, fpmPort := freePort(t), portOf(t, freePort(t))
	for fpmPort == portOf(t, listen) {
		fpmPort = portOf(t, freePort(t))
	}
	p := startEngine(t, "--backend", "vllm", "--listen", listen, "--id", "vllm-0", "--role", "both",
		"--kv-events-port", portOf(t, freePort(t)), "--kv-replay-port", portOf(t, freePort(t)), "--pass-metrics-port", fpmPort,
		"--nats", orch.NATSURL, "--", exe, "serve", "fake/model", "--max-num-seqs", "64", "--max-num-batched-tokens", "4096")
	if b, err := os.ReadFile(argsFile); err != nil || !strings.Contains(string(b), "--forward-pass-metrics-port\n"+fpmPort+"\n") {
		t.Fatalf("vLLM started without --forward-pass-metrics-port %s (%v):\n%s", fpmPort, err, b)
	}
	wait.Until(t, 20*time.Second, "the vLLM engine serving", func() bool { return servingNodes(t, orch.ControlURL) == 1 })

	// Conversations of growing context, to an agent's 20K tokens: prompts
	// of many lengths, each turn finding the one before it cached, so
	// that the new tokens and the context they attend vary apart.
	words := strings.Fields(strings.Repeat("the scheduler orders runnable tasks by deadline and the planner moves nodes ", 1700))
	type status struct {
		Limits          map[string]int
		Prefill, Decode struct {
			Ready   bool `json:"ready"`
			Samples int  `json:"samples"`
			Coefs   []struct {
				Name  string  `json:"name"`
				Value float64 `json:"value"`
			} `json:"coefficients"`
		}
	}
	var st status
	read := func() {
		out, code := runBinOut(t, nil, "planner", "--server", orch.ControlURL, "-o", "json")
		var raw struct {
			Prefill json.RawMessage `json:"prefill_cost"`
			Decode  json.RawMessage `json:"decode_cost"`
			Limits  map[string]int  `json:"limits"`
		}
		if code != 0 || json.Unmarshal([]byte(out), &raw) != nil || json.Unmarshal(raw.Prefill, &st.Prefill) != nil ||
			json.Unmarshal(raw.Decode, &st.Decode) != nil {
			t.Fatalf("planner -o json: exit %d\n%s", code, out)
		}
		st.Limits = raw.Limits
	}
	for conv := 0; conv < 40; conv++ {
		prompt := fmt.Sprintf("conversation %d:", conv)
		for turn, n := 0, 200+conv*97; turn < 3 && len(prompt)/4+n < len(words); turn, n = turn+1, n*2+conv {
			prompt += " " + strings.Join(words[:n], " ")
			if status, _, body := post(t, orch.RouterURL+"/v1/completions", map[string]any{"model": "fake/model",
				"prompt": prompt, "max_tokens": 2 + conv%3}); status != 200 {
				t.Fatalf("completion: %d %v", status, body)
			}
		}
	}
	wait.Until(t, 20*time.Second, "both cost models trusted", func() bool {
		read()
		return st.Prefill.Ready && st.Decode.Ready
	})
	coef := func(cs []struct {
		Name  string  `json:"name"`
		Value float64 `json:"value"`
	}, name string) float64 {
		for _, c := range cs {
			if c.Name == name {
				return c.Value
			}
		}
		t.Fatalf("no coefficient %s in %+v", name, cs)
		return 0
	}
	near := func(what string, got, want, tol float64) {
		if math.Abs(got-want) > tol*math.Abs(want) {
			t.Errorf("learned %s %.4g, want %.4g within %.0f%%", what, got, want, 100*tol)
		}
	}
	// The planner predicts with the limits vLLM's command line set, and
	// the KV capacity its metrics report.
	if l := st.Limits; l["max_batched_tokens"] != 4096 || l["max_seqs"] != 64 || l["gpu_kv_tokens"] != 4096*vllmtest.BlockSize {
		t.Errorf("the planner's engine limits: %v", l)
	}
	near("prefill base_ms", coef(st.Prefill.Coefs, "base_ms"), vllmtest.PrefillBaseSec*1e3, 0.1)
	near("prefill per_token_us", coef(st.Prefill.Coefs, "per_token_us"), vllmtest.PrefillPerTokenSec*1e6, 0.05)
	near("prefill per_token_context_ns", coef(st.Prefill.Coefs, "per_token_context_ns"), vllmtest.PrefillPerPairSec*1e9, 0.1)
	// Each of the stand-in's decode passes holds one request, so only the
	// sum of the base and per-request costs is there to learn.
	near("decode base_ms + per_seq_us", coef(st.Decode.Coefs, "base_ms")*1e-3+coef(st.Decode.Coefs, "per_seq_us")*1e-6,
		vllmtest.DecodeBaseSec+vllmtest.DecodePerSeqSec, 0.05)
	near("decode per_context_token_ns", coef(st.Decode.Coefs, "per_context_token_ns"), vllmtest.DecodePerContextSec*1e9, 0.2)
	// The node counts the passes it sent, and evolve nodes -o wide shows them.
	var nodes []struct {
		Passes int `json:"passes"`
	}
	getJSON(t, orch.ControlURL+"/api/v1/nodes", &nodes)
	if len(nodes) != 1 || nodes[0].Passes < st.Prefill.Samples+st.Decode.Samples {
		t.Errorf("the node's passes: %+v; the planner learned from %d", nodes, st.Prefill.Samples+st.Decode.Samples)
	}
	out, code := runBinOut(t, nil, "nodes", "--server", orch.ControlURL, "-o", "wide")
	if lines := strings.Split(strings.TrimSpace(out), "\n"); code != 0 || len(lines) != 2 || !strings.Contains(lines[0], "PASSES") ||
		!strings.Contains(lines[1], fmt.Sprintf(" %d ", nodes[0].Passes)) {
		t.Errorf("evolve nodes -o wide: exit %d\n%s", code, out)
	}
	log := p.logText()
	if !strings.Contains(log, "forward passes are arriving") {
		t.Errorf("the agent does not say that vLLM's passes arrive:\n%s", log)
	}
}

// vllmScript makes a vllm command that is a Python script, as vLLM's is,
// whose Python says where its vllm package lies (a package whose engine
// arguments are source) and runs the stand-in vLLM for the script. It returns
// the script and the file where the stand-in writes its arguments.
func vllmScript(t *testing.T, source string) (script, argsFile string) {
	t.Helper()
	exe, argsFile := useFakeVLLM(t)
	dir := t.TempDir()
	pkg := filepath.Join(dir, "site-packages", "vllm")
	if err := os.MkdirAll(filepath.Join(pkg, "engine"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(pkg, "engine", "arg_utils.py"), []byte(source), 0o644)
	python := filepath.Join(dir, "python3")
	os.WriteFile(python, []byte("#!/bin/sh\ncase \"$1\" in -c) echo \"$FAKE_VLLM_PKG\";; *) shift; exec \"$FAKE_VLLM_EXE\" \"$@\";; esac\n"), 0o755)
	script = filepath.Join(dir, "vllm")
	os.WriteFile(script, []byte("#!"+python+"\nfrom vllm.entrypoints.cli.main import main\n"), 0o755)
	t.Setenv("FAKE_VLLM_PKG", pkg)
	t.Setenv("FAKE_VLLM_EXE", exe)
	return script, argsFile
}

// By default an agent whose vLLM release has --forward-pass-metrics-port
// asks it for its forward passes, on a free port, and they reach the
// planner: nothing to configure.
func TestVLLMForwardPassesByDefault(t *testing.T) {
	orch := startOrchestrator(t)
	script, argsFile := vllmScript(t, "forward_pass_metrics_port: int = 0\n")
	startEngine(t, "--backend", "vllm", "--listen", freePort(t), "--id", "vllm-new",
		"--kv-events-port", portOf(t, freePort(t)), "--kv-replay-port", portOf(t, freePort(t)),
		"--nats", orch.NATSURL, "--", script, "serve", "fake/model")
	wait.Until(t, 20*time.Second, "the vLLM engine serving", func() bool { return servingNodes(t, orch.ControlURL) == 1 })
	if b, err := os.ReadFile(argsFile); err != nil || !strings.Contains(string(b), "--forward-pass-metrics-port\n") {
		t.Fatalf("vLLM started without --forward-pass-metrics-port (%v):\n%s", err, b)
	}
	wait.Until(t, 20*time.Second, "passes from the node", func() bool {
		if status, _, body := post(t, orch.RouterURL+"/v1/completions", map[string]any{"model": "fake/model",
			"prompt": "count the passes", "max_tokens": 3}); status != 200 {
			t.Fatalf("completion: %d %v", status, body)
		}
		var nodes []struct {
			Passes int `json:"passes"`
		}
		getJSON(t, orch.ControlURL+"/api/v1/nodes", &nodes)
		return len(nodes) == 1 && nodes[0].Passes > 0
	})
}

// Asked for forward-pass metrics, an agent whose vLLM release has no
// --forward-pass-metrics-port (which would refuse to start with it)
// starts it without the flag, serves, and says why the planner cannot
// learn its costs.
func TestVLLMWithoutForwardPassMetricsStartsWithoutTheFlag(t *testing.T) {
	orch := startOrchestrator(t)
	script, argsFile := vllmScript(t, "kv_events_config = None\n")

	p := startEngine(t, "--backend", "vllm", "--listen", freePort(t), "--id", "vllm-old",
		"--kv-events-port", portOf(t, freePort(t)), "--kv-replay-port", portOf(t, freePort(t)), "--pass-metrics-port", portOf(t, freePort(t)),
		"--nats", orch.NATSURL, "--", script, "serve", "fake/model")
	wait.Until(t, 20*time.Second, "the vLLM engine serving", func() bool { return servingNodes(t, orch.ControlURL) == 1 })
	b, err := os.ReadFile(argsFile)
	if err != nil || !strings.Contains(string(b), "serve\nfake/model\n") || strings.Contains(string(b), "forward-pass") {
		t.Fatalf("vLLM started with (%v):\n%s", err, b)
	}
	log := p.logText()
	if !strings.Contains(log, "this vLLM release has no --forward-pass-metrics-port") {
		t.Fatalf("the agent does not say why vLLM starts without its forward-pass metrics:\n%s", log)
	}
	var nodes []map[string]any
	getJSON(t, orch.ControlURL+"/api/v1/nodes", &nodes)
	if len(nodes) != 1 || nodes[0]["passes"] != 0.0 {
		t.Fatalf("a node without pass metrics: %v", nodes)
	}
}
