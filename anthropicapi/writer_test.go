package anthropicapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/evolvellm/evolve/openaiapi"
)

// chatServer answers Messages requests the way evolve's router does: it
// translates each into a chat request, and a chat handler (here one that
// writes the answer it is given, as an engine's arrives) writes into a
// Writer. The official SDK reads what comes out.
func chatServer(t *testing.T, answer func(w http.ResponseWriter, chat map[string]any)) *anthropic.Client {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/messages" {
			http.NotFound(w, r)
			return
		}
		body, _ := io.ReadAll(r.Body)
		chatBody, info, err := ToChat(body)
		if err != nil {
			err.Write(w)
			return
		}
		var chat map[string]any
		json.Unmarshal(chatBody, &chat)
		tw := NewWriter(w, info, UsageHeaders{Prompt: "X-Prompt-Tokens", Cached: "X-Cached-Tokens"})
		answer(tw, chat)
		tw.Finish()
	}))
	t.Cleanup(srv.Close)
	c := anthropic.NewClient(option.WithBaseURL(srv.URL), option.WithAPIKey("test"), option.WithMaxRetries(0))
	return &c
}

// sse writes chat stream chunks as an engine's stream arrives: a chunk an
// event, flushed, then [DONE].
func sse(w http.ResponseWriter, promptTokens int, chunks ...string) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("X-Prompt-Tokens", fmt.Sprint(promptTokens))
	w.Header().Set("X-Request-Id", "req-1")
	w.WriteHeader(200)
	for _, c := range chunks {
		fmt.Fprintf(w, "data: %s\n\n", c)
		w.(http.Flusher).Flush()
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
}

func userParams(text string) anthropic.MessageNewParams {
	return anthropic.MessageNewParams{Model: "glm-5", MaxTokens: 64,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(text))}}
}

