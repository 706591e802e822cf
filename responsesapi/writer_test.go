package responsesapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/evolvellm/evolve/openaiapi"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
)

// chatServer answers Responses requests the way evolve's router does: it
// translates each into a chat request, and a chat handler (here one that
// writes the answer it is given, as an engine's arrives) writes into a
// Writer. The official SDK reads what comes out.
func chatServer(t *testing.T, answer func(w http.ResponseWriter, chat map[string]any)) openai.Client {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		chatBody, info, err := ToChat(body)
		if err != nil {
			err.Write(w)
			return
		}
		var chat map[string]any
		json.Unmarshal(chatBody, &chat)
		tw := NewWriter(w, info)
		answer(tw, chat)
		tw.Finish()
	}))
	t.Cleanup(srv.Close)
	return openai.NewClient(option.WithBaseURL(srv.URL+"/v1"), option.WithAPIKey("test"), option.WithMaxRetries(0))
}

func sse(w http.ResponseWriter, chunks ...string) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(200)
	for _, c := range chunks {
		fmt.Fprintf(w, "data: %s\n\n", c)
		w.(http.Flusher).Flush()
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
}

func params(input string, tools ...responses.ToolUnionParam) responses.ResponseNewParams {
	return responses.ResponseNewParams{Model: "glm-5", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(input)}, Tools: tools}
}

const usage = `"usage":{"prompt_tokens":1000,"completion_tokens":20,"prompt_tokens_details":{"cached_tokens":900},"completion_tokens_details":{"reasoning_tokens":5}}`

func TestWholeAnswerBecomesAResponse(t *testing.T) {
	c := chatServer(t, func(w http.ResponseWriter, chat map[string]any) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"chatcmpl-7","created":1700000000,"model":"glm-5","choices":[{"index":0,"message":{"role":"assistant",
			"reasoning_content":"Think.","content":"Here.","tool_calls":[{"id":"call_a","type":"function","function":{"name":"multi_agent_v1__spawn_agent","arguments":"{\"message\":\"go\"}"}}]},
			"finish_reason":"tool_calls"}],`+usage+`}`)
	})
	ns := []any{map[string]any{"type": "namespace", "name": "multi_agent_v1", "description": "sub-agents",
		"tools": []any{map[string]any{"type": "function", "name": "spawn_agent", "parameters": map[string]any{"type": "object"}}}}}
	r, err := c.Responses.New(context.Background(), params("hi"), option.WithJSONSet("tools", ns))
	if err != nil {
		t.Fatal(err)
	}
	if r.ID != "resp_7" || r.Status != "completed" || r.OutputText() != "Here." || len(r.Output) != 3 {
		t.Fatalf("response %s", r.RawJSON())
	}
	if r.Output[0].Type != "reasoning" || !strings.Contains(r.Output[0].RawJSON(), `"reasoning_text","text":"Think."`) {
		t.Errorf("reasoning item %s", r.Output[0].RawJSON())
	}
	var call struct{ Type, Name, Namespace, Arguments, CallID string }
	json.Unmarshal([]byte(r.Output[2].RawJSON()), &call)
	call.CallID = r.Output[2].CallID
	if call.Type != "function_call" || call.Name != "spawn_agent" || call.Namespace != "multi_agent_v1" || call.CallID != "call_a" ||
		call.Arguments != `{"message":"go"}` {
		t.Errorf("call item %s", r.Output[2].RawJSON())
	}
	u := r.Usage
	if u.InputTokens != 1000 || u.InputTokensDetails.CachedTokens != 900 || u.OutputTokens != 20 ||
		u.OutputTokensDetails.ReasoningTokens != 5 || u.TotalTokens != 1020 {
		t.Errorf("usage %+v", u)
	}
	if !strings.Contains(r.RawJSON(), `"store":false`) || r.Model != "glm-5" {
		t.Errorf("store and model in %s", r.RawJSON())
	}
}

// An answer cut by its max tokens is incomplete, and says why.
func TestLengthMakesAnIncompleteResponse(t *testing.T) {
	c := chatServer(t, func(w http.ResponseWriter, chat map[string]any) {
		if chat["max_tokens"] != 5.0 {
			t.Errorf("max_output_tokens became %v", chat["max_tokens"])
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"chatcmpl-8","choices":[{"index":0,"message":{"content":"a b c d e"},"finish_reason":"length"}]}`)
	})
	p := params("count")
	p.MaxOutputTokens = openai.Int(5)
	r, err := c.Responses.New(context.Background(), p)
	if err != nil || r.Status != "incomplete" || r.IncompleteDetails.Reason != "max_output_tokens" {
		t.Fatalf("%v %s", err, r.RawJSON())
	}
}

