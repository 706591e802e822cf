package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
)

// claudeCodeCluster is the README's recipe for Claude Code: a local
// cluster of a long-context model that takes Claude Code's model names.
func claudeCodeCluster(t *testing.T) *localCluster {
	return upCluster(t, "--engines", "2", "--profile", "gb300-kimi-k2", "--speedup", "20", "--model-alias", "claude-*")
}

// claudeCode is the path of Claude Code's CLI: $EVOLVE_CLAUDE, else
// claude on the PATH; the test is skipped, saying how to install it,
// when there is none.
func claudeCode(t *testing.T) string {
	if p := os.Getenv("EVOLVE_CLAUDE"); p != "" {
		return p
	}
	p, err := exec.LookPath("claude")
	if err != nil {
		t.Skip("Claude Code is not installed: npm install -g @anthropic-ai/claude-code (CI does), or set EVOLVE_CLAUDE to its claude")
	}
	return p
}

// Claude Code, the agent evolve exists to serve, completes its turns
// against a local cluster, as the README's recipe runs it. Before, every
// turn failed: a 400 for the system messages it sends among the
// messages, then answers written to its 32,000-token maximum, which it
// calls an error.
func TestClaudeCodeCompletesItsTurns(t *testing.T) {
	claude := claudeCode(t)
	c := claudeCodeCluster(t)
	home := t.TempDir()
	run := func(args ...string) map[string]any {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, claude, append([]string{"-p", "--output-format", "json"}, args...)...)
		cmd.Dir = home
		// The README's recipe: its default model assumes a context of a
		// million tokens, past the served model's 262,144.
		cmd.Env = append(os.Environ(), "HOME="+home, "ANTHROPIC_BASE_URL="+c.state.RouterURL, "ANTHROPIC_AUTH_TOKEN=unused",
			"CLAUDE_CODE_DISABLE_1M_CONTEXT=1", "DISABLE_AUTOUPDATER=1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1")
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		var res map[string]any
		if jerr := json.Unmarshal(out, &res); err != nil || jerr != nil {
			t.Fatalf("claude %q: %v %v\n%s\n%s", args, err, jerr, out, stderr.String())
		}
		if res["is_error"] != false || res["stop_reason"] != "end_turn" {
			t.Fatalf("claude %q: is_error %v, stop_reason %v: %v", args, res["is_error"], res["stop_reason"], res["result"])
		}
		return res
	}
	first := run("Say hello.")
	usage, _ := first["usage"].(map[string]any)
	if out, _ := usage["output_tokens"].(float64); out < 1 || out >= 32000 {
		t.Fatalf("the answer had %v output tokens", usage["output_tokens"])
	}
	// The context window Claude Code assumes fits the model's.
	var nodes []map[string]any
	getJSON(t, c.state.RouterURL+"/v1/models", &struct{ Data *[]map[string]any }{&nodes})
	maxLen, _ := nodes[0]["max_model_len"].(float64)
	for model, u := range first["modelUsage"].(map[string]any) {
		if window, _ := u.(map[string]any)["contextWindow"].(float64); window > maxLen {
			t.Errorf("Claude Code assumes a context of %v tokens for %s; the router serves %v", window, model, maxLen)
		}
	}
	// The session goes on, its context read from KV.
	next := run("--resume", first["session_id"].(string), "Now say goodbye.")
	if u, _ := next["usage"].(map[string]any); u["cache_read_input_tokens"].(float64) <= usage["cache_read_input_tokens"].(float64) {
		t.Fatalf("the second turn read %v prompt tokens from KV, the first %v", u["cache_read_input_tokens"], usage["cache_read_input_tokens"])
	}
}

// An agent loop of 20 turns, as the Anthropic SDK drives one: each turn
// calls a tool, its result goes back, and the last ends the turn on its
// own (end_turn, far below its max_tokens); every turn after the first
// reads the whole of the turn before's prompt from KV (its full blocks),
// and the context read grows. The turn before's answer is computed again:
// rendered back into the prompt (a tool call's JSON), its tokens are not
// the ones the model sampled, so no KV holds them, and the usage says so.
func TestAgentToolLoopOf20Turns(t *testing.T) {
	c := claudeCodeCluster(t)
	ctx := context.Background()
	ac := c.anthropic()
	bash := anthropic.ToolParam{Name: "Bash", Description: anthropic.String("Run a command"),
		InputSchema: anthropic.ToolInputSchemaParam{Properties: map[string]any{"command": map[string]any{"type": "string"}}, Required: []string{"command"}}}
	tools := []anthropic.ToolUnionParam{{OfTool: &bash}}
	msgs := []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Make the failing tests in ./parser pass."))}
	var cached int64       // the second turn's prompt tokens read from KV
	var lastPrompt int64   // the turn before's
	const blockTokens = 64 // gb300-kimi-k2's KV block
	for turn := 1; turn <= 20; turn++ {
		p := anthropic.MessageNewParams{Model: "claude-sonnet-4-5", MaxTokens: 32000, Tools: tools, Messages: msgs,
			Metadata: anthropic.MetadataParam{UserID: anthropic.String("user_x_account_y_session_loop-1")}}
		last := turn == 20
		if !last {
			p.ToolChoice = anthropic.ToolChoiceUnionParam{OfAny: &anthropic.ToolChoiceAnyParam{}}
		}
		// Streamed, as Claude Code asks (the SDK refuses to wait for a
		// whole answer of 32,000 tokens).
		stream := ac.Messages.NewStreaming(ctx, p)
		var m anthropic.Message
		for stream.Next() {
			if err := m.Accumulate(stream.Current()); err != nil {
				t.Fatal(err)
			}
		}
		if err := stream.Err(); err != nil {
			t.Fatalf("turn %d: %v", turn, err)
		}
		prompt := m.Usage.InputTokens + m.Usage.CacheReadInputTokens
		if reused := lastPrompt / blockTokens * blockTokens; turn > 1 && m.Usage.CacheReadInputTokens < reused {
			t.Fatalf("turn %d read %d of its %d prompt tokens from KV; the turn before's prompt had %d in full blocks",
				turn, m.Usage.CacheReadInputTokens, prompt, reused)
		}
		lastPrompt = prompt
		if turn == 2 {
			cached = m.Usage.CacheReadInputTokens
		}
		if last {
			if m.Usage.CacheReadInputTokens <= cached {
				t.Fatalf("the last turn read %d prompt tokens from KV, the second %d", m.Usage.CacheReadInputTokens, cached)
			}
			if m.StopReason != anthropic.StopReasonEndTurn || m.Usage.OutputTokens >= 32000 || m.Content[0].Type != "text" {
				t.Fatalf("the last turn: %s after %d tokens", m.StopReason, m.Usage.OutputTokens)
			}
			break
		}
		if m.StopReason != anthropic.StopReasonToolUse || m.Content[0].Type != "tool_use" {
			t.Fatalf("turn %d: %s, %+v", turn, m.StopReason, m.Content)
		}
		use := m.Content[0].AsToolUse()
		// The tool runs (a test suite: a few hundred milliseconds, as
		// Claude Code's tools take at least), while the engines' KV
		// events reach the router.
		time.Sleep(300 * time.Millisecond)
		msgs = append(msgs, m.ToParam(), anthropic.NewUserMessage(anthropic.NewToolResultBlock(use.ID, "ok: 3 passed, 2 failed", false)))
	}
}
