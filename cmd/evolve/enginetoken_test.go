package main

import (
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/evolvellm/evolve/engine/vllm/vllmtest"
	"github.com/evolvellm/evolve/internal/wait"
)

// withToken is a NATS URL with the event plane's token in it.
func withToken(natsURL, token string) string {
	return strings.Replace(natsURL, "://", "://"+token+"@", 1)
}

// Engines that join with the event plane's token take requests from the
// router (which sends it) and from each other (a decode engine pulling a
// prefill's KV), and refuse whoever else reaches their ports: the router's
// API keys cannot be bypassed there.
func TestEnginesServeOnlyTheClusterWithTheEventPlanesToken(t *testing.T) {
	// Dynamo's policy splits every request between the two.
	orch, _ := startOrchestratorLog(t, "--nats-token", "s3cret", "--policy", "dynamo")
	nats := withToken(orch.NATSURL, "s3cret")
	pre := startEngine(t, "--profile", "tiny", "--speedup", "20", "--role", "prefill", "--id", "pre", "--nats", nats)
	startEngine(t, "--profile", "tiny", "--speedup", "20", "--role", "decode", "--id", "dec", "--nats", nats)
	wait.Until(t, 10*time.Second, "both engines serving", func() bool { return servingNodes(t, orch.ControlURL) == 2 })

	prompt := strings.Repeat("Find where the scheduler drops a request and fix it. ", 20)
	req := map[string]any{"prompt": prompt, "max_tokens": 8}
	if status, _, body := post(t, pre.url+"/v1/completions", req); status != 401 || obj(body["error"])["code"] != "invalid_engine_token" {
		t.Fatalf("an engine's port without the token: %d %v", status, body)
	}
	if s := statusOf(t, http.DefaultClient, "GET", pre.url+"/health", ""); s != 200 {
		t.Fatalf("/health without the token: %d", s)
	}
	if s := statusOf(t, http.DefaultClient, "GET", pre.url+"/v1/models", "Bearer s3cret"); s != 200 {
		t.Fatalf("/v1/models with the token: %d", s)
	}
	ready := pre.logText()
	if !strings.Contains(ready, `"requires_token":true`) || strings.Contains(ready, "s3cret") {
		t.Fatalf("the engine's log should say it requires a token, and never show it:\n%s", ready)
	}

	if got := tokenRequired(t, orch.ControlURL); got["pre"] != true || got["dec"] != true {
		t.Fatalf("nodes' token_required: %v", got)
	}

	status, _, body := post(t, orch.RouterURL+"/v1/completions", req)
	ev := obj(body["evolve"])
	if status != 200 || num(obj(body["usage"])["completion_tokens"]) != 8 || ev["engine"] != "dec" || ev["pull_error"] != nil ||
		num(ev["transferred_tokens"]) == 0 {
		t.Fatalf("through the router, split between the engines: %d %v", status, body)
	}
}

// An engine whose token is not the router's is refused as a failed engine,
// not as the client's fault: the router routes again, and when no engine
// takes its token the client's error and the log say what to set.
func TestAnEngineWithAnotherTokenIsRoutedAround(t *testing.T) {
	orch, log := startOrchestratorLog(t, "--nats-token", "s3cret")
	nats := withToken(orch.NATSURL, "s3cret")
	startEngine(t, "--profile", "tiny", "--speedup", "20", "--id", "odd", "--nats", nats, "--token", "another")
	wait.Until(t, 10*time.Second, "the engine serving", func() bool { return servingNodes(t, orch.ControlURL) == 1 })
	req := map[string]any{"prompt": "Hello", "max_tokens": 2}
	status, _, body := post(t, orch.RouterURL+"/v1/completions", req)
	// The client's error is public (a retry and the request id); the log
	// says what to set.
	if msg, _ := obj(body["error"])["message"].(string); status != 503 || !strings.Contains(msg, "retry (request evolve-") {
		t.Fatalf("the only engine refuses the router's token: %d %v", status, body)
	}
	wait.Until(t, 5*time.Second, "the orchestrator's log saying why", func() bool {
		return strings.Contains(log.String(), "engine refused the router's engine token")
	})

	// --token none serves anyone; the router's token does it no harm.
	open := startEngine(t, "--profile", "tiny", "--speedup", "20", "--id", "open", "--nats", nats, "--token", "none")
	if status, _, body := post(t, open.url+"/v1/completions", req); status != 200 {
		t.Fatalf("an engine with --token none: %d %v", status, body)
	}
	wait.Until(t, 10*time.Second, "both engines serving", func() bool { return servingNodes(t, orch.ControlURL) == 2 })
	// The orchestrator, which has a token, says the open one serves anyone.
	wait.Until(t, 5*time.Second, "the warning of an open engine", func() bool {
		return strings.Contains(log.String(), "engine serves its port to anyone") && strings.Contains(log.String(), "id=open")
	})
	if out, code := runBin(t, nil, "nodes", "-o", "wide", "--server", orch.ControlURL); code != 0 ||
		!regexp.MustCompile(`(?m)^open .* open +http://`).MatchString(out) || !regexp.MustCompile(`(?m)^odd .* required +http://`).MatchString(out) {
		t.Fatalf("evolve nodes -o wide: exit %d\n%s", code, out)
	}
	for i := range 4 {
		if status, _, body := post(t, orch.RouterURL+"/v1/completions", req); status != 200 {
			t.Fatalf("request %d with an engine that takes the router's token: %d %v", i, status, body)
		}
	}
}