func TestWholeAnswerBecomesAMessage(t *testing.T) {
	c := chatServer(t, func(w http.ResponseWriter, chat map[string]any) {
		if chat["stream"] != nil {
			t.Errorf("not asked to stream: %v", chat)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(200)
		fmt.Fprint(w, `{"id":"chatcmpl-9","object":"chat.completion","model":"glm-5","choices":[{"index":0,
			"message":{"role":"assistant","reasoning_content":"The file first.","content":"Reading main.go.",
			"tool_calls":[{"id":"call_1","type":"function","function":{"name":"Read","arguments":"{\"path\":\"main.go\"}"}}]},
			"finish_reason":"tool_calls"}],
			"usage":{"prompt_tokens":1000,"completion_tokens":12,"total_tokens":1012,"prompt_tokens_details":{"cached_tokens":960}}}`)
	})
	m, err := c.Messages.New(context.Background(), userParams("fix main.go"))
	if err != nil {
		t.Fatal(err)
	}
	if m.ID != "msg_9" || m.Role != "assistant" || m.Model != "glm-5" || m.StopReason != anthropic.StopReasonToolUse {
		t.Errorf("message %+v", m)
	}
	if len(m.Content) != 3 || m.Content[0].Type != "thinking" || m.Content[0].Thinking != "The file first." ||
		m.Content[1].Type != "text" || m.Content[1].Text != "Reading main.go." || m.Content[2].Type != "tool_use" ||
		m.Content[2].ID != "call_1" || m.Content[2].Name != "Read" || string(m.Content[2].Input) != `{"path":"main.go"}` {
		t.Errorf("content %+v", m.Content)
	}
	if u := m.Usage; u.InputTokens != 40 || u.CacheReadInputTokens != 960 || u.OutputTokens != 12 {
		t.Errorf("usage %+v: cached tokens are cache reads, the rest input", u)
	}
}

func TestStopReasons(t *testing.T) {
	for _, c := range []struct {
		finish, matched string
		want            anthropic.StopReason
		seq             string
	}{
		{"length", "null", anthropic.StopReasonMaxTokens, ""},
		{"stop", "null", anthropic.StopReasonEndTurn, ""},
		{"stop", `"</done>"`, anthropic.StopReasonStopSequence, "</done>"},
		{"stop", `"other"`, anthropic.StopReasonEndTurn, ""}, // not one the client asked for
		{"stop", "7", anthropic.StopReasonEndTurn, ""},       // a stop token id
	} {
		t.Run(c.finish, func(t *testing.T) {
			cl := chatServer(t, func(w http.ResponseWriter, chat map[string]any) {
				w.Header().Set("Content-Type", "application/json")
				fmt.Fprintf(w, `{"id":"c","choices":[{"message":{"content":"x"},"finish_reason":%q,"stop_reason":%s}],"usage":{"prompt_tokens":3,"completion_tokens":1}}`, c.finish, c.matched)
			})
			p := userParams("go")
			p.StopSequences = []string{"</done>"}
			m, err := cl.Messages.New(context.Background(), p)
			if err != nil {
				t.Fatal(err)
			}
			if m.StopReason != c.want || m.StopSequence != c.seq {
				t.Errorf("%s/%s: stop %q %q, want %q %q", c.finish, c.matched, m.StopReason, m.StopSequence, c.want, c.seq)
			}
		})
	}
}

func TestStreamBecomesMessageEvents(t *testing.T) {
	c := chatServer(t, func(w http.ResponseWriter, chat map[string]any) {
		if chat["stream"] != true || chat["stream_options"] == nil {
			t.Errorf("a stream asks for its usage: %v", chat)
		}
		w.Header().Set("X-Cached-Tokens", "900")
		sse(w, 1000,
			`{"id":"chatcmpl-5","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`,
			`{"id":"chatcmpl-5","choices":[{"index":0,"delta":{"reasoning_content":"Think."},"finish_reason":null}]}`,
			`{"id":"chatcmpl-5","choices":[{"index":0,"delta":{"content":"Let me "},"finish_reason":null}]}`,
			`{"id":"chatcmpl-5","choices":[{"index":0,"delta":{"content":"look."},"finish_reason":null}]}`,
			`{"id":"chatcmpl-5","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"Read","arguments":""}}]},"finish_reason":null}]}`,
			`{"id":"chatcmpl-5","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"path\":"}}]},"finish_reason":null}]}`,
			`{"id":"chatcmpl-5","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"a.go\"}"}}]},"finish_reason":null}]}`,
			`{"id":"chatcmpl-5","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_b","type":"function","function":{"name":"Read","arguments":"{\"path\":\"b.go\"}"}}]},"finish_reason":null}]}`,
			`{"id":"chatcmpl-5","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`,
			`{"id":"chatcmpl-5","choices":[],"usage":{"prompt_tokens":1000,"completion_tokens":20,"prompt_tokens_details":{"cached_tokens":900}}}`)
	})
	stream := c.Messages.NewStreaming(context.Background(), userParams("fix a.go and b.go"))
	var m anthropic.Message
	var types []string
	for stream.Next() {
		ev := stream.Current()
		types = append(types, ev.Type)
		if u := ev.Message.Usage; ev.Type == "message_start" && (u.InputTokens != 100 || u.CacheReadInputTokens != 900) {
			t.Errorf("message_start's usage %+v: the prompt's length and its cached tokens from the headers", u)
		}
		if err := m.Accumulate(ev); err != nil {
			t.Fatal(err)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	want := "message_start content_block_start content_block_delta content_block_delta content_block_stop " + // thinking and its signature
		"content_block_start content_block_delta content_block_delta content_block_stop " + // text
		"content_block_start content_block_delta content_block_delta content_block_stop " + // call_a
		"content_block_start content_block_delta content_block_stop message_delta message_stop" // call_b
	if got := strings.Join(types, " "); got != want {
		t.Errorf("events\n%s\nwant\n%s", got, want)
	}
	if m.ID != "msg_5" || m.StopReason != anthropic.StopReasonToolUse || len(m.Content) != 4 {
		t.Fatalf("message %+v", m)
	}
	if m.Content[0].Thinking != "Think." || m.Content[1].Text != "Let me look." ||
		m.Content[2].ID != "call_a" || string(m.Content[2].Input) != `{"path":"a.go"}` ||
		m.Content[3].ID != "call_b" || string(m.Content[3].Input) != `{"path":"b.go"}` {
		t.Errorf("content %+v", m.Content)
	}
	if u := m.Usage; u.InputTokens != 100 || u.CacheReadInputTokens != 900 || u.OutputTokens != 20 {
		t.Errorf("usage %+v", u)
	}
}

func TestErrorsInAnthropicsShape(t *testing.T) {
	c := chatServer(t, func(w http.ResponseWriter, chat map[string]any) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(404)
		fmt.Fprint(w, `{"error":{"message":"The model `+"`claude-x`"+` does not exist. This cluster serves `+"`glm-5`"+`.","type":"invalid_request_error","code":"model_not_found"}}`)
	})
	_, err := c.Messages.New(context.Background(), userParams("hi"))
	var ae *anthropic.Error
	if !errors.As(err, &ae) || ae.StatusCode != 404 || !strings.Contains(ae.RawJSON(), `"not_found_error"`) ||
		!strings.Contains(ae.RawJSON(), "This cluster serves") {
		t.Fatalf("got %v", err)
	}
	// A request the translation refuses is refused before any engine.
	p := userParams("hi")
	p.MaxTokens = 0
	_, err = c.Messages.New(context.Background(), p)
	if !errors.As(err, &ae) || ae.StatusCode != 400 || !strings.Contains(ae.RawJSON(), "invalid_request_error") {
		t.Fatalf("max_tokens 0: %v", err)
	}
}

func TestStreamErrorEndsWithAnErrorEvent(t *testing.T) {
	c := chatServer(t, func(w http.ResponseWriter, chat map[string]any) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		fmt.Fprint(w, `data: {"id":"c","choices":[{"index":0,"delta":{"content":"par"}}]}`+"\n\n")
		// as evolve's router ends a stream no engine could go on with
		fmt.Fprint(w, `data: {"error":{"message":"no node could continue the answer","type":"service_unavailable"}}`+"\n\ndata: [DONE]\n\n")
	})
	stream := c.Messages.NewStreaming(context.Background(), userParams("hi"))
	var text strings.Builder
	for stream.Next() {
		if ev := stream.Current(); ev.Type == "content_block_delta" {
			text.WriteString(ev.Delta.Text)
		}
	}
	err := stream.Err()
	if err == nil || !strings.Contains(err.Error(), "no node could continue the answer") || !strings.Contains(err.Error(), "overloaded_error") {
		t.Fatalf("stream error %v", err)
	}
	if text.String() != "par" {
		t.Errorf("what was read before the error: %q", text.String())
	}
}

func TestWriterKeepsHeadersAndSplitLines(t *testing.T) {
	rec := httptest.NewRecorder()
	tw := NewWriter(rec, Info{Model: "m", Stream: true}, UsageHeaders{})
	tw.Header().Set("Content-Type", "text/event-stream")
	tw.Header().Set("X-Request-Id", "r1")
	tw.WriteHeader(200)
	// A chunk cut across writes is read whole.
	io.WriteString(tw, `data: {"id":"c","choices":[{"index":0,"delta":{"content":"he`)
	io.WriteString(tw, `llo"}}]}`+"\n\n: a comment\n\ndata: [DONE]\n\n")
	tw.Finish()
	if rec.Header().Get("X-Request-Id") != "r1" || rec.Header().Get("Content-Type") != "text/event-stream" {
		t.Errorf("headers %v", rec.Header())
	}
	body := rec.Body.String()
	for _, want := range []string{`"text":"hello"`, "event: message_stop", `"stop_reason":"end_turn"`} {
		if !strings.Contains(body, want) {
			t.Errorf("missing %s in\n%s", want, body)
		}
	}
	if strings.Contains(body, "comment") {
		t.Errorf("the chat stream's comments pass on:\n%s", body)
	}
}

// A refusal for the context's length comes in Anthropic's words, with
// the numbers, which Claude Code reads with these expressions (from its
// 2.1 source): it retries with fewer max_tokens on the first, and
// compacts its conversation on the second.
func TestContextOverflowInAnthropicsWords(t *testing.T) {
	lower := regexp.MustCompile("input length and `max_tokens` exceed context limit: (\\d+) \\+ (\\d+) > (\\d+)")
	compact := regexp.MustCompile(`(?i)prompt is too long[^0-9]*(\d+)\s*tokens?\s*>\s*(\d+)`)
	for _, c := range []struct {
		refusal *openaiapi.Error
		re      *regexp.Regexp
		want    []string
	}{
		{openaiapi.OutputTooLong(262144, 228097, 64000), lower, []string{"228097", "64000", "262144"}},
		{openaiapi.ContextTooLong(262144, 270001), compact, []string{"270001", "262144"}},
	} {
		cl := chatServer(t, func(w http.ResponseWriter, chat map[string]any) { c.refusal.Write(w) })
		_, err := cl.Messages.New(context.Background(), userParams("hi"))
		var ae *anthropic.Error
		if !errors.As(err, &ae) || ae.StatusCode != 400 {
			t.Fatalf("%s: got %v", c.refusal.Message, err)
		}
		var body struct {
			Error struct{ Type, Message string }
		}
		json.Unmarshal([]byte(ae.RawJSON()), &body)
		m := c.re.FindStringSubmatch(body.Error.Message)
		if body.Error.Type != "invalid_request_error" || m == nil || !slices.Equal(m[1:], c.want) {
			t.Errorf("%s: answered %+v, which Claude Code reads as %q", c.refusal.Message, body.Error, m)
		}
	}
}

// An error's message reads as written: "N > L", not "N \u003e L".
func TestErrorsAreNotHTMLEscaped(t *testing.T) {
	if b := string(fromChatError(400, []byte(openaiapi.ContextTooLong(100, 120).Body().Error.Message)).Body()); !strings.Contains(b, "120 tokens > 100 maximum") {
		t.Fatalf("%s", b)
	}
}
