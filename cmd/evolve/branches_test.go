package main

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/evolvellm/evolve/internal/wait"
	"github.com/evolvellm/evolve/tui"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// Agents name their sessions and branches (here through the OpenAI SDK's
// extra headers, as an agent framework would); evolve branches shows the
// tree with where each branch's blocks live, evolve kv the summary, and an
// ended session leaves the tree.
func TestBranchesAndKVCommands(t *testing.T) {
	c := upCluster(t, "--engines", "2", "--prefill", "1", "--profile", "gb300-kimi-k2", "--speedup", "50")
	client := c.client()
	ctx := t.Context()
	ask := func(session, branch, parent, prompt string) {
		t.Helper()
		opts := []option.RequestOption{option.WithHeader("X-Evolve-Session", session), option.WithHeader("X-Evolve-Branch", branch)}
		if parent != "" {
			opts = append(opts, option.WithHeader("X-Evolve-Parent-Branch", parent))
		}
		_, err := client.Completions.New(ctx, openai.CompletionNewParams{Model: "moonshotai/Kimi-K2-Instruct",
			Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String(prompt)}, MaxTokens: openai.Int(4)}, opts...)
		if err != nil {
			t.Fatal(err)
		}
	}
	long := strings.Repeat("read the repository and plan the change ", 100)
	ask("agent-1", "main", "", long)
	// The next turn hits the cache once the engines' KV events have told
	// the directory where the first one's blocks are.
	wait.Until(t, 5e9, "the first turn's blocks are known", func() bool {
		out, _ := runBinOut(t, c.env, "kv", "-o", "json")
		var st struct {
			Blocks int `json:"blocks"`
		}
		json.Unmarshal([]byte(out), &st)
		return st.Blocks > 0
	})
	ask("agent-1", "main", "", long+" then run the tests")
	ask("agent-1", "explore", "main", long+" and explore the parser in a sub-agent")
	ask("agent-2", "main", "", "a short unrelated task")

	out, code := runBinOut(t, c.env, "branches", "-o", "json")
	var bs []tui.Branch
	if code != 0 || json.Unmarshal([]byte(out), &bs) != nil || len(bs) != 3 {
		t.Fatalf("branches -o json: %d\n%s", code, out)
	}
	main := bs[1]
	if main.Session != "agent-1" || main.Branch != "main" || main.State != "waiting" || main.Turns != 2 || main.Blocks < 10 {
		t.Fatalf("agent-1/main: %+v", main)
	}
	if bs[0].Branch != "explore" || bs[0].Parent != "main" {
		t.Fatalf("agent-1/explore: %+v", bs[0])
	}
	// The directory learns where the blocks live from KV events.
	wait.Until(t, 5e9, "main's blocks are placed", func() bool {
		out, _ := runBinOut(t, c.env, "branches", "--session", "agent-1", "-o", "json")
		json.Unmarshal([]byte(out), &bs)
		return len(bs) == 2 && len(bs[1].Residency) > 0 && bs[1].Residency[0].GPU > 0
	})
	out, _ = runBinOut(t, c.env, "branches")
	for _, want := range []string{"agent-1", "└ main", "  └ explore", "waiting", "engine-"} {
		if !strings.Contains(out, want) {
			t.Fatalf("branches table lacks %q:\n%s", want, out)
		}
	}
	// A session with no branches says so, rather than a bare header.
	if out, code := runBinOut(t, c.env, "branches", "--session", "agent-404"); code != 0 || !strings.Contains(out, `no branches of session "agent-404"`) {
		t.Fatalf("branches of an unknown session: exit %d\n%s", code, out)
	}
	if out, _ := runBinOut(t, c.env, "branches", "--session", "agent-404", "-o", "json"); strings.TrimSpace(out) != "[]" {
		t.Fatalf("branches -o json of an unknown session: %s", out)
	}

	out, code = runBinOut(t, c.env, "kv", "-o", "json")
	var st struct {
		LiveBranches int     `json:"live_branches"`
		Referenced   int     `json:"referenced_blocks"`
		PromptTokens int64   `json:"prompt_tokens"`
		GPUHitRate   float64 `json:"gpu_hit_rate"`
		Nodes        []struct {
			ID         string `json:"id"`
			GPUCached  int    `json:"gpu_cached_blocks"`
			Referenced int    `json:"gpu_referenced_blocks"`
		} `json:"nodes"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil {
		t.Fatalf("kv -o json: %d\n%s", code, out)
	}
	if st.LiveBranches != 3 || st.Referenced == 0 || st.PromptTokens == 0 || st.GPUHitRate <= 0 || len(st.Nodes) != 2 {
		t.Fatalf("kv: %s", out)
	}
	if out, _ = runBinOut(t, c.env, "kv"); !strings.Contains(out, "lost KV reuse") || !strings.Contains(out, "GPU hit") || !strings.Contains(out, "blocks free, host") {
		t.Fatalf("kv table:\n%s", out)
	}
	for _, line := range strings.Split(out, "\n") {
		if n := utf8.RuneCountInString(line); n > 80 {
			t.Fatalf("kv table is %d columns wide, more than a terminal's 80:\n%s", n, out)
		}
	}
	if out, _ = runBinOut(t, c.env, "kv", "-o", "wide"); !strings.Contains(out, "LAST COPY") {
		t.Fatalf("kv -o wide:\n%s", out)
	}

	// The agent ends its session on the router: its branches end.
	del := mustDelete(t, c.state.RouterURL+"/v1/sessions/agent-1")
	if del != 200 {
		t.Fatalf("DELETE session: %d", del)
	}
	out, _ = runBinOut(t, c.env, "branches", "-o", "json")
	json.Unmarshal([]byte(out), &bs)
	if len(bs) != 1 || bs[0].Session != "agent-2" {
		t.Fatalf("after agent-1 ended: %s", out)
	}
}
