package orchestrator

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/evolvellm/evolve/internal/wait"
	"github.com/evolvellm/evolve/kv"
	"github.com/evolvellm/evolve/openaiapi"
	"github.com/evolvellm/evolve/protocol"
	"github.com/evolvellm/evolve/roles"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// An engine that dies mid-stream does not end the client's stream: the
// router continues the answer on another node from the tokens the client
// has read, and the client reads the answer it would have read had
// nothing failed: one id, every token, the same text. With every decode
// node gone, a prefill node (which takes whole requests) finishes it.
func TestEngineFailingMidStreamTheAnswerGoesOnElsewhere(t *testing.T) {
	tc := startTestCluster(t, roles.Prefill, roles.Decode, roles.Decode)
	const n = 3000
	body := streamedChat("a problem to reason about at length", 60, n, 5)
	post := func() *http.Response { return postChat(t, tc, body) }
	ref := readRoutedChat(t, post(), nil)
	if !ref.done || ref.chunks != n || len(ref.errors) > 0 || ref.handedOver != 0 {
		t.Fatalf("reference: %d chunks, done %v, errors %v, handed over %d", ref.chunks, ref.done, ref.errors, ref.handedOver)
	}
	check := func(what string, got *routedChat, resumed float64, on string) {
		t.Helper()
		if got.engine != on {
			t.Fatalf("%s: finished on %q, want %s", what, got.engine, on)
		}
		if !got.done || len(got.errors) > 0 || got.chunks != n {
			t.Fatalf("%s: %d chunks, done %v, errors %v", what, got.chunks, got.done, got.errors)
		}
		sameAnswerMovedOnce(t, what, got, ref, n)
		if v := testutil.ToFloat64(tc.o.met.resumed.WithLabelValues(resumeEngineFailed, "continued")); v != resumed {
			t.Fatalf("%s: answers resumed: %v, want %v", what, v, resumed)
		}
	}

	// The decode node dies at the first token: the other decode node
	// goes on.
	resp := post()
	first := resp.Header.Get(HeaderDecodeNode)
	idx := map[string]int{"e1": 1, "e2": 2}[first]
	if idx == 0 {
		t.Fatalf("decoded on %q", first)
	}
	check("a decode node died", readRoutedChat(t, resp, func() { tc.servers[idx].Close() }), 1, fmt.Sprint("e", 3-idx))
	if st, _ := tc.o.NodeStatus(first); st.Interrupted != 1 || st.Lost != 0 {
		t.Fatalf("%s: %d answers interrupted, %d lost", first, st.Interrupted, st.Lost)
	}

	// Now the last decode node dies too: the prefill node finishes it.
	resp = post()
	if d := resp.Header.Get(HeaderDecodeNode); d != "e1" && d != "e2" || d == first {
		t.Fatalf("decoded on %q", d)
	}
	check("every decode node died", readRoutedChat(t, resp, func() { tc.servers[3-idx].Close() }), 2, "e0")
}

