package orchestrator

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/evolvellm/evolve/internal/wait"
	"github.com/evolvellm/evolve/kv"
	"github.com/evolvellm/evolve/openaiapi"
	"github.com/evolvellm/evolve/orchestrator/routing"
	"github.com/evolvellm/evolve/roles"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// words makes a prompt of n distinct words of a family.
func words(family string, n int) string {
	var b strings.Builder
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "%s%d ", family, i)
	}
	return b.String()
}

// turn sends a completion as an agent, with its identity in headers.
func turn(t *testing.T, router, session, branch, parent string, rewrite bool, prompt string) map[string]any {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"prompt": prompt, "max_tokens": 2})
	req, _ := http.NewRequest("POST", router+"/v1/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Evolve-Session", session)
	if branch != "" {
		req.Header.Set("X-Evolve-Branch", branch)
	}
	if parent != "" {
		req.Header.Set("X-Evolve-Parent-Branch", parent)
	}
	if rewrite {
		req.Header.Set("X-Evolve-Rewrite", "true")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("turn %s/%s: %d %s", session, branch, resp.StatusCode, b)
	}
	var out map[string]any
	json.Unmarshal(b, &out)
	return out
}

func chainOfPrompt(t *testing.T, prompt string) []kv.BlockHash {
	body, _ := json.Marshal(map[string]any{"prompt": prompt})
	p, perr := openaiapi.Parse(body, false, 0)
	if perr != nil {
		t.Fatal(perr)
	}
	return kv.ChainHashes(p.Tokens, 16)
}

// gpuPrefix is how many leading blocks of chain node holds on GPU, per
// the directory.
func (tc *testCluster) gpuPrefix(node string, chain []kv.BlockHash) int {
	o := tc.o
	o.c.mu.Lock()
	defer o.c.mu.Unlock()
	var m kv.Match
	o.c.dir.Match(chain, &m)
	return m.For(o.c.nodes[node].dir).GPU
}

// A compaction makes the old context the first to go: memory pressure
// then evicts the rewritten branch's dead tail, not the older context of
// another agent's live branch (plain LRU would take that one first).
func TestCompactedTailIsEvictedFirst(t *testing.T) {
	tc := startTestCluster(t, roles.Decode) // one tiny engine: 512 GPU blocks of 16 tokens
	router := tc.o.RouterURL()
	b := words("bravo", 1000) // about 125 blocks
	a := words("alpha", 1000)
	turn(t, router, "s2", "main", "", false, b) // the oldest context, but live
	turn(t, router, "s1", "main", "", false, a)
	// s1 compacts: its new branch keeps the start and a summary.
	turn(t, router, "s1", "main.c1", "main", true, a[:strings.Index(a, "alpha160 ")]+words("summary", 150))
	list := tc.o.Branches("s1")
	if len(list) != 2 || list[0].Branch != "main" || list[0].State != "ended" || list[1].State != "waiting" {
		t.Fatalf("branches of s1 after compaction: %+v", list)
	}
	tc.eventsAndHintsApplied(t, "e0")
	if testutil.ToFloat64(tc.o.met.hints.WithLabelValues("delivered")) == 0 {
		t.Fatal("no eviction hints delivered")
	}
	// Pressure: two more agents' contexts need room.
	turn(t, router, "s3", "main", "", false, words("charlie", 1200))
	turn(t, router, "s4", "main", "", false, words("delta", 1200))
	ca, cb := chainOfPrompt(t, a), chainOfPrompt(t, b)
	// The engine's events arrive in order: once the directory sees the
	// dead tail evicted, it has seen any eviction of the live branch's
	// (older, so first by LRU) blocks too.
	wait.Until(t, 10*time.Second, "the directory sees the dead tail evicted", func() bool {
		return tc.gpuPrefix("e0", ca) < len(ca)
	})
	if got := tc.gpuPrefix("e0", cb); got != len(cb) {
		t.Fatalf("the live branch lost GPU blocks: %d of %d left (the dead tail had %d of %d)", got, len(cb), tc.gpuPrefix("e0", ca), len(ca))
	}
	// The live branch is reported with all its blocks on the GPU.
	s2 := tc.o.Branches("s2")
	if len(s2) != 1 || len(s2[0].Residency) != 1 || s2[0].Residency[0].GPU != s2[0].Blocks {
		t.Fatalf("s2: %+v", s2)
	}
	st := tc.o.KV()
	if st.LiveBranches != 4 || st.ReferencedBlocks == 0 || st.Nodes[0].GPUReferenced == 0 {
		t.Fatalf("kv summary: %+v", st)
	}
	// One node: the pool is its tiers.
	n, p := st.Nodes[0], st.Pool
	if p.GPUCapacity != n.GPUCapacity || p.GPUCached != n.GPUCached || p.GPUReferenced != n.GPUReferenced ||
		p.GPUFree != n.GPUCapacity-n.GPUCached || p.HostCapacity != n.HostCapacity {
		t.Fatalf("pool %+v, node %+v", p, n)
	}
}