// A vLLM server the agent starts gets the engine token as its API key;
// one it joins with another key stops the agent at once with the fix; a
// vLLM command with its own --api-key is refused before anything starts.
func TestVLLMGetsTheEngineTokenAsItsAPIKey(t *testing.T) {
	orch, _ := startOrchestratorLog(t, "--nats-token", "s3cret")
	nats := withToken(orch.NATSURL, "s3cret")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("EVOLVE_TEST_FAKE_VLLM", "1")
	listen := freePort(t)
	vllmArgs := func() []string {
		return []string{"--backend", "vllm", "--kv-events-port", portOf(t, freePort(t)), "--kv-replay-port", portOf(t, freePort(t)), "--nats", nats}
	}
	startEngine(t, append(append(vllmArgs(), "--listen", listen, "--id", "vllm-a"), "--", exe, "serve", "fake/model")...)
	if s := statusOf(t, http.DefaultClient, "GET", "http://"+listen+"/v1/models", ""); s != 401 {
		t.Fatalf("the started vLLM's /v1/models without the token: %d, want 401", s)
	}
	wait.Until(t, 10*time.Second, "the vLLM engine serving", func() bool { return servingNodes(t, orch.ControlURL) == 1 })
	if got := tokenRequired(t, orch.ControlURL); got["vllm-a"] != true {
		t.Fatalf("the vLLM node's token_required: %v (vLLM refuses requests without it)", got)
	}
	status, _, body := post(t, orch.RouterURL+"/v1/chat/completions", map[string]any{"model": "fake/model", "max_tokens": 3,
		"messages": []map[string]any{{"role": "user", "content": "Read the scheduler."}}})
	if status != 200 {
		t.Fatalf("through the router to vLLM with its key: %d %v", status, body)
	}

	srv, err := vllmtest.Start(t.Context(), vllmtest.Options{APIKey: "not-the-token"}, "", "", "")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	out, code := runBin(t, nil, "engine", "--backend", "vllm", "--vllm-url", srv.URL, "--kv-events", srv.Events, "--kv-replay", srv.Replay,
		"--id", "vllm-b", "--nats", nats, "--vllm-start-timeout", "1m")
	if code != 1 || !strings.Contains(out, "vLLM refused the engine token") || strings.Contains(out, "is not ready") {
		t.Fatalf("joining a vLLM with another key: exit %d\n%s", code, out)
	}

	out, code = runBin(t, nil, append(append([]string{"engine"}, vllmArgs()...), "--listen", freePort(t), "--",
		exe, "serve", "fake/model", "--api-key", "mine")...)
	if code != 2 || !strings.Contains(out, "sets --api-key") {
		t.Fatalf("a vLLM command with its own --api-key: exit %d\n%s", code, out)
	}
}

// tokenRequired is each node's token_required, by id, as evolve nodes
// -o json says.
func tokenRequired(t *testing.T, controlURL string) map[string]any {
	t.Helper()
	var nodes []map[string]any
	getJSON(t, controlURL+"/api/v1/nodes", &nodes)
	out := map[string]any{}
	for _, n := range nodes {
		out[n["id"].(string)] = n["token_required"]
	}
	return out
}