// A node hands a stream over and the only peer cannot take it (its
// engine's HTTP side is gone while its heartbeats go on): the node
// finishes the answer where its KV is, as a node that cannot hand over
// does, recomputing almost nothing; the client reads the answer it would
// have read had nothing moved, the KV held for the peer is freed, and the
// switch goes through once the answer ends.
func TestHandOverThatNoPeerTakesFinishesWhereItWas(t *testing.T) {
	tc := startTestCluster(t, roles.Prefill, roles.Decode, roles.Decode)
	const n = 3000
	body := streamedChat("a long derivation", 100, n, 9)
	post := func() *http.Response { return postChat(t, tc, body) }
	ref := readRoutedChat(t, post(), nil)
	resp := post()
	from := resp.Header.Get(HeaderDecodeNode)
	peer := map[string]int{"e1": 2, "e2": 1}[from]
	if peer == 0 {
		t.Fatalf("decoded on %q", from)
	}
	tc.servers[peer].Close()
	got := readRoutedChat(t, resp, func() {
		if _, err := tc.o.SetRole(from, "prefill", true, "test"); err != nil {
			t.Error(err)
		}
	})
	if !got.done || len(got.errors) > 0 || got.chunks != n || got.content.String() != ref.content.String() {
		t.Fatalf("%d chunks, done %v, errors %v, same text %v", got.chunks, got.done, got.errors, got.content.String() == ref.content.String())
	}
	if len(got.ids) != 1 || got.roles != 1 || got.usage["completion_tokens"] != float64(n) || got.engine != from {
		t.Fatalf("ids %v, role named %d times, usage %v, finished on %q", got.ids, got.roles, got.usage, got.engine)
	}
	if v := testutil.ToFloat64(tc.o.met.handOvers.WithLabelValues("failed")); v != 1 {
		t.Fatalf("failed handovers counted: %v", v)
	}
	if v := testutil.ToFloat64(tc.o.met.resumed.WithLabelValues(resumeNoPeer, "continued")); v != 1 {
		t.Fatalf("answers finished where they were: %v", v)
	}
	wait.Until(t, 10*time.Second, from+" holds nothing and switches", func() bool {
		st, _ := tc.o.NodeStatus(from)
		tc.o.c.mu.Lock()
		held := tc.o.c.nodes[from].hb.Held
		tc.o.c.mu.Unlock()
		return st.Role == "prefill" && st.State == StateServing && held == 0
	})
	st, _ := tc.o.NodeStatus(from)
	if h := st.History; len(h) == 0 || h[len(h)-1].HandedOver != 0 {
		t.Fatalf("%s's history counts an answer handed over that no peer took: %+v", from, st.History)
	}
}

// A line the engine's stream ends in the middle of never reaches the
// client: it would join the next event's first line.
func TestRelayDropsALineCutShort(t *testing.T) {
	in := "data: {\"a\":1}\n\ndata: {\"b\":"
	var out bytes.Buffer
	werr, rerr := relaySSE(bufio.NewReader(strings.NewReader(in)), &out, func() {}, func(l []byte) []byte { return l })
	if werr != nil || rerr != io.EOF {
		t.Fatalf("relay: %v, %v", werr, rerr)
	}
	if out.String() != "data: {\"a\":1}\n\n" {
		t.Fatalf("relayed %q", out.String())
	}
}

// An engine that drains (it is stopping, or was told to) says so in its
// heartbeats: the node shows draining and nothing is routed to it until
// it takes requests again.
func TestADrainingNodeGetsNoRequests(t *testing.T) {
	logs := &recordLog{}
	tc := startTestClusterLogged(t, slog.New(logs), nil, roles.Decode, roles.Decode)
	if _, err := tc.o.control("e0", protocol.ControlRequest{Op: protocol.OpDrain}); err != nil {
		t.Fatal(err)
	}
	wait.Until(t, 10*time.Second, "e0 shows draining", func() bool {
		st, _ := tc.o.NodeStatus("e0")
		return st.State == StateDraining
	})
	for range 4 {
		resp := postChat(t, tc, `{"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}`)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if d := resp.Header.Get(HeaderDecodeNode); d != "e1" {
			t.Fatalf("routed to %s while e0 drains", d)
		}
	}
	// Not sent there and refused, either.
	if r := logs.find("engine failed before the first token; routing again", "node", "e0"); r != nil {
		t.Fatalf("a request went to the draining node: %v", r)
	}
	if _, err := tc.o.control("e0", protocol.ControlRequest{Op: protocol.OpResume}); err != nil {
		t.Fatal(err)
	}
	wait.Until(t, 10*time.Second, "e0 serves again", func() bool {
		st, _ := tc.o.NodeStatus("e0")
		return st.State == StateServing
	})
}