// An agent ends its session: its branches end, the router says so, and a
// second end is a 404.
func TestAgentEndsSession(t *testing.T) {
	tc := startTestCluster(t, roles.Decode)
	router := tc.o.RouterURL()
	turn(t, router, "s", "main", "", false, words("echo", 100))
	turn(t, router, "s", "sub1", "main", false, words("echo", 50)+words("fox", 30))
	del := func(path string) int {
		req, _ := http.NewRequest("DELETE", router+path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := del("/v1/sessions/s/branches/sub1"); code != 200 {
		t.Fatalf("end branch: %d", code)
	}
	if code := del("/v1/sessions/s/branches/sub1"); code != 404 {
		t.Fatalf("end an ended branch: %d", code)
	}
	if code := del("/v1/sessions/s"); code != 200 || tc.o.KV().LiveBranches != 0 {
		t.Fatalf("end session: %d, live %d", code, tc.o.KV().LiveBranches)
	}
	if code := del("/v1/sessions/nope"); code != 404 {
		t.Fatalf("end an unknown session: %d", code)
	}
	// Metadata carries the identity too.
	status, _ := postJSON(t, router+"/v1/completions", `{"prompt": "golf hotel india", "max_tokens": 1, "metadata": {"session": "m", "branch": "x"}}`)
	if list := tc.o.Branches("m"); status != 200 || len(list) != 1 || list[0].Branch != "x" {
		t.Fatalf("identity from metadata: %d %+v", status, list)
	}
}

// A branch's context survives its node switching role: the node's GPU KV
// goes to its host pool, and the branch's next turn, prefilled on a node
// that never saw it, fetches it from that host pool instead of
// recomputing it.
func TestBranchContextSurvivesARoleSwitch(t *testing.T) {
	tc := startTestCluster(t, roles.Prefill, roles.Decode, roles.Decode)
	router := tc.o.RouterURL()
	p := words("context", 600) // about 75 blocks
	turn(t, router, "s", "main", "", false, p)
	chain := chainOfPrompt(t, p)
	// Which decode node decoded it, and which never saw it.
	var holder, other string
	wait.Until(t, 10*time.Second, "the decode node's copy is known", func() bool {
		holder, other = "", ""
		for _, id := range []string{"e1", "e2"} {
			if tc.gpuPrefix(id, chain) == len(chain) {
				holder = id
			} else {
				other = id
			}
		}
		return holder != "" && other != "" && tc.gpuPrefix("e0", chain) == len(chain)
	})
	// e0, the prefill node that holds the context, becomes a decode node
	// (its GPU KV goes to its host pool); the node that never saw the
	// context becomes the prefill node.
	for _, sw := range []struct{ id, role string }{{"e0", "decode"}, {other, "prefill"}} {
		t.Run(sw.id, func(t *testing.T) {
			if _, err := tc.o.SetRole(sw.id, sw.role, true, "test"); err != nil {
				t.Fatal(err)
			}
		})
	}
	wait.Until(t, 10*time.Second, "both switches end", func() bool {
		a, _ := tc.o.NodeStatus("e0")
		b, _ := tc.o.NodeStatus(other)
		return a.Role == "decode" && a.State == StateServing && b.Role == "prefill" && b.State == StateServing
	})
	wait.Until(t, 10*time.Second, "e0's host pool holds the branch's blocks after its switch", func() bool {
		for _, r := range tc.o.Branches("s")[0].Residency {
			if r.Node == "e0" {
				return r.Host == len(chain)
			}
		}
		return false
	})
	// The next turn: the new prefill node fetches the context from a
	// peer's host pool while the request waits, and computes only the
	// new tokens.
	before := tc.o.KV().RemoteHostTokens
	queries, hits := tc.engineCounter(t, other, "vllm:prefix_cache_queries_total"), tc.engineCounter(t, other, "vllm:prefix_cache_hits_total")
	turn(t, router, "s", "main", "", false, p+words("more", 400))
	if got := tc.o.KV().RemoteHostTokens - before; got < int64(len(chain)*16)/2 {
		t.Fatalf("fetched %d tokens from peers for a %d-block context", got, len(chain))
	}
	// The prefill node waited for the fetch: its prefix cache found the
	// whole context, and it computed only the new tokens.
	prompt := tc.engineCounter(t, other, "vllm:prefix_cache_queries_total") - queries
	found := tc.engineCounter(t, other, "vllm:prefix_cache_hits_total") - hits
	if found < float64(len(chain)*16) || found >= prompt {
		t.Fatalf("the prefill node found %v of %v prompt tokens in its cache, want the %d tokens of the fetched context", found, prompt, len(chain)*16)
	}
}

// prefillUsage decodes an answer's usage as the prefill leg does.
func prefillUsage(t *testing.T, answer string) *usage {
	t.Helper()
	var out struct {
		Usage *usage `json:"usage"`
	}
	if err := json.Unmarshal([]byte(answer), &out); err != nil || out.Usage == nil {
		t.Fatalf("bad answer %s: %v", answer, err)
	}
	return out.Usage
}

// eventsAndHintsApplied waits until the directory has applied every KV
// event engine id had sent when the call began (as a heartbeat sent after
// it says), and the engine has answered every eviction hint sent since:
// hints go when a turn begins and when its blocks' events arrive, and an
// engine answers once it has applied them.
func (tc *testCluster) eventsAndHintsApplied(t *testing.T, id string) {
	t.Helper()
	since := time.Now()
	wait.Until(t, 10*time.Second, id+"'s KV events and eviction hints applied", func() bool {
		tc.o.c.mu.Lock()
		n := tc.o.c.nodes[id]
		applied := n != nil && n.hb.Time.After(since) && tc.o.c.dir.LastSeq(n.dir) >= n.hb.LastKVSeq
		tc.o.c.mu.Unlock()
		return applied && tc.o.hintsPending.Load() == 0
	})
}

// engineCounter reads a counter from node id's /metrics.
func (tc *testCluster) engineCounter(t *testing.T, id, name string) float64 {
	t.Helper()
	tc.o.c.mu.Lock()
	url := tc.o.c.nodes[id].reg.URL
	tc.o.c.mu.Unlock()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(body), "\n") {
		if f := strings.Fields(line); len(f) == 2 && (f[0] == name || strings.HasPrefix(f[0], name+"{")) {
			v, err := strconv.ParseFloat(f[1], 64)
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
	}
	t.Fatalf("%s has no %s", id, name)
	return 0
}

// Live branches whose contexts outgrow the GPU: the evictions of their
// blocks are counted per node and tier, and reported in the KV summary.
func TestReferencedEvictionsAreCounted(t *testing.T) {
	tc := startTestCluster(t, roles.Decode) // one tiny engine: 512 GPU blocks of 16 tokens
	router := tc.o.RouterURL()
	for i, w := range []string{"echo", "foxtrot", "golf", "hotel", "india"} {
		turn(t, router, fmt.Sprintf("s%d", i), "main", "", false, words(w, 1000)) // about 125 blocks each
	}
	wait.Until(t, 10*time.Second, "referenced evictions counted", func() bool {
		n := tc.o.KV().Nodes[0]
		return n.RefEvictedGPU > 0
	})
	n := tc.o.KV().Nodes[0]
	if n.RefLost > n.RefEvictedGPU+n.RefEvictedHost {
		t.Fatalf("more lost than evicted: %+v", n)
	}
	// The node's tokens per second come from its pass records.
	wait.Until(t, 10*time.Second, "tokens per second", func() bool { return tc.o.Nodes()[0].TokensPerSec > 0 })
	// The control API's last minute (the router's first seconds, here)
	// counts those requests, measured.
	if r := tc.o.Status().Recent; r.Requests != 5 || r.TTFTP50 <= 0 || r.E2EP50 < r.TTFTP50 || r.WindowSec < 1 || r.WindowSec > 60 {
		t.Fatalf("recent: %+v", r)
	}
}

// Lost KV reuse is read from the prefill's usage, once per request: the
// blocks some engine had computed that this one computed again, not those
// it found cached after all; never from engines that report no cached
// tokens (the router counts those as placed when the answer ends).
func TestLostReuseCountsWhatThePrefillRecomputed(t *testing.T) {
	const bs = 16
	tokens := make([]uint32, 1000) // 62 whole blocks and 8 tokens
	for i := range tokens {
		tokens[i] = uint32(i)
	}
	chain := kv.ChainHashes(tokens, bs)
	ever := &kv.Set{}
	for _, h := range chain[:50] { // engines computed 50 blocks before
		ever.Add(h)
	}
	placed := func() *kv.PlacedReuse { r := kv.NotePlacement(chain, 30, ever); return &r } // the node held 30
	o := &Orchestrator{}
	a := &attempt{o: o, attemptRequest: attemptRequest{reuse: placed(), bs: bs, chain: chain, dec: routing.Decision{Disaggregated: true}}}
	a.countComputed(prefillUsage(t, `{"usage": {"prompt_tokens": 1000, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 480}}}`))
	if got := o.kvc.lostReuse.Load(); got != 20*bs {
		t.Fatalf("found the 30 blocks held, computed 20 computed before: lost %d, want %d", got, 20*bs)
	}
	a.countComputed(prefillUsage(t, `{"usage": {"prompt_tokens": 1000, "prompt_tokens_details": {"cached_tokens": 0}}}`))
	if got := o.kvc.lostReuse.Load(); got != 20*bs {
		t.Fatalf("a second answer counted again: %d", got)
	}
	// Served on one node, the whole answer's usage: a request of the same
	// prefix computed the other 20 meanwhile, so nothing is lost.
	o = &Orchestrator{}
	b := &attempt{o: o, attemptRequest: attemptRequest{reuse: placed(), bs: bs, chain: chain}}
	b.countUsage([]byte(`{"usage": {"prompt_tokens": 1000, "completion_tokens": 9, "prompt_tokens_details": {"cached_tokens": 800}}}`))
	if got := o.kvc.lostReuse.Load(); got != 0 || b.outTokens != 9 {
		t.Fatalf("lost %d (want 0), output %d (want 9)", got, b.outTokens)
	}
	// Nothing found cached: the 30 held and the 20 after them.
	c := &attempt{o: o, attemptRequest: attemptRequest{reuse: placed(), bs: bs, chain: chain}}
	c.countUsage([]byte(`{"usage": {"prompt_tokens": 1000, "completion_tokens": 9, "prompt_tokens_details": {"cached_tokens": 0}}}`))
	if got := o.kvc.lostReuse.Load(); got != 50*bs {
		t.Fatalf("nothing cached: lost %d, want %d", got, 50*bs)
	}
	// No cached-token report, or a request already counted: not here.
	d := &attempt{o: o, attemptRequest: attemptRequest{reuse: placed(), bs: bs, chain: chain}}
	d.countUsage([]byte(`{"usage": {"prompt_tokens": 1000, "completion_tokens": 9}}`))
	e := &attempt{o: o, attemptRequest: attemptRequest{reuse: &kv.PlacedReuse{}, bs: bs, chain: chain}}
	e.countUsage([]byte(`{"usage": {"prompt_tokens": 1000, "completion_tokens": 9, "prompt_tokens_details": {"cached_tokens": 0}}}`))
	if got := o.kvc.lostReuse.Load(); got != 50*bs || !d.reuse.Noted() {
		t.Fatalf("counted without a report or twice: %d", got)
	}
}

// An agent that gives up on a request and then ends its session: the
// abandoned request, still being read when the session ended, must not
// start a turn that brings the session back (its branch would hold the
// context as referenced until the idle TTL).
func TestAbandonedRequestDoesNotReviveItsSession(t *testing.T) {
	tc := startTestCluster(t, roles.Decode)
	router := tc.o.RouterURL()
	prompt := words("kilo", 80)
	turn(t, router, "s", "main", "", false, prompt)
	req, _ := http.NewRequest("DELETE", router+"/v1/sessions/s", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || tc.o.KV().LiveBranches != 0 {
		t.Fatalf("end session: %d, live branches %d", resp.StatusCode, tc.o.KV().LiveBranches)
	}
	body, _ := json.Marshal(map[string]any{"prompt": prompt + "lima", "max_tokens": 2})
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // the client is gone by the time the router has read it
	abandoned := httptest.NewRequest("POST", "/v1/completions", bytes.NewReader(body)).WithContext(ctx)
	abandoned.Header.Set("X-Evolve-Session", "s")
	tc.o.serveGenerate(httptest.NewRecorder(), abandoned, false)
	if list := tc.o.Branches("s"); len(list) != 0 || tc.o.KV().LiveBranches != 0 {
		t.Fatalf("the abandoned request revived session s: %+v", list)
	}
	// A request that is waited for still starts the session again.
	turn(t, router, "s", "main", "", false, prompt)
	if list := tc.o.Branches("s"); len(list) != 1 {
		t.Fatalf("a new turn after the end: %+v", list)
	}
}

// Sub-agents that have sessions of their own (OpenCode's, Dynamo's) are
// children of their parent's tree as the router sees them; a sub-agent
// named inside its session (Claude Code's agent id) forks from its
// parent's branch; x-dynamo-session-final ends the agent it names once
// its request is answered, and DELETE of a child's session ends its
// branches only.
func TestSubAgentsFromAgentHeaders(t *testing.T) {
	tc := startTestCluster(t, roles.Decode)
	router := tc.o.RouterURL()
	send := func(prompt string, h map[string]string) {
		t.Helper()
		req, _ := http.NewRequest("POST", router+"/v1/completions", strings.NewReader(fmt.Sprintf(`{"prompt": %q, "max_tokens": 1}`, prompt)))
		for k, v := range h {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%v: %d", h, resp.StatusCode)
		}
	}
	sys := words("system", 300)
	send(sys+" the user's task", map[string]string{"X-Session-Id": "ses_root"})
	send(sys+" a sub-task", map[string]string{"X-Session-Id": "ses_child", "X-Parent-Session-Id": "ses_root"})
	send(sys+" its own sub-task", map[string]string{"X-Session-Id": "ses_grand", "X-Parent-Session-Id": "ses_child"})
	list := tc.o.Branches("ses_root")
	agents := map[string]BranchStatus{}
	for _, b := range list {
		agents[b.Agent] = b
	}
	if len(list) != 3 || agents["ses_child"].Parent != agents[""].Branch || agents["ses_grand"].Parent != agents["ses_child"].Branch {
		t.Fatalf("the tree of ses_root: %+v", list)
	}
	if code := deleteStatus(t, router+"/v1/sessions/ses_child"); code != 200 || tc.o.KV().LiveBranches != 2 {
		t.Fatalf("DELETE of the child's session: %d, %d branches live", code, tc.o.KV().LiveBranches)
	}
	// Claude Code's sub-agent, then its session's end.
	cc := map[string]string{"X-Claude-Code-Session-Id": "cc1"}
	send(sys+" fix the bug", cc)
	send(sys+" look for the bug's cause", map[string]string{"X-Claude-Code-Session-Id": "cc1", "X-Claude-Code-Agent-Id": "agent-7"})
	list = tc.o.Branches("cc1")
	if len(list) != 2 || list[1].Agent != "agent-7" || list[1].Parent != list[0].Branch {
		t.Fatalf("Claude Code's sub-agent: %+v", list)
	}
	live := tc.o.KV().LiveBranches
	send(sys+" fix the bug, done", map[string]string{"X-Claude-Code-Session-Id": "cc1", "X-Dynamo-Session-Final": "true"})
	if after := tc.o.KV().LiveBranches; after != live-2 || len(tc.o.Branches("cc1")) != 0 {
		t.Fatalf("after the session's final request: %d branches live (%d before), cc1's %+v", after, live, tc.o.Branches("cc1"))
	}
}

func deleteStatus(t *testing.T, url string) int {
	t.Helper()
	req, _ := http.NewRequest("DELETE", url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}
