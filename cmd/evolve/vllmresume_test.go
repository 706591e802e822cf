package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/evolvellm/evolve/engine/vllm/vllmtest"
	"github.com/evolvellm/evolve/internal/wait"
)

// sseAnswer is a streamed answer as a client reads it.
type sseAnswer struct {
	node   string // X-Evolve-Decode-Node
	ids    map[string]bool
	text   string
	usage  map[string]any
	errors []string // error events
	chunks int
	raw    []string // data lines
	done   bool     // [DONE] came
}

// streamThroughRouter posts a streaming body and reads its events; after
// the first `after` chunks with text, it calls mid once (with the node
// serving the answer) and reads on to the end.
func streamThroughRouter(t *testing.T, url string, body map[string]any, after int, mid func(node string)) sseAnswer {
	t.Helper()
	b, _ := json.Marshal(body)
	resp, err := http.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		msg, _ := bufio.NewReader(resp.Body).ReadString(0)
		t.Fatalf("status %d: %s", resp.StatusCode, msg)
	}
	a := sseAnswer{node: resp.Header.Get("X-Evolve-Decode-Node"), ids: map[string]bool{}}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			a.done = true
			continue
		}
		a.raw = append(a.raw, data)
		var c struct {
			ID      string `json:"id"`
			Choices []struct {
				Text  string `json:"text"`
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
			Usage map[string]any `json:"usage"`
			Error map[string]any `json:"error"`
		}
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			t.Fatalf("chunk %q: %v", data, err)
		}
		if c.Error != nil {
			a.errors = append(a.errors, fmt.Sprint(c.Error["message"]))
			continue
		}
		a.ids[c.ID] = true
		if c.Usage != nil {
			a.usage = c.Usage
		}
		for _, ch := range c.Choices {
			if s := ch.Text + ch.Delta.Content; s != "" {
				a.text += s
				a.chunks++
				if a.chunks == after && mid != nil {
					mid(a.node)
				}
			}
		}
	}
	return a
}

// startPacedVLLMs starts a stand-in vLLM server writing a token every
// 15 ms behind an evolve engine agent for each id, in the role role(id)
// gives, and waits until all serve.
func startPacedVLLMs(t *testing.T, orch readyInfo, role func(id string) string, ids ...string) map[string]*vllmtest.Server {
	servers := map[string]*vllmtest.Server{}
	for _, id := range ids {
		srv, err := vllmtest.Start(t.Context(), vllmtest.Options{TokenDelay: 15 * time.Millisecond}, "", "", "")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.Close)
		servers[id] = srv
		startEngine(t, "--backend", "vllm", "--vllm-url", srv.URL, "--kv-events", srv.Events, "--kv-replay", srv.Replay,
			"--id", id, "--role", role(id), "--gpus", "4", "--nats", orch.NATSURL)
	}
	wait.Until(t, 30*time.Second, "the vLLM engines serving", func() bool { return servingNodes(t, orch.ControlURL) == len(ids) })
	return servers
}

