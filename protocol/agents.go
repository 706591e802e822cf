package protocol

// What agents say of themselves. evolve's branch-aware KV management is
// only as good as its knowledge of sessions and sub-agents, so the router
// reads every form the agents in use send, and maps each to one tree (see
// kv.Identity): a session is the root agent's program, a sub-agent a
// child within it.
//
//	form                   session                          sub-agent, parent
//	X-Evolve-* headers     X-Evolve-Session                 X-Evolve-Branch, X-Evolve-Parent-Branch
//	evolve's metadata      metadata.session                 metadata.branch, metadata.parent_branch
//	Dynamo                 x-dynamo-session-id              its own session, x-dynamo-parent-session-id
//	Dynamo (older body)    nvext.agent_context.session_id   trajectory_id, parent_trajectory_id
//	Claude Code            x-claude-code-session-id,        x-claude-code-agent-id,
//	                       metadata.user_id's session_id    x-claude-code-parent-agent-id
//	Codex                  session-id (root thread),        thread-id, x-codex-parent-thread-id
//	                       x-codex-turn-metadata, client_metadata, prompt_cache_key
//	OpenCode               x-session-id                     its own session, x-parent-session-id
//
// The first form present names the session, in that order: X-Evolve-*
// wins, then Dynamo's canonical headers, then each agent's own. A session
// (or a sub-agent) ends after a request with x-dynamo-session-final: true
// (or nvext.agent_context.trajectory_final), on DELETE /v1/sessions/{id},
// or when idle past the router's TTL.

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"

	"github.com/evolvellm/evolve/kv"
)

// evolve's own identity headers. All are optional.
const (
	HeaderSession      = "X-Evolve-Session"       // the agent's session
	HeaderBranch       = "X-Evolve-Branch"        // the branch of the session this request continues
	HeaderParentBranch = "X-Evolve-Parent-Branch" // the branch a new branch forked from
	HeaderRewrite      = "X-Evolve-Rewrite"       // "true": the branch replaces its parent's context (a compaction)
)

// The identity headers of Dynamo and of the agents, as they send them.
const (
	HeaderDynamoSession        = "X-Dynamo-Session-Id"
	HeaderDynamoParentSession  = "X-Dynamo-Parent-Session-Id"
	HeaderDynamoSessionFinal   = "X-Dynamo-Session-Final"
	HeaderDynamoPriority       = "X-Dynamo-Request-Priority"
	HeaderDynamoStrictPriority = "X-Dynamo-Request-Strict-Priority"
	HeaderClaudeCodeSession    = "X-Claude-Code-Session-Id"
	HeaderClaudeCodeAgent      = "X-Claude-Code-Agent-Id"
	HeaderClaudeCodeParent     = "X-Claude-Code-Parent-Agent-Id"
	HeaderCodexSession         = "Session-Id" // the root thread; older releases: session_id
	HeaderCodexThread          = "Thread-Id"  // this thread; older releases: thread_id
	HeaderCodexParentThread    = "X-Codex-Parent-Thread-Id"
	HeaderCodexTurnMetadata    = "X-Codex-Turn-Metadata"
	HeaderOpenCodeSession      = "X-Session-Id"
	HeaderOpenCodeParent       = "X-Parent-Session-Id"
)

// Agent is what a request says of the agent that sent it.
type Agent struct {
	kv.Identity
	// Final says the session (or the sub-agent, for one with a session of
	// its own) ends once this request is answered.
	Final bool
	// Source names the form that named the session ("x-evolve",
	// "metadata", "dynamo", "dynamo-nvext", "claude-code", "codex",
	// "opencode"; "" for none).
	Source string
	Hints  AgentHints
}

// AgentHints are Dynamo's per-request agent hints (nvext.agent_hints).
type AgentHints struct {
	// Priority orders requests (higher first, as Dynamo's); nil: none.
	Priority *int `json:"priority,omitempty"`
	// StrictPriority is a priority class above Priority; nil: none.
	StrictPriority *int `json:"strict_priority,omitempty"`
	// OSL is the output length the agent expects, in tokens; 0: not said.
	OSL int `json:"osl,omitempty"`
	// SpeculativePrefill asks that the predicted next turn's prefix be
	// warmed once this one ends.
	SpeculativePrefill bool `json:"speculative_prefill,omitempty"`
}

// AgentBody is what a request's body says of its agent: its metadata
// (a chat or Messages request's; the Responses API's prompt_cache_key and
// client_metadata come in it too) and Dynamo's nvext.
type AgentBody struct {
	Metadata map[string]any
	Nvext    json.RawMessage
}

// agentContext is Dynamo's older body form of an agent's identity
// (nvext.agent_context, before Dynamo moved it to headers).
type agentContext struct {
	SessionID          string `json:"session_id"`
	TrajectoryID       string `json:"trajectory_id"`
	ParentTrajectoryID string `json:"parent_trajectory_id"`
	TrajectoryFinal    bool   `json:"trajectory_final"`
}

// maxIDLen bounds an identity the router keeps: longer ones, or ones not
// printable, are ignored.
const maxIDLen = 256

