package kv

import (
	"fmt"
	"sort"
	"time"
)

// Identity is what a request says of the agent that sent it: its session,
// its branch and the branch it forked from (any may be empty). Rewrite
// says the branch replaces its parent (a compaction, a rewritten window):
// the parent's context past what they share is dead.
//
// Agents say who they are in one of two ways, and both map to the same
// tree: a session is the root agent's program, and a sub-agent is a
// child within it.
//   - Agent names a sub-agent inside the session (Claude Code's agent id,
//     Codex's thread), and ParentAgent the agent that spawned it ("" for
//     the root agent).
//   - ParentSession says Session is a sub-agent's own session, spawned by
//     the agent of that session (OpenCode's and Dynamo's children): the
//     request belongs to the root of the parent's tree, as agent Session.
//
// Branches are inferred within an agent; a sub-agent's first branch forks
// from a branch of its parent agent.
type Identity struct {
	Session, Branch, Parent string
	Rewrite                 bool
	Agent, ParentAgent      string
	ParentSession           string
}

// Branch states.
const (
	BranchActive  = "active"  // a request of it is in flight
	BranchWaiting = "waiting" // its last request finished: on a tool call, it will be back
	BranchEnded   = "ended"
)

// How a request related to its branch.
const (
	TurnNew      = "new"      // a new branch (a new session, or a first request)
	TurnContinue = "continue" // it extends the branch's context
	TurnFork     = "fork"     // a new branch sharing a prefix of another, which lives on
	TurnRewrite  = "rewrite"  // it diverges from its branch's context: the old tail is dead
)

// Branches tracks the live agent branches and, for every KV block, how
// many live branches reference it: the knowledge that lets eviction keep
// the context an agent will send next and drop what no agent will. It is
// pure (every method takes now) and not safe for concurrent use.
//
// A branch references the blocks of its context: the chain of its latest
// request. A new turn that extends it adds references to the new blocks
// only (its cost is proportional to the blocks added); a rewrite drops the
// old tail's; an ended branch drops all of its.
type Branches struct {
	ttl      time.Duration
	sessions map[string]*session
	// roots maps a sub-agent's own session (Identity.ParentSession) to the
	// session at the root of its tree; forgotten with that session.
	roots    map[string]string
	refs     *Table[int32] // block -> live branches referencing it
	changed  []BlockHash   // blocks whose count went to or from zero since the last Changes
	inferred uint64        // names for inferred branches
	live     int
}

type session struct {
	id       string
	branches map[string]*branch
	lastUsed time.Time
}

type branch struct {
	id, parent string
	agent      string // "" for the session's root agent
	chain      []BlockHash
	state      string
	inFlight   int
	created    time.Time
	lastUsed   time.Time
	turns      int
	endReason  string
}

// NewBranches tracks branches that end after ttl without a request (0: 30
// minutes).
func NewBranches(ttl time.Duration) *Branches {
	if ttl <= 0 {
		ttl = 30 * time.Minute
	}
	return &Branches{ttl: ttl, sessions: map[string]*session{}, roots: map[string]string{}, refs: NewTable[int32](1 << 12)}
}

// Turn is what Begin learned of a request.
type Turn struct {
	Session, Branch string
	Agent           string // the sub-agent, "" for the root agent
	Kind            string // TurnNew, TurnContinue, TurnFork, TurnRewrite
	Parent          string // for a fork or a rewrite of another branch
	Added           int    // blocks whose reference this turn added
	Dropped         int    // references a rewrite dropped
}

// Begin records a request of the agent id with context chain, arriving at
// now. Without a branch, the branch is inferred within the session: the
// live branch whose context the chain extends is continued; otherwise the
// one sharing the longest prefix is forked. Without a session, nothing is
// tracked (an anonymous request references nothing).
func (b *Branches) Begin(now time.Time, id Identity, chain []BlockHash) Turn {
	id = b.resolve(id)
	if id.Session == "" {
		return Turn{}
	}
	s := b.sessions[id.Session]
	if s == nil {
		s = &session{id: id.Session, branches: map[string]*branch{}}
		b.sessions[id.Session] = s
	}
	s.lastUsed = now
	turn := Turn{Session: id.Session, Branch: id.Branch, Agent: id.Agent}
	if id.Branch == "" {
		turn.Branch, turn.Parent, turn.Kind = b.infer(s, id.Agent, chain)
		if turn.Parent == "" && id.Agent != "" && !s.hasAgent(id.Agent) {
			// A sub-agent's first turn: a child of its parent agent.
			turn.Parent = s.spawner(id.ParentAgent, chain)
		}
	}
	br := s.branches[turn.Branch]
	if br != nil && br.state == BranchEnded {
		delete(s.branches, turn.Branch) // a name reused after its branch ended starts afresh
		br = nil
	}
	switch {
	case br == nil:
		br = &branch{id: turn.Branch, agent: id.Agent, created: now}
		s.branches[turn.Branch] = br
		b.live++
		parentName := id.Parent
		if parentName == "" {
			parentName = turn.Parent
		}
		br.parent = parentName
		turn.Parent = parentName
		turn.Kind = TurnNew
		// The new context is referenced before a rewritten parent lets go
		// of its own, so that the prefix they share never drops to zero
		// references: only the parent's dead tail changes priority.
		turn.Added = b.extend(br, chain, 0)
		if p := s.branches[parentName]; p != nil && p.state != BranchEnded {
			turn.Kind = TurnFork
			if id.Rewrite {
				turn.Kind = TurnRewrite
				turn.Dropped = b.end(p, "rewritten by "+turn.Branch)
			}
		}
	default:
		k := commonPrefix(br.chain, chain)
		turn.Kind = TurnContinue
		if k < len(br.chain) {
			// The context changed before its end: the old tail is dead.
			turn.Kind = TurnRewrite
			turn.Dropped = b.release(br.chain[k:])
			br.chain = br.chain[:k]
		}
		turn.Added = b.extend(br, chain, k)
	}
	br.inFlight++
	br.state = BranchActive
	br.lastUsed = now
	br.turns++
	return turn
}

