package orchestrator

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/evolvellm/evolve/openaiapi"
	"github.com/evolvellm/evolve/protocol"
)

func vllmAttempt(t *testing.T, body string, chat bool, out []uint32) *attempt {
	t.Helper()
	p, rb, perr := openaiapi.ParseBody([]byte(body), chat, 0)
	if perr != nil {
		t.Fatal(perr.Message)
	}
	p.Tokens = []uint32{101, 102, 103} // as vLLM's /tokenize gave them
	return &attempt{attemptRequest: attemptRequest{p: p, body: rb, client: rb},
		attemptAnswer: attemptAnswer{out: out, answerID: "chatcmpl-1", created: 1700000000,
			vllm: &vllmStream{backend: "vllm", base: len(out), cont: true}}}
}

// A continuation is a completions request whose prompt is the prompt's
// ids and the output's, with the client's sampling and stopping, and the
// output's length and minimum less what was written.
func TestVLLMContinuationBody(t *testing.T) {
	a := vllmAttempt(t, `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":50,"min_tokens":10,
		"temperature":0.7,"stop":["\n\n"],"seed":3,"stream":true,"stream_options":{"include_usage":true},"metadata":{"session":"s"}}`, true, []uint32{7, 8, 9, 10})
	b, err := a.vllmContinuation()
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"model": "m", "prompt": []any{101.0, 102.0, 103.0, 7.0, 8.0, 9.0, 10.0}, "max_tokens": 46.0, "min_tokens": 6.0,
		"temperature": 0.7, "stop": []any{"\n\n"}, "seed": 3.0, "stream": true, "return_token_ids": true,
		"stream_options": map[string]any{"include_usage": true}}
	if len(m) != len(want) {
		t.Fatalf("continuation %s, want the members of %v", b, want)
	}
	for k, v := range want {
		t.Run(k, func(t *testing.T) {
			if got, _ := json.Marshal(m[k]); string(got) != mustJSON(v) {
				t.Errorf("%s = %s, want %s", k, got, mustJSON(v))
			}
		})
	}

	// A chat answer without a limit runs on to the context's end.
	a = vllmAttempt(t, `{"messages":[{"role":"user","content":"hi"}],"stream":true}`, true, []uint32{7})
	b, _ = a.vllmContinuation()
	if strings.Contains(string(b), "max_tokens") {
		t.Fatalf("unlimited chat answer continued with a limit: %s", b)
	}

	// A completion keeps the client's request, less echo; its default
	// length is vLLM's 16.
	a = vllmAttempt(t, `{"prompt":"hello","echo":true,"logprobs":2,"stream":true}`, false, []uint32{7, 8})
	b, _ = a.vllmContinuation()
	for _, s := range []string{`"prompt":[101,102,103,7,8]`, `"max_tokens":14`, `"logprobs":2`} {
		if !strings.Contains(string(b), s) {
			t.Errorf("continued completion %s lacks %s", b, s)
		}
	}
	if strings.Contains(string(b), "echo") {
		t.Errorf("continued completion echoes: %s", b)
	}

	// Every token written, only the end missing: nothing to continue.
	a = vllmAttempt(t, `{"prompt":"hello","max_tokens":2,"stream":true}`, false, []uint32{7, 8})
	if _, err := a.vllmContinuation(); err == nil {
		t.Fatal("continued an answer that had all its tokens")
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// The ids the router asked for leave the chunks the client reads; the
// text stays as vLLM wrote it, HTML and all.
func TestWithoutIDs(t *testing.T) {
	in := `{"id":"c","object":"chat.completion.chunk","prompt_token_ids":[1,2,3],"choices":[{"index":0,"delta":{"content":"<think>a & b"},"token_ids":[9]}]}`
	out := string(withoutIDs([]byte(in)))
	if strings.Contains(out, "token_ids") || !strings.Contains(out, `"content":"<think>a & b"`) {
		t.Fatalf("withoutIDs: %s", out)
	}
	plain := `{"id":"c","choices":[{"index":0,"text":"x"}]}`
	if got := string(withoutIDs([]byte(plain))); got != plain {
		t.Fatalf("a chunk without ids changed: %s", got)
	}
}

// A continuation's chunk becomes one of the client's chat answer: its id,
// its creation time, a delta, and usage for the client's prompt and the
// whole output.
func TestContinuedChunk(t *testing.T) {
	a := vllmAttempt(t, `{"messages":[{"role":"user","content":"hi"}],"stream":true}`, true, []uint32{7, 8, 9, 10})
	text := string(a.continuedChunk([]byte(`{"id":"cmpl-9","object":"text_completion","created":5,"model":"m","choices":[{"index":0,"text":" more","logprobs":null,"finish_reason":"stop","stop_reason":"\n\n","token_ids":[11]}]}`)))
	var c struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		Choices []struct {
			Delta        map[string]string `json:"delta"`
			FinishReason string            `json:"finish_reason"`
			StopReason   string            `json:"stop_reason"`
		} `json:"choices"`
	}
	if err := json.Unmarshal([]byte(text), &c); err != nil {
		t.Fatal(err)
	}
	if c.ID != "chatcmpl-1" || c.Object != "chat.completion.chunk" || c.Created != 1700000000 || len(c.Choices) != 1 ||
		c.Choices[0].Delta["content"] != " more" || c.Choices[0].FinishReason != "stop" || c.Choices[0].StopReason != "\n\n" ||
		strings.Contains(text, "token_ids") || strings.Contains(text, `"text"`) {
		t.Fatalf("continued chunk %s", text)
	}
	usage := string(a.continuedChunk([]byte(`{"id":"cmpl-9","object":"text_completion","created":5,"model":"m","choices":[],
		"usage":{"prompt_tokens":7,"completion_tokens":5,"total_tokens":12,"prompt_tokens_details":{"cached_tokens":6}}}`)))
	for _, s := range []string{`"prompt_tokens":3`, `"completion_tokens":9`, `"total_tokens":12`, `"cached_tokens":3`} {
		if !strings.Contains(usage, s) {
			t.Errorf("continued usage %s lacks %s", usage, s)
		}
	}
}

