package main

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/evolvellm/evolve/internal/wait"
)

func (c *localCluster) anthropic() anthropic.Client {
	return anthropic.NewClient(aoption.WithBaseURL(c.state.RouterURL), aoption.WithAPIKey("unused"), aoption.WithMaxRetries(0))
}

// An agent that speaks Anthropic's Messages API, as Claude Code does, is
// served by the router with the official SDK: whole and streamed answers,
// token counts that agree with the usage, the second turn's prompt read
// from the KV the first left, its session named by its metadata, and
// errors in Anthropic's shape.
func TestMessagesAPIThroughRouter(t *testing.T) {
	c := upCluster(t, "--engines", "2", "--prefill", "1")
	ac := c.anthropic()
	ctx := context.Background()
	system := []anthropic.TextBlockParam{{Text: strings.Repeat("You are a careful coding agent. ", 40)}}
	first := anthropic.NewUserMessage(anthropic.NewTextBlock("Read main.go and fix the failing test."))
	meta := anthropic.MetadataParam{UserID: anthropic.String("user_0a1b_account_7_session_agent-42")}

	count, err := ac.Messages.CountTokens(ctx, anthropic.MessageCountTokensParams{
		Model: "evolve-tiny", System: anthropic.MessageCountTokensParamsSystemUnion{OfTextBlockArray: system},
		Messages: []anthropic.MessageParam{first}})
	if err != nil {
		t.Fatal(err)
	}
	m, err := ac.Messages.New(ctx, anthropic.MessageNewParams{Model: "evolve-tiny", MaxTokens: 24, System: system,
		Messages: []anthropic.MessageParam{first}, Metadata: meta})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(m.ID, "msg_") || m.Model != "evolve-tiny" || m.StopReason != anthropic.StopReasonMaxTokens ||
		len(m.Content) != 1 || m.Content[0].Type != "text" || m.Content[0].Text == "" {
		t.Fatalf("message %+v", m)
	}
	// Tool definitions are part of the prompt.
	withTool, err := ac.Messages.CountTokens(ctx, anthropic.MessageCountTokensParams{
		Model: "evolve-tiny", System: anthropic.MessageCountTokensParamsSystemUnion{OfTextBlockArray: system},
		Messages: []anthropic.MessageParam{first},
		Tools: []anthropic.MessageCountTokensToolUnionParam{{OfTool: &anthropic.ToolParam{Name: "Read", Description: anthropic.String("Read a file"),
			InputSchema: anthropic.ToolInputSchemaParam{Properties: map[string]any{"path": map[string]any{"type": "string"}}}}}}})
	if err != nil || withTool.InputTokens <= count.InputTokens+10 {
		t.Fatalf("count with a tool: %v %+v against %d", err, withTool, count.InputTokens)
	}
	if u := m.Usage; u.OutputTokens != 24 || u.InputTokens+u.CacheReadInputTokens != count.InputTokens || count.InputTokens < 300 {
		t.Fatalf("usage %+v against count_tokens %d", u, count.InputTokens)
	}

	// The second turn, streamed: the first turn's prompt and answer are
	// its prefix, and their KV is read, not computed again.
	stream := ac.Messages.NewStreaming(ctx, anthropic.MessageNewParams{Model: "evolve-tiny", MaxTokens: 16, System: system,
		Messages: []anthropic.MessageParam{first, m.ToParam(), anthropic.NewUserMessage(anthropic.NewTextBlock("Now run the tests."))},
		Metadata: meta})
	var second anthropic.Message
	deltas, started := 0, int64(0)
	for stream.Next() {
		ev := stream.Current()
		if ev.Type == "content_block_delta" {
			deltas++
		}
		if ev.Type == "message_start" {
			// The router's X-Evolve-Prompt-Tokens, split by its
			// X-Evolve-Cached-Tokens.
			started = ev.Message.Usage.InputTokens + ev.Message.Usage.CacheReadInputTokens
		}
		if err := second.Accumulate(ev); err != nil {
			t.Fatal(err)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if second.StopReason != anthropic.StopReasonMaxTokens || second.Usage.OutputTokens != 16 || deltas < 2 ||
		len(second.Content) != 1 || second.Content[0].Text == "" {
		t.Fatalf("streamed message %+v (%d deltas)", second, deltas)
	}
	if u := second.Usage; started != u.InputTokens+u.CacheReadInputTokens {
		t.Fatalf("message_start counted %d prompt tokens, the usage %d", started, u.InputTokens+u.CacheReadInputTokens)
	}
	if u := second.Usage; u.CacheReadInputTokens < count.InputTokens/2 || u.InputTokens+u.CacheReadInputTokens <= count.InputTokens+24 {
		t.Fatalf("second turn's usage %+v: its prefix (%d tokens and the answer) should come from the cache", u, count.InputTokens)
	}

	// The metadata's session is the agent's session.
	out, code := runBinOut(t, c.env, "branches", "--session", "agent-42", "-o", "json")
	if code != 0 || !strings.Contains(out, "agent-42") {
		t.Fatalf("evolve branches --session agent-42: exit %d\n%s", code, out)
	}
	var branches []map[string]any
	if err := json.Unmarshal([]byte(out), &branches); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if len(branches) != 1 || branches[0]["session"] != "agent-42" || branches[0]["turns"] != 2.0 {
		t.Fatalf("the agent's two turns are one branch of its session: %s", out)
	}

	// The models endpoints answer Anthropic's SDK in its shape.
	page, err := ac.Models.List(ctx, anthropic.ModelListParams{})
	if err != nil || len(page.Data) != 1 || page.Data[0].ID != "evolve-tiny" || page.Data[0].Type != "model" || page.HasMore {
		t.Fatalf("models: %v %+v", err, page)
	}
	if info, err := ac.Models.Get(ctx, "evolve-tiny", anthropic.ModelGetParams{}); err != nil || info.ID != "evolve-tiny" || info.CreatedAt.IsZero() {
		t.Fatalf("model: %v %+v", err, info)
	}
	var ae *anthropic.Error
	if _, err := ac.Models.Get(ctx, "claude-opus-4", anthropic.ModelGetParams{}); !errors.As(err, &ae) || ae.StatusCode != 404 ||
		!strings.Contains(ae.RawJSON(), "not_found_error") {
		t.Fatalf("an unknown model: %v", err)
	}
	oc := c.client()
	if m, err := oc.Models.Get(ctx, "evolve-tiny"); err != nil || m.ID != "evolve-tiny" || m.Object != "model" {
		t.Fatalf("OpenAI's client: %v %+v", err, m)
	}

	// A model the cluster does not serve, in Anthropic's words.
	_, err = ac.Messages.New(ctx, anthropic.MessageNewParams{Model: "claude-sonnet-4-5", MaxTokens: 8, Messages: []anthropic.MessageParam{first}})
	if !errors.As(err, &ae) || ae.StatusCode != 404 || !strings.Contains(ae.RawJSON(), "not_found_error") || !strings.Contains(ae.RawJSON(), "evolve-tiny") {
		t.Fatalf("unknown model: %v", err)
	}
	// A server tool cannot be served: refused before any engine.
	_, err = ac.Messages.New(ctx, anthropic.MessageNewParams{Model: "evolve-tiny", MaxTokens: 8, Messages: []anthropic.MessageParam{first},
		Tools: []anthropic.ToolUnionParam{{OfWebSearchTool20250305: &anthropic.WebSearchTool20250305Param{}}}})
	if !errors.As(err, &ae) || ae.StatusCode != 400 || !strings.Contains(ae.RawJSON(), "is not supported") {
		t.Fatalf("a server tool: %v", err)
	}
}

// An engine killed in the middle of an Anthropic stream does not end it:
// the router goes on with the answer on the node that is left, and the
// agent reads the whole message.
func TestMessagesStreamSurvivesItsEngine(t *testing.T) {
	c := upCluster(t, "--engines", "2", "--prefill", "1", "--speedup", "1")
	ac := c.anthropic()
	stream := ac.Messages.NewStreaming(context.Background(), anthropic.MessageNewParams{Model: "evolve-tiny", MaxTokens: 1500,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("tell a very long story"))}},
		aoption.WithJSONSet("ignore_eos", true)) // all 1,500 tokens, vLLM's extension: the engine dies mid-way
	deadline := time.AfterFunc(60*time.Second, func() { t.Error("stream hung after the engine died") })
	defer deadline.Stop()
	var m anthropic.Message
	deltas := 0
	for stream.Next() {
		ev := stream.Current()
		if err := m.Accumulate(ev); err != nil {
			t.Fatal(err)
		}
		if ev.Type != "content_block_delta" {
			continue
		}
		if deltas++; deltas == 5 {
			wait.Until(t, 10*time.Second, "engine-1 reports the stream", func() bool { return c.node("engine-1")["running"] == 1.0 })
			syscall.Kill(c.state.Engines[1], syscall.SIGKILL) // the decode node
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("the stream failed with its engine: %v", err)
	}
	if deltas < 5 || m.StopReason != anthropic.StopReasonMaxTokens || m.Usage.OutputTokens != 1500 || len(m.Content) != 1 {
		t.Fatalf("message after the kill: %d deltas, stop %q, usage %+v", deltas, m.StopReason, m.Usage)
	}
	if v := metric(t, c.state.RouterURL, `evolve_router_resumed_answers_total{cause="engine_failed",outcome="continued"}`); v != 1 {
		t.Fatalf("answers resumed: %v", v)
	}
}
