package orchestrator

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/evolvellm/evolve/internal/wait"
	"github.com/evolvellm/evolve/openaiapi/openaiapitest"
	"github.com/evolvellm/evolve/roles"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// routedChat is a streamed chat answer as a client reads it through the
// router.
type routedChat struct {
	header     http.Header
	content    strings.Builder
	chunks     int
	ids        map[string]bool
	roles      int
	usage      map[string]any
	handedOver int    // the evolve object's handed_over
	engine     string // and its engine: the one that finished the answer
	// The evolve object's prompt KV story (the last leg's, after a
	// failure): tokens found in the host tier, pulled from the prefill
	// leg's engine and computed; and the prefill leg's engine and
	// computed tokens, when the router split the request.
	hostHit, transferred, computed int
	prefillEngine                  string
	prefillComputed                int
	done                           bool
	errors                         []string
}

// streamedChat is a streamed chat request (with usage) whose prompt says
// topic times times, for max tokens with seed.
func streamedChat(topic string, times, max, seed int) string {
	return fmt.Sprintf(`{"messages": [{"role": "user", "content": %q}], "max_tokens": %d, "ignore_eos": true, "seed": %d, "stream": true, "stream_options": {"include_usage": true}}`,
		strings.Repeat(topic+" ", times), max, seed)
}