// A chat that offers tools goes on as a chat: its messages and the
// answer's text so far as an assistant message vLLM continues. Once vLLM
// has parsed a tool call or reasoning from the answer, it cannot go on.
func TestVLLMChatContinuation(t *testing.T) {
	a := vllmAttempt(t, `{"model":"m","messages":[{"role":"user","content":"fix it"}],"tools":[{"type":"function","function":{"name":"Read"}}],
		"max_completion_tokens":40,"stream":true}`, true, nil)
	a.vllm = &vllmStream{backend: "vllm", asChat: true}
	for _, chunk := range []string{
		`{"id":"c","choices":[{"index":0,"delta":{"role":"assistant","content":""}}],"prompt_token_ids":[1,2]}`,
		`{"id":"c","choices":[{"index":0,"delta":{"content":"Reading"},"token_ids":[5]}]}`,
		`{"id":"c","choices":[{"index":0,"delta":{"content":" a.go"},"token_ids":[6,7]}]}`,
	} {
		ids, out := a.vllmData([]byte(chunk))
		a.out = append(a.out, ids...)
		if strings.Contains(string(out), "token_ids") {
			t.Fatalf("the client would get the router's ids: %s", out)
		}
	}
	if !a.canResumeVLLM() {
		t.Fatalf("refused: %s", a.vllm.refused)
	}
	b, err := a.vllmContinuation()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{`"messages":[{"role":"user","content":"fix it"},{"content":"Reading a.go","role":"assistant"}]`,
		`"continue_final_message":true`, `"add_generation_prompt":false`, `"max_completion_tokens":37`, `"tools":[`} {
		if !strings.Contains(string(b), s) {
			t.Errorf("chat continuation %s lacks %s", b, s)
		}
	}
	if strings.Contains(string(b), `"prompt"`) || strings.Contains(string(b), `"max_tokens"`) {
		t.Errorf("chat continuation %s has completions members", b)
	}
	for _, delta := range []string{`{"tool_calls":[{"index":0,"function":{"name":"Read"}}]}`, `{"reasoning_content":"hmm"}`, `{"reasoning":"hmm"}`} {
		a.vllm.refused = ""
		a.vllmData([]byte(`{"id":"c","choices":[{"index":0,"delta":` + delta + `}]}`))
		if a.canResumeVLLM() {
			t.Errorf("an answer with %s could go on", delta)
		}
	}
}

