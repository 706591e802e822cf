package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/openai/openai-go/v3"
)

// A request that requires a tool call gets one from the simulated
// engines, through the router, in both APIs: whole and streamed, the call
// of the named tool with the generated text in its first string
// parameter, its turn ended for the call. The next turn, with the tool's
// result, extends the prompt that asked for the call, and its answer,
// with tool_choice auto, is text.
func TestToolCallsThroughRouter(t *testing.T) {
	c := upCluster(t, "--engines", "2", "--prefill", "1")
	ctx := context.Background()
	ac := c.anthropic()
	read := anthropic.ToolParam{Name: "Read", Description: anthropic.String("Read a file"),
		InputSchema: anthropic.ToolInputSchemaParam{Properties: map[string]any{"path": map[string]any{"type": "string"},
			"limit": map[string]any{"type": "integer"}}, Required: []string{"path"}}}
	tools := []anthropic.ToolUnionParam{{OfTool: &read}, {OfTool: &anthropic.ToolParam{Name: "Bash",
		InputSchema: anthropic.ToolInputSchemaParam{Properties: map[string]any{"command": map[string]any{"type": "string"}}}}}}
	ask := []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Open the scheduler."))}
	params := anthropic.MessageNewParams{Model: "evolve-tiny", MaxTokens: 12, Tools: tools, Messages: ask,
		ToolChoice: anthropic.ToolChoiceParamOfTool("Read")}
	m, err := ac.Messages.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	use := func(m anthropic.Message, what string) anthropic.ToolUseBlock {
		t.Helper()
		if m.StopReason != anthropic.StopReasonToolUse || len(m.Content) != 1 || m.Content[0].Type != "tool_use" {
			t.Fatalf("%s: %+v", what, m)
		}
		tu := m.Content[0].AsToolUse()
		var in map[string]string
		if err := json.Unmarshal(tu.Input, &in); err != nil || tu.Name != "Read" || len(in) != 1 || len(in["path"]) < 12 ||
			m.Usage.OutputTokens != 12 {
			t.Fatalf("%s: the call %s %s (%v), %d output tokens: want Read with the 12 tokens' text in path", what, tu.Name, tu.Input, err,
				m.Usage.OutputTokens)
		}
		return tu
	}
	whole := use(*m, "whole")
	stream := ac.Messages.NewStreaming(ctx, params)
	var streamed anthropic.Message
	jsonDeltas := 0
	for stream.Next() {
		ev := stream.Current()
		if ev.Type == "content_block_delta" && ev.Delta.Type == "input_json_delta" {
			jsonDeltas++
		}
		if err := streamed.Accumulate(ev); err != nil {
			t.Fatal(err)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if tu := use(streamed, "streamed"); jsonDeltas < 12 {
		t.Fatalf("streamed call %s in %d deltas: want one per token at least", tu.Input, jsonDeltas)
	}

	// The tool's result goes back; with tool_choice auto the answer is text.
	next := append(ask, m.ToParam(), anthropic.NewUserMessage(anthropic.NewToolResultBlock(whole.ID, "package sched", false)))
	r, err := ac.Messages.New(ctx, anthropic.MessageNewParams{Model: "evolve-tiny", MaxTokens: 8, Tools: tools, Messages: next})
	if err != nil || r.StopReason != anthropic.StopReasonMaxTokens || len(r.Content) != 1 || r.Content[0].Type != "text" {
		t.Fatalf("the turn after the call: %v %+v", err, r)
	}
	if r.Usage.CacheReadInputTokens < m.Usage.InputTokens/2 {
		t.Fatalf("the turn after the call read %d prompt tokens from the cache; the call's prompt had %d", r.Usage.CacheReadInputTokens,
			m.Usage.InputTokens+m.Usage.CacheReadInputTokens)
	}

	// OpenAI's API: tool_choice required calls the first tool offered.
	oc := c.client()
	fn := func(name, param string) openai.ChatCompletionToolUnionParam {
		return openai.ChatCompletionFunctionTool(openai.FunctionDefinitionParam{Name: name,
			Parameters: openai.FunctionParameters{"type": "object", "properties": map[string]any{param: map[string]any{"type": "string"}}}})
	}
	cc, err := oc.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "evolve-tiny", MaxTokens: openai.Int(5),
		Messages:   []openai.ChatCompletionMessageParamUnion{openai.UserMessage("list the files")},
		Tools:      []openai.ChatCompletionToolUnionParam{fn("ls", "dir"), fn("cat", "file")},
		ToolChoice: openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String("required")}})
	if err != nil {
		t.Fatal(err)
	}
	if ch := cc.Choices[0]; ch.FinishReason != "tool_calls" || len(ch.Message.ToolCalls) != 1 || ch.Message.ToolCalls[0].Function.Name != "ls" ||
		!strings.HasPrefix(ch.Message.ToolCalls[0].Function.Arguments, `{"dir":"`) || cc.Usage.CompletionTokens != 5 {
		t.Fatalf("required tool call: %+v", cc)
	}
	// A named tool the request does not offer is refused.
	status, _, body := post(t, c.state.RouterURL+"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],
		"tools":[{"type":"function","function":{"name":"ls"}}],"tool_choice":{"type":"function","function":{"name":"rm"}}}`)
	if e := obj(body["error"]); status != 400 || !strings.Contains(e["message"].(string), `"rm"`) {
		t.Fatalf("a named tool not offered: %d %v", status, body)
	}
}
