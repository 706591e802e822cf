package protocol

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/evolvellm/evolve/kv"
)

// Every form of identity the agents in use send maps to the right
// session, sub-agent and parent. The values are as Claude Code 2.1,
// Codex 0.171 and OpenCode 1.18 sent them to a local cluster.
func TestAgentOfEveryForm(t *testing.T) {
	const ccUserID = `{"device_id":"1e5a57fa","account_uuid":"","session_id":"2c425057-be02-4525-946b-9f793406bae0"}`
	turnMeta := `{"installation_id":"fb98","session_id":"01a2-root","thread_id":"01a2-child","agent_name":"/root/worker","parent_thread_id":"01a2-root","request_kind":"turn"}`
	for _, c := range []struct {
		name   string
		header map[string]string
		md     map[string]any
		nvext  string
		want   kv.Identity
		source string
		final  bool
	}{
		{name: "x-evolve headers", header: map[string]string{"X-Evolve-Session": "s1", "X-Evolve-Branch": "b2", "X-Evolve-Parent-Branch": "b1", "X-Evolve-Rewrite": "true"},
			want: kv.Identity{Session: "s1", Branch: "b2", Parent: "b1", Rewrite: true}, source: "x-evolve"},
		{name: "x-evolve wins over the agent's own", header: map[string]string{"X-Evolve-Session": "mine", "X-Claude-Code-Session-Id": "cc", "X-Dynamo-Session-Id": "dyn"},
			want: kv.Identity{Session: "mine"}, source: "x-evolve"},
		{name: "evolve's metadata", md: map[string]any{"session": "s1", "branch": "b", "parent_branch": "a", "rewrite": "true"},
			want: kv.Identity{Session: "s1", Branch: "b", Parent: "a", Rewrite: true}, source: "metadata"},
		{name: "dynamo root", header: map[string]string{"X-Dynamo-Session-Id": "d1"}, want: kv.Identity{Session: "d1"}, source: "dynamo"},
		{name: "dynamo child, final", header: map[string]string{"X-Dynamo-Session-Id": "d2", "X-Dynamo-Parent-Session-Id": "d1", "X-Dynamo-Session-Final": "true"},
			want: kv.Identity{Session: "d2", ParentSession: "d1"}, source: "dynamo", final: true},
		{name: "dynamo wins over the agent's own", header: map[string]string{"X-Dynamo-Session-Id": "d1", "X-Claude-Code-Session-Id": "cc"},
			want: kv.Identity{Session: "d1"}, source: "dynamo"},
		{name: "dynamo's older body", nvext: `{"agent_context":{"session_id":"n1","trajectory_id":"t2","parent_trajectory_id":"t1","trajectory_final":true}}`,
			want: kv.Identity{Session: "n1", Agent: "t2", ParentAgent: "t1"}, source: "dynamo-nvext", final: true},
		{name: "claude code header", header: map[string]string{"X-Claude-Code-Session-Id": "2c42"}, want: kv.Identity{Session: "2c42"}, source: "claude-code"},
		{name: "claude code sub-agent", header: map[string]string{"X-Claude-Code-Session-Id": "2c42", "X-Claude-Code-Agent-Id": "aa1e"},
			want: kv.Identity{Session: "2c42", Agent: "aa1e"}, source: "claude-code"},
		{name: "claude code sub-agent of a sub-agent", header: map[string]string{"X-Claude-Code-Session-Id": "2c42", "X-Claude-Code-Agent-Id": "bb2f", "X-Claude-Code-Parent-Agent-Id": "aa1e"},
			want: kv.Identity{Session: "2c42", Agent: "bb2f", ParentAgent: "aa1e"}, source: "claude-code"},
		{name: "claude code JSON user_id", md: map[string]any{"user_id": ccUserID},
			want: kv.Identity{Session: "2c425057-be02-4525-946b-9f793406bae0"}, source: "claude-code"},
		{name: "claude code older user_id", md: map[string]any{"user_id": "user_abc_account_def_session_77e1"},
			want: kv.Identity{Session: "77e1"}, source: "claude-code"},
		{name: "codex root thread", header: map[string]string{"Session-Id": "01a2-root", "Thread-Id": "01a2-root"},
			want: kv.Identity{Session: "01a2-root"}, source: "codex"},
		{name: "codex spawned thread", header: map[string]string{"Session-Id": "01a2-root", "Thread-Id": "01a2-child", "X-Codex-Parent-Thread-Id": "01a2-root"},
			want: kv.Identity{Session: "01a2-root", Agent: "01a2-child"}, source: "codex"},
		{name: "codex thread of a spawned thread", header: map[string]string{"Session-Id": "r", "Thread-Id": "c2", "X-Codex-Parent-Thread-Id": "c1"},
			want: kv.Identity{Session: "r", Agent: "c2", ParentAgent: "c1"}, source: "codex"},
		{name: "codex older underscored headers", header: map[string]string{"Session_id": "r", "Thread_id": "c"},
			want: kv.Identity{Session: "r", Agent: "c"}, source: "codex"},
		{name: "codex thread only", header: map[string]string{"Thread-Id": "c2", "X-Codex-Parent-Thread-Id": "c1"},
			want: kv.Identity{Session: "c2", ParentSession: "c1"}, source: "codex"},
		{name: "codex turn metadata header", header: map[string]string{"X-Codex-Turn-Metadata": turnMeta},
			want: kv.Identity{Session: "01a2-root", Agent: "01a2-child"}, source: "codex"},
		{name: "codex client_metadata", md: map[string]any{"session_id": "r", "thread_id": "c", "x-codex-parent-thread-id": "r"},
			want: kv.Identity{Session: "r", Agent: "c"}, source: "codex"},
		{name: "codex prompt_cache_key", md: map[string]any{"prompt_cache_key": "01a2-root"}, want: kv.Identity{Session: "01a2-root"}, source: "codex"},
		{name: "opencode root", header: map[string]string{"X-Session-Id": "ses_root", "X-Session-Affinity": "ses_root"},
			want: kv.Identity{Session: "ses_root"}, source: "opencode"},
		{name: "opencode child", header: map[string]string{"X-Session-Id": "ses_child", "X-Parent-Session-Id": "ses_root"},
			want: kv.Identity{Session: "ses_child", ParentSession: "ses_root"}, source: "opencode"},
		{name: "nothing", header: map[string]string{"User-Agent": "curl"}},
		{name: "an id too long or not printable is ignored", header: map[string]string{"X-Evolve-Session": string(make([]byte, 300)), "X-Claude-Code-Session-Id": "cc\x01"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := http.Header{}
			for k, v := range c.header {
				h.Set(k, v)
			}
			a := AgentOf(h, AgentBody{Metadata: c.md, Nvext: json.RawMessage(c.nvext)})
			if a.Identity != c.want || a.Source != c.source || a.Final != c.final {
				t.Fatalf("got %+v from %s %+v, want %+v (%s, final %v)", a, a.Source, c.header, c.want, c.source, c.final)
			}
		})
	}
}