// A vLLM engine that dies mid-stream loses the client nothing: the router
// asked vLLM for the streamed token ids, and another vLLM engine writes
// the rest of the answer from the prompt's ids and the output's (a chat
// that offers tools, from its messages and the answer so far, so that
// vLLM's tool parser sees the rest). The client reads one answer, the
// same text an engine that did not fail writes (the stand-in's output
// depends only on its context, as a greedy model's does), with one id and
// usage for the whole answer, and none of the ids the router asked for.
// Structured output cannot go on (its grammar would start over): that
// stream ends with an error event.
func TestVLLMStreamSurvivesItsEngine(t *testing.T) {
	orch := startOrchestrator(t)
	servers := startPacedVLLMs(t, orch, func(string) string { return "both" }, "vllm-a", "vllm-b", "vllm-c", "vllm-d")
	kill := func(node string) {
		srv := servers[node]
		if srv == nil {
			t.Errorf("the answer came from %q, no server of this test", node)
			return
		}
		srv.Kill()
	}
	resumed := func() float64 {
		return metric(t, orch.RouterURL, `evolve_router_resumed_answers_total{cause="engine_failed",outcome="continued"}`)
	}
	// How the continuations went: completions of token ids, and chats
	// that continue an assistant message.
	continuations := func() (ids, chats int) {
		for _, srv := range servers {
			st := srv.Stats()
			ids, chats = ids+st.IDPrompts, chats+st.Continued
		}
		return ids, chats
	}

	prompt := strings.Repeat("The scheduler keeps a queue of sequences per engine. ", 40)
	completion := map[string]any{"model": "fake/model", "prompt": prompt, "max_tokens": 80, "stream": true,
		"stream_options": map[string]any{"include_usage": true}}
	want := streamThroughRouter(t, orch.RouterURL+"/v1/completions", completion, 0, nil)
	if len(want.errors) > 0 || !want.done || want.chunks != 80 {
		t.Fatalf("uninterrupted answer: %d chunks, errors %v, done %v", want.chunks, want.errors, want.done)
	}
	for _, d := range want.raw {
		if strings.Contains(d, "token_ids") {
			t.Fatalf("the client got the token ids the router asked for: %s", d)
		}
	}

	got := streamThroughRouter(t, orch.RouterURL+"/v1/completions", completion, 25, kill)
	if len(got.errors) > 0 || !got.done {
		t.Fatalf("interrupted completion: errors %v, done %v", got.errors, got.done)
	}
	if got.text != want.text || len(got.ids) != 1 {
		t.Fatalf("interrupted completion: %d ids, text\n%q\nwant\n%q", len(got.ids), got.text, want.text)
	}
	if num(got.usage["completion_tokens"]) != 80 || num(got.usage["prompt_tokens"]) != num(want.usage["prompt_tokens"]) {
		t.Fatalf("interrupted completion's usage %v, want 80 completion tokens and %v prompt tokens", got.usage, want.usage["prompt_tokens"])
	}
	for _, d := range got.raw {
		if strings.Contains(d, "token_ids") || !strings.Contains(d, `"text_completion"`) {
			t.Fatalf("a completion chunk the client should not get: %s", d)
		}
	}
	if n := resumed(); n != 1 {
		t.Fatalf("%v answers resumed, want 1", n)
	}

	chat := map[string]any{"model": "fake/model", "max_tokens": 60, "stream": true,
		"messages": []map[string]any{{"role": "system", "content": prompt}, {"role": "user", "content": "What does it do?"}}}
	wantChat := streamThroughRouter(t, orch.RouterURL+"/v1/chat/completions", chat, 0, nil)
	gotChat := streamThroughRouter(t, orch.RouterURL+"/v1/chat/completions", chat, 20, kill)
	if len(gotChat.errors) > 0 || !gotChat.done || gotChat.text != wantChat.text || len(gotChat.ids) != 1 || wantChat.chunks != 60 {
		t.Fatalf("interrupted chat: errors %v, done %v, %d ids, text\n%q\nwant (%d chunks)\n%q", gotChat.errors, gotChat.done,
			len(gotChat.ids), gotChat.text, wantChat.chunks, wantChat.text)
	}
	for _, d := range gotChat.raw {
		if !strings.Contains(d, `"chat.completion.chunk"`) || strings.Contains(d, `"text":`) {
			t.Fatalf("a chat chunk in another shape: %s", d)
		}
	}
	if n := resumed(); n != 2 {
		t.Fatalf("%v answers resumed, want 2", n)
	}
	if ids, chats := continuations(); ids != 2 || chats != 0 {
		t.Fatalf("%d continuations from token ids, %d as chats; want 2 and 0", ids, chats)
	}

	// Tools: the rest could hold a call, which vLLM's parser must see.
	chat["tools"] = []map[string]any{{"type": "function", "function": map[string]any{"name": "read_file",
		"parameters": map[string]any{"type": "object", "properties": map[string]any{"path": map[string]any{"type": "string"}}}}}}
	chat["stream_options"] = map[string]any{"include_usage": true}
	wantTools := streamThroughRouter(t, orch.RouterURL+"/v1/chat/completions", chat, 0, nil)
	tools := streamThroughRouter(t, orch.RouterURL+"/v1/chat/completions", chat, 20, kill)
	if len(tools.errors) > 0 || !tools.done || tools.text != wantTools.text || wantTools.text == wantChat.text || len(tools.ids) != 1 {
		t.Fatalf("interrupted chat with tools: errors %v, done %v, %d ids, text\n%q\nwant\n%q", tools.errors, tools.done,
			len(tools.ids), tools.text, wantTools.text)
	}
	if num(tools.usage["completion_tokens"]) != 60 || num(tools.usage["prompt_tokens"]) != num(wantTools.usage["prompt_tokens"]) {
		t.Fatalf("interrupted chat with tools: usage %v, want 60 completion tokens and %v prompt tokens", tools.usage, wantTools.usage["prompt_tokens"])
	}
	for _, d := range tools.raw {
		if strings.Contains(d, "token_ids") {
			t.Fatalf("a continued chat chunk with the router's token ids: %s", d)
		}
	}
	if n := resumed(); n != 3 {
		t.Fatalf("%v answers resumed, want 3", n)
	}
	if ids, chats := continuations(); ids != 2 || chats != 1 {
		t.Fatalf("%d continuations from token ids, %d as chats; want 2 and 1", ids, chats)
	}

	// Structured output: a continuation's grammar would start over.
	delete(chat, "tools")
	chat["response_format"] = map[string]any{"type": "json_object"}
	structured := streamThroughRouter(t, orch.RouterURL+"/v1/chat/completions", chat, 20, kill)
	if len(structured.errors) != 1 || !strings.Contains(structured.errors[0], "failed and no other could go on") || structured.chunks >= 60 {
		t.Fatalf("interrupted structured output: %d chunks, errors %v; want the stream to end with one error", structured.chunks, structured.errors)
	}
	if n := resumed(); n != 3 {
		t.Fatalf("%v answers resumed after structured output, want still 3", n)
	}
}

