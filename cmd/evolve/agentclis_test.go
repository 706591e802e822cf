package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// The agents teams run, installed from npm (CI does) and run as their
// users run them, unchanged, against a local cluster: the README's
// recipes. Each test is skipped, saying how to install its CLI, when the
// CLI is absent.

// agentCLI is the path of an agent's CLI: $env, else name on the PATH;
// the test is skipped when there is none.
func agentCLI(t *testing.T, name, env, pkg string) string {
	if p := os.Getenv(env); p != "" {
		return p
	}
	p, err := exec.LookPath(name)
	if err != nil {
		t.Skipf("%s is not installed: npm install -g %s (CI does), or set %s to its path", name, pkg, env)
	}
	return p
}

// runAgent runs an agent's CLI in dir with env added, for at most 3
// minutes, and returns its standard output; a failure ends the test with
// what it printed.
func runAgent(t *testing.T, dir string, env []string, bin string, args ...string) string {
	t.Helper()
	return runAgentIn(t, dir, env, "", bin, args...)
}

// runAgentIn is runAgent with stdin on the CLI's standard input (a prompt
// too long for an argument).
func runAgentIn(t *testing.T, dir string, env []string, stdin, bin string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = dir
	// PWD too: opencode finds its project's config by it, as a shell
	// started there would set it.
	cmd.Env = append(append(os.Environ(), "PWD="+dir), env...)
	cmd.Stdin = strings.NewReader(stdin)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %q: %v\n%s\n%s", filepath.Base(bin), args, err, out, stderr.String())
	}
	return string(out)
}

// branchesOf lists the cluster's agent branches (evolve branches -o json).
func branchesOf(t *testing.T, c *localCluster, args ...string) []map[string]any {
	t.Helper()
	out, code := runBinOut(t, c.env, append([]string{"branches", "-o", "json"}, args...)...)
	var bs []map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &bs) != nil {
		t.Fatalf("evolve branches: exit %d\n%s", code, out)
	}
	return bs
}

// sessionsOf is the sessions of branches, with their turns.
func sessionsOf(bs []map[string]any) map[string]float64 {
	out := map[string]float64{}
	for _, b := range bs {
		s, _ := b["session"].(string)
		n, _ := b["turns"].(float64)
		out[s] += n
	}
	return out
}

// claudeEnv is the README's recipe for Claude Code against c, with its
// home in home.
func claudeEnv(c *localCluster, home string) []string {
	return []string{"HOME=" + home, "ANTHROPIC_BASE_URL=" + c.state.RouterURL, "ANTHROPIC_AUTH_TOKEN=unused",
		"CLAUDE_CODE_DISABLE_1M_CONTEXT=1", "DISABLE_AUTOUPDATER=1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1"}
}