// An answer whose engine failed goes on where most of its prompt's KV
// is, rather than on the least busy node, which would recompute it all.
func TestAResumedAnswerGoesWhereItsPromptIs(t *testing.T) {
	tc := startTestCluster(t, roles.Prefill, roles.Decode, roles.Decode, roles.Decode)
	body := streamedChat("a long shared context", 80, 8, 1)
	resp := postChat(t, tc, body)
	holder := resp.Header.Get(HeaderDecodeNode)
	if got := readRoutedChat(t, resp, nil); !got.done || holder == "" || holder == "e0" {
		t.Fatalf("decoded on %q, done %v", holder, got.done)
	}
	p, _, perr := openaiapi.ParseBody([]byte(body), true, 0)
	if perr != nil {
		t.Fatal(perr)
	}
	chain := kv.ChainHashes(p.Tokens, tc.o.blockSize)
	wait.Until(t, 10*time.Second, holder+" holds the prompt's KV", func() bool {
		var m kv.Match
		tc.o.c.mu.Lock()
		defer tc.o.c.mu.Unlock()
		tc.o.c.dir.Match(chain, &m)
		return m.For(tc.o.c.nodes[holder].dir).Local >= len(chain)/2
	})
	// The holder is the busiest decode node: the least busy would be
	// another.
	tc.o.c.mu.Lock()
	tc.o.c.nodes[holder].inFlight += 2
	tc.o.c.mu.Unlock()
	defer tc.o.release(holder, holder)
	if id, _ := tc.o.claimResumer(map[string]bool{}, chain); id != holder {
		t.Fatalf("resumed on %s; %s holds the prompt", id, holder)
	} else {
		tc.o.release(id)
	}
	if id, _ := tc.o.claimResumer(map[string]bool{}, nil); id == holder || id == "e0" {
		t.Fatalf("without a prompt, resumed on %s, not the least busy decode node", id)
	} else {
		tc.o.release(id)
	}
}

// An answer whose decode node dies goes on at a node that holds none of
// its prompt: with no prefill node to compute the KV for it (the only one
// drains), that node pulls the prompt's KV from the prefill node that
// computed it (not from the dead node, which the directory still lists),
// while the answer waits, and recomputes only the output so
// far and the prompt's last partial block, not the whole context. The
// client still reads the answer it would have read.
func TestAResumedAnswerPullsItsPromptFromAPeer(t *testing.T) {
	tc := startTestCluster(t, roles.Prefill, roles.Decode, roles.Decode)
	const n = 6000
	body := streamedChat("a long context the agent keeps coming back to", 150, n, 3)
	p, _, perr := openaiapi.ParseBody([]byte(body), true, 0)
	if perr != nil {
		t.Fatal(perr)
	}
	bs := tc.o.blockSize
	full := len(p.Tokens) / bs * bs
	if full < 50*bs {
		t.Fatalf("the prompt has %d tokens: too short to tell a pull from a recompute", len(p.Tokens))
	}
	resp := postChat(t, tc, body)
	first := resp.Header.Get(HeaderDecodeNode)
	idx := map[string]int{"e1": 1, "e2": 2}[first]
	if idx == 0 || resp.Header.Get(HeaderPrefillNode) != "e0" {
		t.Fatalf("prefilled on %q, decoded on %q: want a split from e0", resp.Header.Get(HeaderPrefillNode), first)
	}
	chain := kv.ChainHashes(p.Tokens, bs)
	got := readRoutedChat(t, resp, func() {
		// The prefill node's KV events reach the directory in a batch:
		// let them land first, as they would long before a real engine
		// failed, then fail the decode node.
		// The decode node also copies its KV to its host tier, so that
		// the directory prefers it as the source of the prompt's blocks:
		// the pulls must come from e0 all the same.
		if _, err := tc.o.control(first, protocol.ControlRequest{Op: protocol.OpOffload}); err != nil {
			t.Fatal(err)
		}
		wait.Until(t, 10*time.Second, "the directory knows e0 holds the prompt, and "+first+" holds it in host", func() bool {
			var m kv.Match
			tc.o.c.mu.Lock()
			defer tc.o.c.mu.Unlock()
			tc.o.c.dir.Match(chain, &m)
			dead := tc.o.c.nodes[first].dir
			return m.For(tc.o.c.nodes["e0"].dir).Local == len(chain) && len(m.Sources) > 0 &&
				m.Sources[0].Node == dead && m.Sources[0].Tier == kv.TierHost
		})
		// A draining node takes no prefill leg (the router may not know
		// yet, and e0 refuses it), but it serves its KV.
		if _, err := tc.o.control("e0", protocol.ControlRequest{Op: protocol.OpDrain}); err != nil {
			t.Fatal(err)
		}
		tc.servers[idx].Close()
	})
	other := fmt.Sprint("e", 3-idx)
	if !got.done || len(got.errors) > 0 || got.chunks != n || got.engine != other || got.handedOver != 1 {
		t.Fatalf("%d chunks, done %v, errors %v, finished on %q, moved %d times", got.chunks, got.done, got.errors, got.engine, got.handedOver)
	}
	// The resuming leg found the prompt's full blocks in its host tier
	// (where pulled blocks land), save the last one, which an engine
	// computes again when the output starts inside it.
	if got.hostHit < full-bs {
		t.Fatalf("the resumed leg found %d of the prompt's %d tokens in host: it recomputed the context", got.hostHit, len(p.Tokens))
	}
	out := int(got.usage["completion_tokens"].(float64))
	if limit := len(p.Tokens) - full + bs + out; got.computed > limit {
		t.Fatalf("the resumed leg computed %d tokens, more than the output so far and a block (%d)", got.computed, limit)
	}
	if f := tc.o.kvc.fetchedBlocks.Load(); f < int64(full/bs-1) {
		t.Fatalf("the router counts %d blocks fetched, want the prompt's %d", f, full/bs)
	}
	if f := testutil.ToFloat64(tc.o.met.resumePulled); f != float64(tc.o.kvc.fetchedBlocks.Load()) {
		t.Fatalf("evolve_router_resume_fetched_blocks_total is %v, the router fetched %d blocks", f, tc.o.kvc.fetchedBlocks.Load())
	}
	if v := testutil.ToFloat64(tc.o.met.resumePrefilled); v != 0 {
		t.Fatalf("%v resumes prefilled with the only prefill node draining", v)
	}
}