// resolve maps a sub-agent that has a session of its own to the root of
// its parent's tree (Identity.ParentSession), and a request of a session
// known as such a sub-agent's to the same, and names the root's agents.
func (b *Branches) resolve(id Identity) Identity {
	child := id.Session
	if id.ParentSession != "" && id.ParentSession != id.Session {
		root := id.ParentSession
		parentAgent := ""
		if r, ok := b.roots[id.ParentSession]; ok {
			root, parentAgent = r, id.ParentSession
		}
		if child != "" && child != root {
			if _, ok := b.roots[child]; !ok && b.sessions[child] == nil {
				b.roots[child] = root
			}
		}
		id.Session, id.ParentSession = root, ""
		if id.Agent == "" {
			id.Agent, id.ParentAgent = child, parentAgent
		}
		return id
	}
	if root, ok := b.roots[child]; ok && id.Agent == "" {
		id.Session, id.Agent = root, child
	}
	return id
}

// hasAgent reports whether agent has a branch in s, live or ended.
func (s *session) hasAgent(agent string) bool {
	for _, br := range s.branches {
		if br.agent == agent {
			return true
		}
	}
	return false
}

// spawner is the branch of agent parent (of s) that a sub-agent's first
// request comes from: the live one sharing the longest prefix with chain,
// else its most recently used live one; "" when it has none.
func (s *session) spawner(parent string, chain []BlockHash) string {
	var best, recent *branch
	bestLen := 0
	for _, br := range s.sortedLive() {
		if br.agent != parent {
			continue
		}
		if k := commonPrefix(br.chain, chain); k > bestLen {
			best, bestLen = br, k
		}
		if recent == nil || br.lastUsed.After(recent.lastUsed) {
			recent = br
		}
	}
	switch {
	case best != nil:
		return best.id
	case recent != nil:
		return recent.id
	}
	return ""
}

// infer names the branch of a request of agent that named no branch,
// among the agent's own live branches.
func (b *Branches) infer(s *session, agent string, chain []BlockHash) (name, parent, kind string) {
	var best *branch
	bestLen := 0
	for _, br := range s.sortedLive() {
		if br.agent != agent {
			continue
		}
		k := commonPrefix(br.chain, chain)
		if k == len(br.chain) && k > 0 {
			return br.id, "", TurnContinue
		}
		if k > bestLen {
			best, bestLen = br, k
		}
	}
	b.inferred++
	name = fmt.Sprintf("b%d", b.inferred)
	if best != nil {
		return name, best.id, TurnFork
	}
	return name, "", TurnNew
}

// Finish records that a request of the branch ended at now: the branch
// waits for the agent's next call.
func (b *Branches) Finish(now time.Time, session, branch string) {
	br := b.get(session, branch)
	if br == nil || br.state == BranchEnded {
		return
	}
	if br.inFlight > 0 {
		br.inFlight--
	}
	br.lastUsed = now
	if br.inFlight == 0 {
		br.state = BranchWaiting
	}
}

// End ends a branch (the agent said so); an empty branch ends the whole
// session, or, for a sub-agent's own session (Identity.ParentSession),
// that sub-agent's branches. It reports how many branches ended.
func (b *Branches) End(session, branch string) int {
	if root, ok := b.roots[session]; ok {
		if branch == "" {
			return b.EndAgent(root, session)
		}
		session = root
	}
	s := b.sessions[session]
	if s == nil {
		return 0
	}
	n := 0
	for _, br := range s.sortedLive() {
		if branch == "" || br.id == branch {
			b.end(br, "ended by the agent")
			n++
		}
	}
	if branch == "" {
		b.forget(session)
	}
	return n
}

// EndAgent ends the branches of one agent of a session (the agent said
// it is done); agent "" is the root agent, and ends the whole session.
func (b *Branches) EndAgent(session, agent string) int {
	if agent == "" {
		return b.End(session, "")
	}
	s := b.sessions[session]
	if s == nil {
		return 0
	}
	n := 0
	for _, br := range s.sortedLive() {
		if br.agent == agent {
			b.end(br, "ended by the agent")
			n++
		}
	}
	return n
}