// Two Claude Code sessions at once are two agent sessions, named as
// Claude Code names them (its X-Claude-Code-Session-Id, and the JSON
// metadata.user_id of 2.1): before, evolve read only the older
// "_session_" form, and showed no branches at all.
func TestClaudeCodeSessionsAreAgentSessions(t *testing.T) {
	claude := claudeCode(t)
	c := claudeCodeCluster(t)
	var wg sync.WaitGroup
	ids := make([]string, 2)
	for i := range ids {
		home := t.TempDir()
		wg.Add(1)
		go func() {
			defer wg.Done()
			var res map[string]any
			out := runAgent(t, home, claudeEnv(c, home), claude, "-p", "--output-format", "json", "Say hello.")
			if err := json.Unmarshal([]byte(out), &res); err != nil || res["is_error"] != false {
				t.Errorf("claude: %v %s", err, out)
				return
			}
			ids[i], _ = res["session_id"].(string)
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	sessions := sessionsOf(branchesOf(t, c))
	for _, id := range ids {
		if sessions[id] < 1 {
			t.Errorf("Claude Code's session %s is not among the agent sessions %v", id, sessions)
		}
	}
	if len(sessions) != 2 {
		t.Errorf("two Claude Code sessions made the agent sessions %v", sessions)
	}
}

// A Claude Code session that outgrows the served model's context goes
// on: told in Anthropic's words that its max_tokens do not fit, Claude
// Code asks for fewer; told its prompt is too long, it compacts the
// conversation and the turn is served. Before, it was told in evolve's
// own words, and the session could neither go on nor compact.
func TestClaudeCodeOutgrowsTheContext(t *testing.T) {
	claude := claudeCode(t)
	// Kimi K2 with a context of 70,000 tokens, not told to Claude Code
	// (which assumes 200,000 and asks for 64,000 max_tokens).
	profile, err := os.ReadFile("../../engine/stepmodel/profiles/gb300-kimi-k2.yaml")
	if err != nil {
		t.Fatal(err)
	}
	head, _, _ := strings.Cut(string(profile), "\nchecks:")
	head = strings.Replace(strings.Replace(head, "max_model_len: 262144", "max_model_len: 70000", 1), "name: gb300-kimi-k2", "name: kimi-70k", 1)
	path := filepath.Join(t.TempDir(), "kimi-70k.yaml")
	if err := os.WriteFile(path, []byte(head+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c := upCluster(t, "--engines", "2", "--profile", path, "--speedup", "20", "--model-alias", "claude-*")
	home := t.TempDir()
	session := ""
	turn := func(i, n int, args ...string) float64 {
		t.Helper()
		words := make([]string, n)
		for j := range words {
			words[j] = []string{"red", "green", "blue", "cyan", "magenta", "yellow"}[(i*7+j*13)%6] + strings.Repeat("x", (i+j)%4)
		}
		args = append([]string{"-p", "--output-format", "json"}, args...)
		var res map[string]any
		out := runAgentIn(t, home, claudeEnv(c, home), fmt.Sprintf("Notes, part %d: %s", i, strings.Join(words, " ")), claude, args...)
		if err := json.Unmarshal([]byte(out), &res); err != nil || res["is_error"] != false {
			t.Fatalf("turn %d: %v %s", i, err, out)
		}
		if i == 1 {
			session = res["session_id"].(string)
		}
		u := res["usage"].(map[string]any)
		return u["input_tokens"].(float64) + u["cache_read_input_tokens"].(float64)
	}
	// Turns of 6,500 tokens each while they fit beside a smaller
	// max_tokens, then one that takes the prompt past the context: every
	// turn is served, the last once the conversation is compacted (its
	// prompt shorter than the one before).
	prev := turn(1, 4000)
	for i := 2; prev < 50000; i++ {
		if i > 8 {
			t.Fatalf("seven turns of notes and the prompt is %v tokens", prev)
		}
		p := turn(i, 4000, "--resume", session)
		if p <= prev {
			t.Fatalf("turn %d sent a prompt of %v tokens after one of %v", i, p, prev)
		}
		prev = p
	}
	// A word of notes is about 1.6 tokens: this turn's prompt would be
	// 74,000 tokens.
	if p := turn(9, int((74000-prev)/1.6), "--resume", session); p >= prev {
		t.Fatalf("the turn past the context sent a prompt of %v tokens after one of %v: it was not compacted", p, prev)
	}
	turn(10, 500, "--resume", session) // and the session goes on
	// The router said so in Anthropic's words: the max_tokens that do not
	// fit beside the prompt every turn, and, as the turns went past the
	// context, the prompt too long.
	log, err := os.ReadFile(filepath.Join(c.state.LogDir, "orchestrator.log"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"input length and `max_tokens` exceed context limit", "prompt is too long"} {
		if !strings.Contains(string(log), want) {
			t.Errorf("the orchestrator's log has no refusal %q", want)
		}
	}
}

// codexConfig writes a CODEX_HOME whose config.toml points Codex at the
// router, as the README's recipe does.
func codexConfig(t *testing.T, routerURL string) string {
	dir := t.TempDir()
	cfg := `model = "gpt-5-codex"
model_provider = "evolve"

[model_providers.evolve]
name = "evolve"
base_url = "` + routerURL + `/v1"
wire_api = "responses"
`
	if err := os.WriteFile(filepath.Join(dir, "config.toml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// codexTurn is what codex exec --json said of one turn.
type codexTurn struct {
	thread string
	cached float64 // cached_input_tokens
	input  float64
	text   string
}

// readCodexEvents reads codex exec --json's events; a turn.failed or an
// error event ends the test.
func readCodexEvents(t *testing.T, out string) codexTurn {
	t.Helper()
	var turn codexTurn
	done := false
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(nil, 4<<20)
	for sc.Scan() {
		var ev struct {
			Type     string `json:"type"`
			ThreadID string `json:"thread_id"`
			Usage    struct {
				Input  float64 `json:"input_tokens"`
				Cached float64 `json:"cached_input_tokens"`
			} `json:"usage"`
			Item struct {
				Type string `json:"type"`
				Text string `json:"text"`
			} `json:"item"`
		}
		if json.Unmarshal(sc.Bytes(), &ev) != nil {
			continue
		}
		switch ev.Type {
		case "thread.started":
			turn.thread = ev.ThreadID
		case "turn.completed":
			turn.cached, turn.input, done = ev.Usage.Cached, ev.Usage.Input, true
		case "item.completed":
			if ev.Item.Type == "agent_message" {
				turn.text = ev.Item.Text
			}
		case "turn.failed", "error":
			t.Fatalf("codex: %s", sc.Text())
		}
	}
	if !done || turn.thread == "" || turn.text == "" {
		t.Fatalf("codex exec: no completed turn with an answer:\n%s", out)
	}
	return turn
}

// The current Codex CLI, which speaks only the Responses API, runs a
// session against a local cluster: codex exec, then two codex exec
// resume turns, each served, each reading more of its context from KV,
// all one agent session.
func TestCodexExecAndResume(t *testing.T) {
	codex := agentCLI(t, "codex", "EVOLVE_CODEX", "@openai/codex")
	c := upCluster(t, "--engines", "2", "--profile", "gb300-kimi-k2", "--speedup", "20", "--model-alias", "gpt-*")
	work := t.TempDir()
	env := []string{"CODEX_HOME=" + codexConfig(t, c.state.RouterURL), "HOME=" + t.TempDir()}
	first := readCodexEvents(t, runAgent(t, work, env, codex, "exec", "--skip-git-repo-check", "--json", "Say hello."))
	prev := first
	for i, ask := range []string{"Now say goodbye.", "And once more."} {
		next := readCodexEvents(t, runAgent(t, work, env, codex, "exec", "--skip-git-repo-check", "--json", "resume", "--last", ask))
		if next.thread != first.thread {
			t.Fatalf("resume %d went on in thread %s, not %s", i+1, next.thread, first.thread)
		}
		if next.cached <= prev.cached || next.input <= prev.input {
			t.Fatalf("resume %d read %v of %v input tokens from KV, the turn before %v of %v", i+1, next.cached, next.input, prev.cached, prev.input)
		}
		prev = next
	}
	if turns := sessionsOf(branchesOf(t, c, "--session", first.thread))[first.thread]; turns < 3 {
		t.Fatalf("Codex's thread %s is an agent session of %v turns, want 3 or more", first.thread, turns)
	}
}

// opencode (through @ai-sdk/openai-compatible) runs a session and goes
// on with it (--continue), one agent session named by its x-session-id.
func TestOpenCodeRunAndContinue(t *testing.T) {
	opencode := agentCLI(t, "opencode", "EVOLVE_OPENCODE", "opencode-ai")
	c := upCluster(t, "--engines", "2", "--profile", "gb300-kimi-k2", "--speedup", "20")
	work := t.TempDir()
	model := c.nodes()[0]["model"].(string)
	cfg := `{
  "$schema": "https://opencode.ai/config.json",
  "provider": {
    "evolve": {
      "npm": "@ai-sdk/openai-compatible",
      "name": "evolve",
      "options": { "baseURL": "` + c.state.RouterURL + `/v1" },
      "models": { "` + model + `": { "name": "served" } }
    }
  },
  "model": "evolve/` + model + `"
}
`
	if err := os.WriteFile(filepath.Join(work, "opencode.json"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	home := t.TempDir()
	env := []string{"HOME=" + home, "XDG_DATA_HOME=" + filepath.Join(home, "data"), "XDG_CONFIG_HOME=" + filepath.Join(home, "config")}
	for _, args := range [][]string{{"run", "Say hello."}, {"run", "--continue", "Now say goodbye."}} {
		if out := runAgent(t, work, env, opencode, args...); strings.TrimSpace(out) == "" || strings.Contains(out, "Error:") {
			t.Fatalf("opencode %q: %s", args, out)
		}
	}
	for s, turns := range sessionsOf(branchesOf(t, c)) {
		if strings.HasPrefix(s, "ses_") && turns >= 2 {
			// Its two runs' main turns, one session (its title is asked
			// for beside them, in the same session).
			bs := branchesOf(t, c, "--session", s)
			for _, b := range bs {
				if b["turns"].(float64) >= 2 {
					return
				}
			}
			t.Fatalf("opencode's session %s: no branch went on with --continue: %v", s, bs)
		}
	}
	t.Fatalf("no opencode session of two turns among %v", sessionsOf(branchesOf(t, c)))
}