// Dynamo's agent hints are read from nvext.agent_hints, its priority
// headers overriding the body's; a malformed nvext gives none.
func TestAgentHints(t *testing.T) {
	h := http.Header{}
	a := AgentOf(h, AgentBody{Nvext: json.RawMessage(`{"agent_hints":{"priority":3,"strict_priority":1,"osl":900,"speculative_prefill":true}}`)})
	if a.Hints.Priority == nil || *a.Hints.Priority != 3 || a.Hints.StrictPriority == nil || *a.Hints.StrictPriority != 1 ||
		a.Hints.OSL != 900 || !a.Hints.SpeculativePrefill {
		t.Fatalf("hints %+v", a.Hints)
	}
	h.Set("X-Dynamo-Request-Priority", "7")
	a = AgentOf(h, AgentBody{Nvext: json.RawMessage(`{"agent_hints":{"priority":3,"osl":-5}}`)})
	if *a.Hints.Priority != 7 || a.Hints.OSL != 0 {
		t.Fatalf("hints with a priority header %+v", a.Hints)
	}
	if a := AgentOf(http.Header{}, AgentBody{Nvext: json.RawMessage(`{"agent_hints":"x"`)}); a.Hints != (AgentHints{}) {
		t.Fatalf("malformed nvext gave %+v", a.Hints)
	}
}