// An answer whose decode node dies far into it goes on in two legs: the
// prefill node computes the KV of the prompt and of the output so far
// (too much for a decode node to recompute without stalling the streams
// it decodes) and holds it, and the other decode node pulls it and
// writes the rest, computing almost nothing. The client reads the answer
// it would have read, and the answer's story says where its KV came from.
func TestAResumedAnswerFarIntoItIsPrefilledElsewhere(t *testing.T) {
	tc := startTestCluster(t, roles.Prefill, roles.Decode, roles.Decode)
	const n, at = 3000, 1200
	body := streamedChat("a problem to reason about at length", 60, n, 11)
	ref := readRoutedChat(t, postChat(t, tc, body), nil)
	resp := postChat(t, tc, body)
	first := resp.Header.Get(HeaderDecodeNode)
	idx := map[string]int{"e1": 1, "e2": 2}[first]
	if idx == 0 {
		t.Fatalf("decoded on %q", first)
	}
	got := readRoutedChatAt(t, resp, at, func() { tc.servers[idx].Close() })
	other := fmt.Sprint("e", 3-idx)
	if got.engine != other || !got.done || len(got.errors) > 0 || got.chunks != n {
		t.Fatalf("finished on %q, %d chunks, done %v, errors %v", got.engine, got.chunks, got.done, got.errors)
	}
	sameAnswerMovedOnce(t, "resumed far into it", got, ref, n)
	bs := tc.o.blockSize
	prompt := int(ref.usage["prompt_tokens"].(float64))
	// The decode leg pulled the prompt and at least the output the client
	// had read, and computed at most a block; the prefill leg computed
	// that output.
	if got.transferred < (prompt+at)/bs*bs-bs || got.computed > bs {
		t.Fatalf("the decode leg pulled %d tokens and computed %d: want the prompt (%d) and %d output tokens pulled",
			got.transferred, got.computed, prompt, at)
	}
	if got.prefillEngine != "e0" || got.prefillComputed < at-bs {
		t.Fatalf("the resume's prefill leg: on %q, computed %d tokens; want e0, the output so far (at least %d)", got.prefillEngine, got.prefillComputed, at)
	}
	if v := testutil.ToFloat64(tc.o.met.resumePrefilled); v != 1 {
		t.Fatalf("evolve_router_resume_prefilled_total is %v", v)
	}
	if v := testutil.ToFloat64(tc.o.met.resumed.WithLabelValues(resumeEngineFailed, "continued")); v != 1 {
		t.Fatalf("answers resumed: %v", v)
	}
	// Neither node is left claimed, nor e0 holding the KV.
	wait.Until(t, 10*time.Second, "no claims or holds left", func() bool {
		tc.o.c.mu.Lock()
		defer tc.o.c.mu.Unlock()
		return tc.o.c.nodes["e0"].inFlight == 0 && tc.o.c.nodes[other].inFlight == 0 && tc.o.c.nodes["e0"].hb.Held == 0
	})
}