// A vLLM too old to name the tokens it streams (before 0.10.2 it ignores
// return_token_ids) leaves the router no output to go on from: its
// answers are not continued, rather than begun again under the text the
// client has read. Its first such stream says so in the log, once per
// node: before, the operator learnt it at the engine's death.
func TestVLLMWithoutTokenIDsIsNotContinued(t *testing.T) {
	logs := &recordLog{}
	o := &Orchestrator{log: slog.New(logs)}
	warned := func() (n int) {
		for _, r := range logs.recs {
			if strings.HasPrefix(fmt.Sprint(r["msg"]), "engine streams without token ids") && r["node"] == "v0" {
				n++
			}
		}
		return n
	}
	for range 2 {
		b := vllmAttempt(t, `{"prompt":"hello","max_tokens":20,"stream":true}`, false, nil)
		b.o, b.decode, b.vllm = o, "v0", &vllmStream{backend: "vllm"}
		b.vllmData([]byte(`{"id":"c","choices":[{"index":0,"text":" hello"}]}`))
		b.vllmData([]byte(`{"id":"c","choices":[{"index":0,"text":" again"}]}`))
	}
	if n := warned(); n != 1 {
		t.Fatalf("%d warnings for node v0's streams without token ids, want 1", n)
	}

	a := vllmAttempt(t, `{"prompt":"hello","max_tokens":20,"stream":true}`, false, nil)
	a.vllm = &vllmStream{backend: "vllm"}
	a.vllmData([]byte(`{"id":"c","choices":[{"index":0,"text":"","token_ids":[]}]}`))
	if !a.canResumeVLLM() {
		t.Fatalf("an empty first chunk refused the answer: %s", a.vllm.refused)
	}
	a.vllmData([]byte(`{"id":"c","choices":[{"index":0,"text":" hello"}]}`))
	if a.canResumeVLLM() {
		t.Fatal("an answer whose tokens are unknown could go on")
	}
}

// A continuation goes to a node that schedules by priority one ahead of
// the client's priority (vLLM runs lower values first), and to any other
// node without one, which vLLM would refuse there.
func TestVLLMContinuationPriority(t *testing.T) {
	for _, tc := range []struct {
		body string
		want string
	}{
		{`{"prompt":"hi","max_tokens":9,"stream":true}`, `-1`},
		{`{"prompt":"hi","max_tokens":9,"stream":true,"priority":3}`, `2`},
	} {
		t.Run(tc.body, func(t *testing.T) {
			a := vllmAttempt(t, tc.body, false, []uint32{7})
			a.o = &Orchestrator{c: newCluster(0)}
			a.o.c.nodes["by-priority"] = &node{reg: protocol.Registration{ID: "by-priority", PriorityScheduling: true}}
			a.o.c.nodes["fcfs"] = &node{reg: protocol.Registration{ID: "fcfs"}}
			body, err := a.vllmContinuation()
			if err != nil {
				t.Fatal(err)
			}
			if got := a.prioritised("fcfs", body); string(got) != string(body) {
				t.Errorf("%s: to an FCFS node %s, want %s", tc.body, got, body)
			}
			got, err := openaiapi.ParseObject(a.prioritised("by-priority", body))
			if err != nil || string(got.Members["priority"]) != tc.want || string(got.Members["prompt"]) != "[101,102,103,7]" {
				t.Errorf("%s: to a node scheduling by priority %v (%v), want priority %s", tc.body, got.Members, err, tc.want)
			}
		})
	}
}
