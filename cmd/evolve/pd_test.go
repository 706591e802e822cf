package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// A prefill engine and a decode engine, two processes, exchange a request's
// KV with vLLM's kv_transfer_params flow.
func TestPrefillDecodeAcrossTwoEngineProcesses(t *testing.T) {
	pre := startEngine(t, "--profile", "tiny", "--speedup", "20", "--role", "prefill", "--id", "pre")
	dec := startEngine(t, "--profile", "tiny", "--speedup", "20", "--role", "decode", "--id", "dec")
	prompt := strings.Repeat("Summarise the change to the scheduler and its tests. ", 30)

	// Step 1: the prefill leg, as a router sends it.
	status, _, body := post(t, pre.url+"/v1/completions", map[string]any{
		"model": "evolve-tiny", "prompt": prompt, "max_tokens": 1, "stream": false,
		"kv_transfer_params": map[string]any{"do_remote_decode": true, "do_remote_prefill": false,
			"remote_engine_id": nil, "remote_block_ids": nil, "remote_host": nil, "remote_port": nil},
	})
	if status != 200 {
		t.Fatalf("prefill leg: %d %v", status, body)
	}
	params := obj(body["kv_transfer_params"])
	promptTokens := int(num(obj(body["usage"])["prompt_tokens"]))
	fullBlocks := promptTokens / 16
	if params["do_remote_prefill"] != true || params["remote_engine_id"] != "pre" || params["remote_host"] != "127.0.0.1" ||
		num(params["remote_port"]) == 0 || len(params["remote_block_ids"].([]any)) != fullBlocks {
		t.Fatalf("prefill leg's kv_transfer_params: %v", params)
	}
	if n := metric(t, pre.url, "evolve_engine_held_requests"); n != 1 {
		t.Fatalf("prefill engine holds %v requests' KV, want 1", n)
	}

	// A decode engine refuses prefill legs; a prefill engine refuses decode legs.
	status, hdr, body := post(t, dec.url+"/v1/completions", map[string]any{"prompt": "x", "kv_transfer_params": map[string]any{"do_remote_decode": true}})
	if status != 503 || hdr.Get("Retry-After") == "" || obj(body["error"])["code"] != "wrong_role" {
		t.Fatalf("decode engine took a prefill leg: %d %v", status, body)
	}
	status, _, _ = post(t, pre.url+"/v1/completions", map[string]any{"prompt": "x", "kv_transfer_params": params})
	if status != 503 {
		t.Fatalf("prefill engine took a decode leg: %d", status)
	}

	// Step 2: the decode leg, through the OpenAI client, with the params.
	c := client(dec)
	resp, err := c.Completions.New(context.Background(), openai.CompletionNewParams{
		Model: "evolve-tiny", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String(prompt)}, MaxTokens: openai.Int(20),
	}, option.WithJSONSet("kv_transfer_params", params))
	if err != nil {
		t.Fatal(err)
	}
	var ext struct {
		Transferred int    `json:"transferred_tokens"`
		Computed    int    `json:"computed_tokens"`
		Engine      string `json:"engine"`
		PullError   string `json:"pull_error"`
	}
	if err := json.Unmarshal([]byte(resp.JSON.ExtraFields["evolve"].Raw()), &ext); err != nil {
		t.Fatalf("decode response has no evolve object: %v", err)
	}
	if ext.Engine != "dec" || ext.PullError != "" || ext.Transferred != fullBlocks*16 || ext.Computed != promptTokens-fullBlocks*16 {
		t.Fatalf("decode leg: %+v; want %d transferred and %d computed (the partial block)", ext, fullBlocks*16, promptTokens-fullBlocks*16)
	}
	if resp.Usage.CompletionTokens != 20 || resp.Usage.PromptTokensDetails.CachedTokens != int64(fullBlocks*16) {
		t.Fatalf("decode usage: %+v", resp.Usage)
	}
	if b := metric(t, dec.url, "vllm:nixl_bytes_transferred"); b != float64(fullBlocks*16*1024) {
		t.Fatalf("decode engine counted %v bytes transferred", b)
	}

	// The pull ended the hold: the KV is cached, not held, and cannot be pulled twice.
	if n := metric(t, pre.url, "evolve_engine_held_requests"); n != 0 {
		t.Fatalf("prefill engine still holds %v requests", n)
	}
	status, _, _ = post(t, pre.url+"/evolve/v1/kv/pull", map[string]any{"remote_request_id": params["remote_request_id"]})
	if status != 404 {
		t.Fatalf("second pull: %d", status)
	}

	// A decode leg whose peer is gone recomputes and says why.
	pre.kill()
	status, _, body = post(t, dec.url+"/v1/completions", map[string]any{"prompt": prompt + " again", "max_tokens": 2, "kv_transfer_params": params})
	ev := obj(body["evolve"])
	if status != 200 || ev["pull_error"] == "" || num(ev["transferred_tokens"]) != 0 {
		t.Fatalf("decode leg with a dead peer: %d %v", status, body)
	}
}