// An engine that dies while it writes a whole (not streamed) answer does
// not cost the client that answer either: the engine named each token to
// the router ahead of the answer, and the router continues it elsewhere
// (here split, the output so far being long); the client gets the answer
// it would have got had nothing failed.
func TestEngineFailingMidAWholeAnswerTheAnswerGoesOnElsewhere(t *testing.T) {
	tc := startTestCluster(t, roles.Prefill, roles.Decode, roles.Decode)
	const n, at = 6000, 1000
	body := fmt.Sprintf(`{"messages": [{"role": "user", "content": %q}], "max_tokens": %d, "ignore_eos": true, "seed": 4}`,
		strings.Repeat("a question to think hard about ", 40), n)
	type answer struct {
		Choices []struct {
			Message struct{ Content string } `json:"message"`
		} `json:"choices"`
		Usage  map[string]any `json:"usage"`
		Evolve struct {
			Engine     string `json:"engine"`
			HandedOver int    `json:"handed_over"`
		} `json:"evolve"`
	}
	whole := func() answer {
		var a answer
		resp, err := http.Post(tc.o.RouterURL()+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Error(err)
			return a
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if err := json.Unmarshal(b, &a); resp.StatusCode != 200 || err != nil || len(a.Choices) != 1 {
			t.Errorf("status %d: %.300s", resp.StatusCode, b)
		}
		return a
	}
	generated := func(id string) float64 {
		tc.o.c.mu.Lock()
		url := tc.o.c.nodes[id].reg.URL
		tc.o.c.mu.Unlock()
		resp, err := http.Get(url + "/metrics")
		if err != nil {
			return 0
		}
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if rest, ok := strings.CutPrefix(sc.Text(), "vllm:generation_tokens_total{"); ok {
				var v float64
				fmt.Sscan(rest[strings.LastIndexByte(rest, ' ')+1:], &v)
				return v
			}
		}
		return 0
	}
	ref := whole()
	before := map[string]float64{"e1": generated("e1"), "e2": generated("e2")}
	got := make(chan answer, 1)
	go func() { got <- whole() }()
	dead := ""
	wait.Until(t, 10*time.Second, fmt.Sprintf("a decode node has written %d tokens of the answer", at), func() bool {
		for id, b := range before {
			if generated(id)-b >= at {
				dead = id
				return true
			}
		}
		return false
	})
	tc.servers[map[string]int{"e1": 1, "e2": 2}[dead]].Close()
	a := <-got
	other := map[string]string{"e1": "e2", "e2": "e1"}[dead]
	if len(a.Choices) != 1 || len(ref.Choices) != 1 || a.Choices[0].Message.Content != ref.Choices[0].Message.Content {
		t.Fatalf("the answer changed when its engine died")
	}
	if a.Evolve.Engine != other || a.Evolve.HandedOver != 1 || a.Usage["completion_tokens"] != float64(n) ||
		a.Usage["prompt_tokens"] != ref.Usage["prompt_tokens"] {
		t.Fatalf("finished on %q, moved %d times, usage %v (want %v)", a.Evolve.Engine, a.Evolve.HandedOver, a.Usage, ref.Usage)
	}
	if v := testutil.ToFloat64(tc.o.met.resumed.WithLabelValues(resumeEngineFailed, "continued")); v != 1 {
		t.Fatalf("answers resumed: %v", v)
	}
	if v := testutil.ToFloat64(tc.o.met.resumePrefilled); v != 1 {
		t.Fatalf("resumes prefilled: %v", v)
	}
}