// A stream comes as the Responses API's events, in its order, each with
// its sequence number; a custom tool's call comes back as one, with its
// input whole.
func TestStreamBecomesResponseEvents(t *testing.T) {
	c := chatServer(t, func(w http.ResponseWriter, chat map[string]any) {
		sse(w,
			`{"id":"chatcmpl-5","created":1700000000,"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`,
			`{"id":"chatcmpl-5","choices":[{"index":0,"delta":{"reasoning_content":"Think."},"finish_reason":null}]}`,
			`{"id":"chatcmpl-5","choices":[{"index":0,"delta":{"content":"Let me "},"finish_reason":null}]}`,
			`{"id":"chatcmpl-5","choices":[{"index":0,"delta":{"content":"look."},"finish_reason":null}]}`,
			`{"id":"chatcmpl-5","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"exec_command","arguments":""}}]},"finish_reason":null}]}`,
			`{"id":"chatcmpl-5","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"cmd\":"}}]},"finish_reason":null}]}`,
			`{"id":"chatcmpl-5","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"ls\"}"}}]},"finish_reason":null}]}`,
			`{"id":"chatcmpl-5","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_b","type":"function","function":{"name":"apply_patch","arguments":"{\"input\":\"*** Begin Patch\\n\"}"}}]},"finish_reason":null}]}`,
			`{"id":"chatcmpl-5","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`,
			`{"id":"chatcmpl-5","choices":[],`+usage+`}`)
	})
	custom := responses.ToolUnionParam{OfCustom: &responses.CustomToolParam{Name: "apply_patch"}}
	fn := responses.ToolParamOfFunction("exec_command", map[string]any{"type": "object"}, false)
	stream := c.Responses.NewStreaming(context.Background(), params("list the files", fn, custom))
	var types []string
	var seq []int64
	var final responses.Response
	text := ""
	for stream.Next() {
		ev := stream.Current()
		types = append(types, ev.Type)
		seq = append(seq, ev.SequenceNumber)
		if ev.Type == "response.output_text.delta" {
			text += ev.Delta
		}
		if ev.Type == "response.completed" {
			final = ev.Response
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	want := "response.created response.in_progress " +
		"response.output_item.added response.reasoning_text.delta response.reasoning_text.done response.output_item.done " +
		"response.output_item.added response.content_part.added response.output_text.delta response.output_text.delta " +
		"response.output_text.done response.content_part.done response.output_item.done " +
		"response.output_item.added response.function_call_arguments.delta response.function_call_arguments.delta " +
		"response.function_call_arguments.done response.output_item.done " +
		"response.output_item.added response.custom_tool_call_input.done response.output_item.done response.completed"
	if got := strings.Join(types, " "); got != want {
		t.Errorf("events\n%s\nwant\n%s", got, want)
	}
	for i := range seq {
		if seq[i] != int64(i) {
			t.Fatalf("sequence numbers %v", seq)
		}
	}
	if text != "Let me look." || final.ID != "resp_5" || final.Status != "completed" || len(final.Output) != 4 || final.Usage.InputTokensDetails.CachedTokens != 900 {
		t.Fatalf("text %q, final %s", text, final.RawJSON())
	}
	if o := final.Output[3]; o.Type != "custom_tool_call" || o.Name != "apply_patch" || o.Input != "*** Begin Patch\n" || o.CallID != "call_b" {
		t.Errorf("custom tool call %s", o.RawJSON())
	}
	if o := final.Output[2]; o.Type != "function_call" || o.CallID != "call_a" || !strings.Contains(o.RawJSON(), `"arguments":"{\"cmd\":\"ls\"}"`) {
		t.Errorf("function call %s", o.RawJSON())
	}
}

// Refusals are OpenAI's errors, a context overflow with its code (Codex
// reads context_length_exceeded as "out of room"); an error mid-stream
// ends it with response.failed.
func TestErrorsAndFailures(t *testing.T) {
	c := chatServer(t, func(w http.ResponseWriter, chat map[string]any) {
		if chat["stream"] == true {
			sse(w, `{"id":"chatcmpl-9","choices":[{"index":0,"delta":{"content":"par"},"finish_reason":null}]}`,
				`{"error":{"message":"the engine writing this answer failed","type":"service_unavailable","code":"engine_failed"}}`)
			return
		}
		openaiapi.ContextTooLong(8192, 9000).Write(w)
	})
	_, err := c.Responses.New(context.Background(), params("a long prompt"))
	var ae *openai.Error
	if !errors.As(err, &ae) || ae.StatusCode != 400 || ae.Code != "context_length_exceeded" || !strings.Contains(ae.Message, "maximum context length is 8192") {
		t.Fatalf("context overflow: %v", err)
	}
	stream := c.Responses.NewStreaming(context.Background(), params("hi"))
	var last responses.ResponseStreamEventUnion
	for stream.Next() {
		last = stream.Current()
	}
	if last.Type != "response.failed" || last.Response.Status != "failed" || last.Response.Error.Code != "server_error" ||
		!strings.Contains(last.Response.Error.Message, "failed") || len(last.Response.Output) != 1 {
		t.Fatalf("last event %s", last.RawJSON())
	}
	_, err = c.Responses.New(context.Background(), responses.ResponseNewParams{Model: "m",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hi")}, PreviousResponseID: openai.String("resp_1")})
	if !errors.As(err, &ae) || ae.StatusCode != 400 || !strings.Contains(ae.Message, "send the whole conversation") {
		t.Fatalf("previous_response_id: %v", err)
	}
}