// In a split vLLM cluster, the answer of a decode engine that dies goes
// on on another decode engine, and since that one holds none of the
// prompt, a prefill engine computes the KV of the prompt and the output
// so far for it to pull, as a split request's legs do: the recompute
// stalls none of the streams the decode engine is writing. The client
// reads the answer an engine that did not fail writes.
func TestVLLMStreamSurvivesItsDecodeEngineInASplitCluster(t *testing.T) {
	orch := startOrchestrator(t)
	servers := startPacedVLLMs(t, orch, func(id string) string { return strings.Split(id, "-")[0] }, "prefill-a", "prefill-b", "decode-a", "decode-b")
	sum := func(f func(vllmtest.Stats) int, ids ...string) int {
		n := 0
		for _, id := range ids {
			n += f(servers[id].Stats())
		}
		return n
	}
	prefillLegs := func(st vllmtest.Stats) int { return st.PrefillLegs }
	decodeLegs := func(st vllmtest.Stats) int { return st.DecodeLegs }

	// The answer an engine writes for this prompt, asked of a prefill
	// engine directly (the stand-in's output depends only on its
	// context): no decode engine holds the prompt.
	prompt := strings.Repeat("The scheduler keeps a queue of sequences per engine. ", 80)
	completion := map[string]any{"model": "fake/model", "prompt": prompt, "max_tokens": 80, "stream": true,
		"stream_options": map[string]any{"include_usage": true}}
	want := streamThroughRouter(t, servers["prefill-a"].URL+"/v1/completions", completion, 0, nil)
	if len(want.errors) > 0 || !want.done || want.chunks != 80 {
		t.Fatalf("the answer asked of an engine: %d chunks, errors %v, done %v", want.chunks, want.errors, want.done)
	}

	var killed string
	got := streamThroughRouter(t, orch.RouterURL+"/v1/completions", completion, 25, func(node string) {
		killed = node
		servers[node].Kill()
	})
	if !strings.HasPrefix(killed, "decode-") {
		t.Fatalf("the answer streamed from %q, want a decode engine", killed)
	}
	if len(got.errors) > 0 || !got.done || got.text != want.text || len(got.ids) != 1 {
		t.Fatalf("interrupted completion: errors %v, done %v, %d ids, text\n%q\nwant\n%q", got.errors, got.done, len(got.ids), got.text, want.text)
	}
	if num(got.usage["completion_tokens"]) != 80 || num(got.usage["prompt_tokens"]) != num(want.usage["prompt_tokens"]) {
		t.Fatalf("interrupted completion's usage %v, want 80 completion tokens and %v prompt tokens", got.usage, want.usage["prompt_tokens"])
	}
	other := map[string]string{"decode-a": "decode-b", "decode-b": "decode-a"}[killed]
	// Two prefill legs: the request's and the continuation's, whose KV
	// the other decode engine pulled.
	if p, d := sum(prefillLegs, "prefill-a", "prefill-b"), decodeLegs(servers[other].Stats()); p != 2 || d != 1 || servers[other].Stats().IDPrompts != 1 {
		t.Fatalf("%d prefill legs, %d decode legs on %s (%d of token ids); want 2 and 1, of token ids", p, d, other, servers[other].Stats().IDPrompts)
	}
	if n := metric(t, orch.RouterURL, "evolve_router_resume_prefilled_total"); n != 1 {
		t.Fatalf("evolve_router_resume_prefilled_total %v, want 1", n)
	}
	if n := metric(t, orch.RouterURL, `evolve_router_resumed_answers_total{cause="engine_failed",outcome="continued"}`); n != 1 {
		t.Fatalf("%v answers resumed, want 1", n)
	}
}