// postChat sends a chat request to the router; the answer must be 200.
func postChat(t *testing.T, tc *testCluster, body string) *http.Response {
	t.Helper()
	resp, err := http.Post(tc.o.RouterURL()+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	return resp
}

// sameAnswerMovedOnce checks that an answer that went on elsewhere once
// is the reference answer: the same text, one id, the role named once,
// n output tokens and the same prompt.
func sameAnswerMovedOnce(t *testing.T, what string, got, ref *routedChat, n int) {
	t.Helper()
	if got.content.String() != ref.content.String() {
		t.Fatalf("%s: the answer changed when it moved", what)
	}
	if len(got.ids) != 1 || got.roles != 1 || got.handedOver != 1 {
		t.Fatalf("%s: ids %v, role named %d times, moved %d times", what, got.ids, got.roles, got.handedOver)
	}
	if got.usage["completion_tokens"] != float64(n) || got.usage["prompt_tokens"] != ref.usage["prompt_tokens"] {
		t.Fatalf("%s: usage %v, want %v", what, got.usage, ref.usage)
	}
}

// readRoutedChat reads a stream to its end, calling atFirst after the
// first content chunk.
func readRoutedChat(t *testing.T, resp *http.Response, atFirst func()) *routedChat {
	t.Helper()
	return readRoutedChatAt(t, resp, 1, atFirst)
}

// readRoutedChatAt reads a stream to its end, calling at after content
// chunk k.
func readRoutedChatAt(t *testing.T, resp *http.Response, k int, at func()) *routedChat {
	t.Helper()
	defer resp.Body.Close()
	s := openaiapitest.ReadChat(resp.Body, func(n int) {
		if n == k && at != nil {
			at()
		}
	})
	c := &routedChat{header: resp.Header, ids: s.IDs, roles: s.Roles, usage: s.Usage, done: s.Done, chunks: len(s.Content), errors: s.Errors}
	c.content.WriteString(s.Text())
	for _, l := range s.Other { // the router keeps its token comments to itself
		c.errors = append(c.errors, "not an event: "+l)
	}
	if s.HandOver != nil { // and its engines' continuations
		c.errors = append(c.errors, "a handover reached the client")
	}
	if e := s.Evolve; e != nil {
		c.handedOver, c.engine = e.HandedOver, e.Engine
		c.hostHit, c.transferred, c.computed = e.HostHitTokens, e.TransferredTokens, e.ComputedTokens
		if p := e.Prefill; p != nil {
			c.prefillEngine, c.prefillComputed = p.Engine, p.ComputedTokens
		}
	}
	return c
}

// A decode node switching to prefill hands its running decodes over to a
// peer decode node instead of waiting for them: the switch ends while the
// answer is still streaming, and the client reads one answer, the very
// one it would have read had nothing moved; whether the request was split
// between a prefill and a decode node or served whole on one.
func TestDecodeSwitchHandsStreamsOverUnchanged(t *testing.T) {
	tc := startTestCluster(t, roles.Prefill, roles.Decode, roles.Decode, roles.Decode)
	const n = 6000
	chat := func(topic string, times int) string { return streamedChat(topic, times, n, 11) }
	post := func(body string) *http.Response { return postChat(t, tc, body) }
	// moved sends body and, at its first token, switches its decode node
	// to prefill; it checks that the switch ended before the answer did.
	moved := func(body string) *routedChat {
		resp := post(body)
		from := resp.Header.Get(HeaderDecodeNode)
		switched := make(chan time.Time, 1)
		got := readRoutedChat(t, resp, func() {
			if _, err := tc.o.SetRole(from, "prefill", true, "test"); err != nil {
				t.Error(err)
				return
			}
			go func() {
				wait.Until(t, 10*time.Second, from+" serves as prefill", func() bool {
					st, _ := tc.o.NodeStatus(from)
					return st.Role == "prefill" && st.State == StateServing
				})
				switched <- time.Now()
			}()
		})
		ended := time.Now()
		select {
		case at := <-switched:
			if at.After(ended) {
				t.Fatalf("the switch of %s ended %v after the answer: it waited for the decode", from, at.Sub(ended))
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("the switch of %s did not end", from)
		}
		st, _ := tc.o.NodeStatus(from)
		if h := st.History; len(h) == 0 || h[len(h)-1].HandedOver != 1 {
			t.Fatalf("%s's history: %+v", from, st.History)
		}
		return got
	}
	check := func(what string, got, ref *routedChat) {
		t.Helper()
		if !got.done || len(got.errors) > 0 || got.chunks != n {
			t.Fatalf("%s: %d chunks, done %v, errors %v", what, got.chunks, got.done, got.errors)
		}
		if ref.handedOver != 0 || !ref.done {
			t.Fatalf("%s: the reference answer moved (%d) or failed", what, ref.handedOver)
		}
		sameAnswerMovedOnce(t, what, got, ref, n)
	}

	// A short prompt is served whole on a decode node, a long one split.
	// Each answer is checked against the same request sent again after.
	short, long := chat("a question", 20), chat("a problem to reason about at length", 200)
	whole := moved(short)
	if p, d := whole.header.Get(HeaderPrefillNode), whole.header.Get(HeaderDecodeNode); p != d {
		t.Fatalf("want a request served whole: prefill %s, decode %s", p, d)
	}
	check("whole", whole, readRoutedChat(t, post(short), nil))
	split := moved(long)
	if p, d := split.header.Get(HeaderPrefillNode), split.header.Get(HeaderDecodeNode); p == d {
		t.Fatalf("want a split request: prefill %s, decode %s", p, d)
	}
	check("split", split, readRoutedChat(t, post(long), nil))

	if v := testutil.ToFloat64(tc.o.met.handOvers.WithLabelValues("continued")); v != 2 {
		t.Fatalf("handovers counted: %v", v)
	}
	// Every claim ended: the nodes are idle, and the KV handed over was
	// pulled (no engine holds any).
	wait.Until(t, 10*time.Second, "claims end", func() bool {
		tc.o.c.mu.Lock()
		defer tc.o.c.mu.Unlock()
		for _, nd := range tc.o.c.nodes {
			if nd.inFlight != 0 || nd.hb.Held != 0 {
				return false
			}
		}
		return true
	})
}

// busyDecodeNode waits until one of ids has a request in flight and
// returns it.
func busyDecodeNode(t *testing.T, tc *testCluster, ids ...string) string {
	t.Helper()
	found := ""
	wait.Until(t, 10*time.Second, "a decode node with a request in flight", func() bool {
		for _, id := range ids {
			if st, _ := tc.o.NodeStatus(id); st.InFlight > 0 && st.Role == "decode" {
				found = id
				return true
			}
		}
		return false
	})
	return found
}

// A whole (not streamed) answer moves too: the client gets one answer,
// the one it would have got, with the node that finished it named.
func TestDecodeSwitchHandsAWholeAnswerOver(t *testing.T) {
	tc := startTestCluster(t, roles.Prefill, roles.Decode, roles.Decode)
	body := `{"prompt": "` + strings.Repeat("a long derivation ", 100) + `", "max_tokens": 6000, "ignore_eos": true, "seed": 3}`
	type answer struct {
		status int
		decode string
		out    struct {
			ID      string `json:"id"`
			Choices []struct {
				Text string `json:"text"`
			} `json:"choices"`
			Usage struct {
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
			Evolve struct {
				HandedOver int `json:"handed_over"`
			} `json:"evolve"`
		}
	}
	send := func() *answer {
		resp, err := http.Post(tc.o.RouterURL()+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Error(err)
			return nil
		}
		defer resp.Body.Close()
		a := &answer{status: resp.StatusCode, decode: resp.Header.Get(HeaderDecodeNode)}
		if err := json.NewDecoder(resp.Body).Decode(&a.out); err != nil {
			t.Error(err)
		}
		return a
	}
	ch := make(chan *answer, 1)
	go func() { ch <- send() }()
	from := busyDecodeNode(t, tc, "e1", "e2")
	if _, err := tc.o.SetRole(from, "prefill", true, "test"); err != nil {
		t.Fatal(err)
	}
	got := <-ch
	ref := send()
	if got == nil || ref == nil || got.status != 200 || len(got.out.Choices) != 1 || len(ref.out.Choices) != 1 {
		t.Fatalf("answers: %+v, reference %+v", got, ref)
	}
	if got.out.Evolve.HandedOver != 1 || got.decode == from || got.out.Usage.CompletionTokens != 6000 {
		t.Fatalf("moved from %s: handed over %d times, finished on %s, %d tokens", from, got.out.Evolve.HandedOver, got.decode, got.out.Usage.CompletionTokens)
	}
	if got.out.Choices[0].Text != ref.out.Choices[0].Text {
		t.Fatal("the whole answer changed when its decode moved")
	}
}

// The planner prices a switch's KV copies in wall time, as it learns pass
// costs: the profile's copy times divided by the engines' speedup (tiny:
// a 16 KiB block takes 16.4 us to host and 32.8 us to a peer, modelled).
func TestPlannerPricesCopiesInWallTime(t *testing.T) {
	tc := startTestCluster(t, roles.Prefill, roles.Decode) // engines at 20x
	tc.o.plan.mu.Lock()
	cfg := tc.o.plan.p.Config()
	tc.o.plan.mu.Unlock()
	const block = 16 * 1024
	if math.Abs(cfg.HostSecPerBlock-block/1e9/20) > 1e-12 || math.Abs(cfg.NetSecPerBlock-block/0.5e9/20) > 1e-12 {
		t.Fatalf("host %.3g s, network %.3g s per block", cfg.HostSecPerBlock, cfg.NetSecPerBlock)
	}
}