// A vLLM answer goes on where most of its prompt is, a prefill node
// included: a vLLM engine pulls nothing, so another decode node would
// recompute the whole prompt. A node that failed lately comes last.
func TestAResumedVLLMAnswerGoesWhereItsPromptIs(t *testing.T) {
	tc := startTestCluster(t, roles.Prefill, roles.Decode, roles.Decode)
	body := streamedChat("a long shared context for vLLM", 80, 8, 1)
	resp := postChat(t, tc, body)
	holder := resp.Header.Get(HeaderDecodeNode)
	if got := readRoutedChat(t, resp, nil); !got.done || resp.Header.Get(HeaderPrefillNode) != "e0" || holder == "e0" {
		t.Fatalf("prefilled on %q, decoded on %q, done %v", resp.Header.Get(HeaderPrefillNode), holder, got.done)
	}
	p, _, perr := openaiapi.ParseBody([]byte(body), true, 0)
	if perr != nil {
		t.Fatal(perr)
	}
	chain := kv.ChainHashes(p.Tokens, tc.o.blockSize)
	wait.Until(t, 10*time.Second, "e0 holds the prompt's KV", func() bool {
		var m kv.Match
		tc.o.c.mu.Lock()
		defer tc.o.c.mu.Unlock()
		tc.o.c.dir.Match(chain, &m)
		return m.For(tc.o.c.nodes["e0"].dir).Local >= len(chain)/2
	})
	tc.o.c.mu.Lock()
	for _, n := range tc.o.c.nodes { // registered as vLLM engines
		n.reg.Backend, n.reg.Tokenizer, n.reg.CanHandOver = "vllm", "engine", false
	}
	tc.o.c.mu.Unlock()
	failed := map[string]bool{holder: true}
	if id, _, held := tc.o.claimVLLMResumer(failed, chain, "vllm"); id != "e0" || held < len(chain)/2*tc.o.blockSize {
		t.Fatalf("resumed on %s, which holds %d tokens; the prefill node e0 holds the prompt", id, held)
	} else {
		tc.o.release(id)
	}
	// Where a prefill node serves, a decode node goes on (the prefill
	// node computes the KV for it).
	if !tc.o.vllmPrefillServes(failed, "vllm") || tc.o.vllmPrefillServes(map[string]bool{"e0": true}, "vllm") {
		t.Fatal("vllmPrefillServes does not see e0, the one vLLM prefill node, or sees it excluded")
	}
	if id, _, _ := tc.o.claimVLLMResumer(failed, chain, "vllm", roles.Decode); id == "e0" || id == holder || id == "" {
		t.Fatalf("a decode node resumed on %q", id)
	} else {
		tc.o.release(id)
	}
	tc.o.c.mu.Lock()
	tc.o.c.nodes["e0"].failedAt = time.Now()
	tc.o.c.mu.Unlock()
	if id, _, _ := tc.o.claimVLLMResumer(failed, chain, "vllm"); id == "e0" || id == holder || id == "" {
		t.Fatalf("resumed on %q: e0 failed a request lately, and %s failed this one", id, holder)
	} else {
		tc.o.release(id)
	}
	if id, _, _ := tc.o.claimVLLMResumer(failed, chain, "sglang"); id != "" {
		t.Fatalf("an engine of another backend, %s, would go on with a vLLM answer", id)
	}
}

// Routing leaves out a node that failed a request lately, while another
// serves: a dead engine looks idle until its agent reports it down.
func TestRoutingLeavesOutANodeThatFailedLately(t *testing.T) {
	tc := startTestCluster(t, roles.Both, roles.Both)
	if s := tc.o.suspects(); len(s) != 0 {
		t.Fatalf("suspects at start: %v", s)
	}
	// The node that holds the prompt, which routing would pick again,
	// fails.
	body := streamedChat("after a failure", 20, 4, 1)
	resp := postChat(t, tc, body)
	holder := resp.Header.Get(HeaderDecodeNode)
	readRoutedChat(t, resp, nil)
	other := map[string]string{"e0": "e1", "e1": "e0"}[holder]
	wait.Until(t, 10*time.Second, holder+" holds the prompt's KV", func() bool {
		resp := postChat(t, tc, body)
		defer readRoutedChat(t, resp, nil)
		return resp.Header.Get(HeaderDecodeNode) == holder
	})
	tc.o.suspectNode(holder)
	if s := tc.o.suspects(); len(s) != 1 || !s[holder] {
		t.Fatalf("suspects after %s failed: %v", holder, s)
	}
	for range 5 {
		resp := postChat(t, tc, body)
		if node := resp.Header.Get(HeaderDecodeNode); node != other {
			t.Fatalf("routed to %s while %s is suspect", node, node)
		}
		readRoutedChat(t, resp, nil)
	}
	tc.o.suspectNode(other)
	if s := tc.o.suspects(); len(s) != 0 {
		t.Fatalf("every node failed lately: suspects %v, want none (requests must go somewhere)", s)
	}
}