// vLLM engines that schedule by priority (--scheduling-policy priority,
// which the engine agent is told with --vllm-priority-scheduling) get an
// answer continued after its engine died ahead of the client's priority:
// the client is mid-read, and the continuation should not wait behind
// requests that came after the answer began. The first request, with no
// priority, reaches its engine without one.
func TestVLLMContinuationGoesAheadOnPriorityScheduling(t *testing.T) {
	orch := startOrchestrator(t)
	servers := map[string]*vllmtest.Server{}
	for _, id := range []string{"vllm-a", "vllm-b"} {
		srv, err := vllmtest.Start(t.Context(), vllmtest.Options{TokenDelay: 15 * time.Millisecond, PriorityScheduling: true}, "", "", "")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.Close)
		servers[id] = srv
		startEngine(t, "--backend", "vllm", "--vllm-url", srv.URL, "--kv-events", srv.Events, "--kv-replay", srv.Replay,
			"--id", id, "--gpus", "4", "--nats", orch.NATSURL, "--vllm-priority-scheduling")
	}
	wait.Until(t, 30*time.Second, "the vLLM engines serving", func() bool { return servingNodes(t, orch.ControlURL) == 2 })
	completion := map[string]any{"model": "fake/model", "prompt": strings.Repeat("The scheduler keeps a queue. ", 40),
		"max_tokens": 60, "stream": true}
	want := streamThroughRouter(t, orch.RouterURL+"/v1/completions", completion, 0, nil)
	var died string
	got := streamThroughRouter(t, orch.RouterURL+"/v1/completions", completion, 20, func(node string) {
		died = node
		servers[node].Kill()
	})
	if len(got.errors) > 0 || !got.done || got.text != want.text {
		t.Fatalf("interrupted completion: errors %v, done %v, text\n%q\nwant\n%q", got.errors, got.done, got.text, want.text)
	}
	for id, srv := range servers {
		t.Run(id, func(t *testing.T) {
			if st := srv.Stats(); id != died && (st.Prioritised != 1 || st.IDPrompts != 1) {
				t.Fatalf("%s, which went on with the answer: %d requests ahead of the default priority, %d continuations; want 1 and 1",
					id, st.Prioritised, st.IDPrompts)
			}
		})
	}
}