// forget drops a session and the sub-agent sessions that map to it.
func (b *Branches) forget(session string) {
	delete(b.sessions, session)
	for child, root := range b.roots {
		if root == session {
			delete(b.roots, child)
		}
	}
}

// Expire ends the branches idle longer than the TTL, and forgets sessions
// with nothing live.
func (b *Branches) Expire(now time.Time) int {
	n := 0
	ids := make([]string, 0, len(b.sessions))
	for id := range b.sessions {
		ids = append(ids, id)
	}
	sort.Strings(ids) // the order of Changes must not depend on map order
	for _, id := range ids {
		s := b.sessions[id]
		live := 0
		for _, br := range s.sortedAll() {
			if br.state == BranchWaiting && now.Sub(br.lastUsed) > b.ttl {
				b.end(br, "idle past the TTL")
				n++
			}
			if br.state != BranchEnded {
				live++
			}
		}
		if live == 0 && now.Sub(s.lastUsed) > 2*b.ttl { // ended branches stay listed a while
			b.forget(id)
		}
	}
	return n
}

// Refs is how many live branches reference block h.
func (b *Branches) Refs(h BlockHash) int {
	v, _ := b.refs.Get(h)
	return int(v)
}

// Referenced is the number of blocks some live branch references.
func (b *Branches) Referenced() int { return b.refs.Len() }

// Live is the number of live branches.
func (b *Branches) Live() int { return b.live }

// Changes returns the blocks whose reference count went from zero to more
// or back since the last call (their eviction priority changed), and
// forgets them.
func (b *Branches) Changes() []BlockHash {
	out := b.changed
	b.changed = nil
	return out
}

func (b *Branches) end(br *branch, why string) int {
	if br.state == BranchEnded {
		return 0
	}
	n := b.release(br.chain)
	br.chain = nil
	br.state, br.endReason = BranchEnded, why
	b.live--
	return n
}

// extend references chain[from:] for br and makes it br's context.
func (b *Branches) extend(br *branch, chain []BlockHash, from int) int {
	for _, h := range chain[from:] {
		p := b.refs.Ptr(h)
		if p == nil {
			b.refs.Put(h, 1)
			b.changed = append(b.changed, h)
			continue
		}
		if *p == 0 {
			b.changed = append(b.changed, h)
		}
		*p++
	}
	br.chain = append(br.chain[:from], chain[from:]...)
	return len(chain) - from
}

func (b *Branches) release(hs []BlockHash) int {
	for _, h := range hs {
		p := b.refs.Ptr(h)
		if p == nil {
			continue
		}
		if *p--; *p <= 0 {
			b.refs.Delete(h)
			b.changed = append(b.changed, h)
		}
	}
	return len(hs)
}

func (b *Branches) get(session, branch string) *branch {
	if s := b.sessions[session]; s != nil {
		return s.branches[branch]
	}
	return nil
}

func (s *session) sortedLive() []*branch {
	out := make([]*branch, 0, len(s.branches))
	for _, br := range s.branches {
		if br.state != BranchEnded {
			out = append(out, br)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].id < out[j].id })
	return out
}

func (s *session) sortedAll() []*branch {
	out := make([]*branch, 0, len(s.branches))
	for _, br := range s.branches {
		out = append(out, br)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].id < out[j].id })
	return out
}

func commonPrefix(a, b []BlockHash) int {
	n := min(len(a), len(b))
	for i := 0; i < n; i++ {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

// BranchInfo is a branch as operators see it. JSON names are stable.
type BranchInfo struct {
	Session string `json:"session"`
	Branch  string `json:"branch"`
	Parent  string `json:"parent,omitempty"`
	// Agent is the sub-agent the branch is of ("" for the root agent).
	Agent     string    `json:"agent,omitempty"`
	State     string    `json:"state"`
	Blocks    int       `json:"blocks"`
	Turns     int       `json:"turns"`
	Created   time.Time `json:"created"`
	LastUsed  time.Time `json:"last_used"`
	EndReason string    `json:"end_reason,omitempty"`
	// Chain is the branch's context, for callers that place its blocks.
	Chain []BlockHash `json:"-"`
}

// List reports the branches of a session (all sessions when empty),
// sorted by session and branch; ended branches are kept until their
// session is forgotten.
func (b *Branches) List(session string) []BranchInfo {
	var out []BranchInfo
	agent, sub := "", false
	if root, ok := b.roots[session]; ok { // a sub-agent's own session: its branches
		session, agent, sub = root, session, true
	}
	for id, s := range b.sessions {
		if session != "" && id != session {
			continue
		}
		for _, br := range s.branches {
			if sub && br.agent != agent {
				continue
			}
			out = append(out, BranchInfo{Session: id, Branch: br.id, Parent: br.parent, Agent: br.agent, State: br.state,
				Blocks: len(br.chain), Turns: br.turns, Created: br.created, LastUsed: br.lastUsed,
				EndReason: br.endReason, Chain: br.chain})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Session != out[j].Session {
			return out[i].Session < out[j].Session
		}
		return out[i].Branch < out[j].Branch
	})
	return out
}
