package main

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/openai/openai-go/v3"
)

// With --model-alias, clients that name models of their own reach the
// served one: Claude Code's claude-* names through the Messages API and
// count_tokens, an OpenAI client's hard-coded gpt-4o through chat
// completions (the engine, which checks the name, gets the served one),
// and the models endpoints describe them; other names still get a 404
// that lists the aliases, and a pattern that cannot be read stops the
// orchestrator with exit code 2.
func TestModelAliases(t *testing.T) {
	c := upCluster(t, "--engines", "1", "--model-alias", "claude-*", "--model-alias", "gpt-4o")
	if a, _ := c.up["model_aliases"].([]any); len(a) != 2 || a[0] != "claude-*" {
		t.Fatalf("evolve up -o json: model aliases %v", c.up["model_aliases"])
	}
	ctx := context.Background()
	ac := c.anthropic()
	msg := []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Summarise the diff."))}
	m, err := ac.Messages.New(ctx, anthropic.MessageNewParams{Model: "claude-haiku-4-5-20251001", MaxTokens: 8, Messages: msg})
	if err != nil || len(m.Content) != 1 || m.Content[0].Text == "" || m.Usage.OutputTokens != 8 {
		t.Fatalf("a message for claude-haiku: %v %+v", err, m)
	}
	n, err := ac.Messages.CountTokens(ctx, anthropic.MessageCountTokensParams{Model: "claude-sonnet-4-5", Messages: msg})
	if err != nil || n.InputTokens != m.Usage.InputTokens+m.Usage.CacheReadInputTokens {
		t.Fatalf("count_tokens for claude-sonnet: %v %+v, the message's usage %+v", err, n, m.Usage)
	}
	oc := c.client()
	r, err := oc.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "gpt-4o", MaxTokens: openai.Int(4),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}})
	if err != nil || r.Usage.CompletionTokens != 4 {
		t.Fatalf("chat for gpt-4o: %v %+v", err, r)
	}
	status, _, body := post(t, c.state.RouterURL+"/v1/completions", `{"model": "llama-3", "prompt": "hi", "max_tokens": 2}`)
	if e := obj(body["error"]); status != 404 || !strings.Contains(e["message"].(string), "also as claude-*, gpt-4o") {
		t.Fatalf("unknown model: %d %v", status, body)
	}
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	getJSON(t, c.state.RouterURL+"/v1/models", &list)
	if len(list.Data) != 2 || list.Data[0].ID != "evolve-tiny" || list.Data[1].ID != "gpt-4o" {
		t.Fatalf("models %+v: want the served model and gpt-4o", list.Data)
	}
	info, err := ac.Models.Get(ctx, "claude-opus-4-1", anthropic.ModelGetParams{})
	if err != nil || info.ID != "claude-opus-4-1" {
		t.Fatalf("GET /v1/models/claude-opus-4-1: %v %+v", err, info)
	}
	resp, err := http.Get(c.state.RouterURL + "/v1/models/mistral")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 404 {
		t.Fatalf("GET /v1/models/mistral: %d", resp.StatusCode)
	}

	out, code := runBin(t, nil, "orchestrator", "--model-alias", "claude-[", "--router-addr", "127.0.0.1:0",
		"--control-addr", "127.0.0.1:0", "--nats-listen", "127.0.0.1:0", "--data-dir", t.TempDir())
	if code != 2 || !strings.Contains(out, `model alias "claude-["`) {
		t.Fatalf("a bad alias pattern: exit %d\n%s", code, out)
	}
}