// AgentOf reads the agent's identity, and its hints, from a request's
// headers and body.
func AgentOf(h http.Header, body AgentBody) Agent {
	var nv struct {
		Hints   *AgentHints   `json:"agent_hints"`
		Context *agentContext `json:"agent_context"`
	}
	if len(body.Nvext) > 0 {
		_ = json.Unmarshal(body.Nvext, &nv) // a malformed nvext names nothing
	}
	a := identityOf(h, body.Metadata, nv.Context)
	a.Final = a.Final || truthy(h.Get(HeaderDynamoSessionFinal))
	if nv.Hints != nil {
		a.Hints = *nv.Hints
		a.Hints.OSL = max(a.Hints.OSL, 0)
	}
	if p, err := strconv.Atoi(strings.TrimSpace(h.Get(HeaderDynamoPriority))); err == nil {
		a.Hints.Priority = &p
	}
	if p, err := strconv.Atoi(strings.TrimSpace(h.Get(HeaderDynamoStrictPriority))); err == nil {
		a.Hints.StrictPriority = &p
	}
	return a
}

// identityOf is the identity the first form present gives.
func identityOf(h http.Header, md map[string]any, nvCtx *agentContext) Agent {
	str := func(k string) string {
		s, _ := md[k].(string)
		return clean(s)
	}
	hdr := func(k string) string { return clean(h.Get(k)) }
	if s := hdr(HeaderSession); s != "" {
		return Agent{Source: "x-evolve", Identity: kv.Identity{Session: s, Branch: hdr(HeaderBranch),
			Parent: hdr(HeaderParentBranch), Rewrite: truthy(h.Get(HeaderRewrite))}}
	}
	if s := str("session"); s != "" {
		return Agent{Source: "metadata", Identity: kv.Identity{Session: s, Branch: str("branch"),
			Parent: str("parent_branch"), Rewrite: truthy(str("rewrite"))}}
	}
	if s := hdr(HeaderDynamoSession); s != "" {
		return Agent{Source: "dynamo", Identity: kv.Identity{Session: s, ParentSession: unless(hdr(HeaderDynamoParentSession), s)}}
	}
	if c := nvCtx; c != nil && clean(c.SessionID) != "" {
		s := clean(c.SessionID)
		return Agent{Source: "dynamo-nvext", Final: c.TrajectoryFinal, Identity: kv.Identity{Session: s,
			Agent: unless(clean(c.TrajectoryID), s), ParentAgent: unless(clean(c.ParentTrajectoryID), s)}}
	}
	if s := firstOf(hdr(HeaderClaudeCodeSession), claudeCodeSession(str("user_id"))); s != "" {
		return Agent{Source: "claude-code", Identity: kv.Identity{Session: s,
			Agent: unless(hdr(HeaderClaudeCodeAgent), s), ParentAgent: unless(hdr(HeaderClaudeCodeParent), s)}}
	}
	if a, ok := codexIdentity(h, str); ok {
		return a
	}
	if s := hdr(HeaderOpenCodeSession); s != "" {
		return Agent{Source: "opencode", Identity: kv.Identity{Session: s, ParentSession: unless(hdr(HeaderOpenCodeParent), s)}}
	}
	return Agent{}
}

// codexIdentity reads Codex's thread headers, then its turn metadata
// (header, or the body's client_metadata), then the body's
// prompt_cache_key (the root thread's id, which sub-agents send too).
func codexIdentity(h http.Header, str func(string) string) (Agent, bool) {
	var turn struct {
		SessionID      string `json:"session_id"`
		ThreadID       string `json:"thread_id"`
		ParentThreadID string `json:"parent_thread_id"`
	}
	meta := h.Get(HeaderCodexTurnMetadata)
	if meta == "" {
		meta = str("x-codex-turn-metadata")
	}
	if meta != "" {
		_ = json.Unmarshal([]byte(meta), &turn) // malformed: named by the other forms
	}
	hdr := func(names ...string) string {
		for _, n := range names {
			if v := clean(h.Get(n)); v != "" {
				return v
			}
		}
		return ""
	}
	session := firstOf(hdr(HeaderCodexSession, "Session_id"), clean(turn.SessionID), str("session_id"))
	thread := firstOf(hdr(HeaderCodexThread, "Thread_id"), clean(turn.ThreadID), str("thread_id"))
	parent := firstOf(hdr(HeaderCodexParentThread), clean(turn.ParentThreadID), str("x-codex-parent-thread-id"))
	if session == "" && thread == "" {
		session = str("prompt_cache_key")
	}
	switch {
	case session != "":
		return Agent{Source: "codex", Identity: kv.Identity{Session: session, Agent: unless(thread, session),
			ParentAgent: unless(parent, session)}}, true
	case thread != "": // no root named: the thread is a session, a child of its parent's
		return Agent{Source: "codex", Identity: kv.Identity{Session: thread, ParentSession: unless(parent, thread)}}, true
	}
	return Agent{}, false
}

// claudeCodeSession is the session in Claude Code's metadata.user_id:
// a JSON object's session_id (2.1 and later), or the end of the older
// "user_<hash>_account_<id>_session_<id>".
func claudeCodeSession(userID string) string {
	if strings.HasPrefix(strings.TrimSpace(userID), "{") {
		var u struct {
			SessionID string `json:"session_id"`
		}
		if json.Unmarshal([]byte(userID), &u) == nil {
			return clean(u.SessionID)
		}
		return ""
	}
	if i := strings.LastIndex(userID, "_session_"); i >= 0 {
		return clean(userID[i+len("_session_"):])
	}
	return ""
}

// clean is s trimmed, or "" when it is too long or not printable.
func clean(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > maxIDLen {
		return ""
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] == 0x7f {
			return ""
		}
	}
	return s
}

func unless(s, same string) string {
	if s == same {
		return ""
	}
	return s
}

func firstOf(ss ...string) string {
	for _, s := range ss {
		if s != "" {
			return s
		}
	}
	return ""
}

func truthy(s string) bool {
	b, err := strconv.ParseBool(strings.TrimSpace(s))
	return err == nil && b
}
