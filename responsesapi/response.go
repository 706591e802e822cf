package responsesapi

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/evolvellm/evolve/openaiapi"
)

var obj = openaiapi.Object

// Usage is a Response's usage.
type Usage struct {
	InputTokens        int `json:"input_tokens"`
	InputTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	OutputTokens        int `json:"output_tokens"`
	OutputTokensDetails struct {
		ReasoningTokens int `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
	TotalTokens int `json:"total_tokens"`
}

func usageOf(u *openaiapi.ChatUsage) *Usage {
	if u == nil {
		return nil
	}
	out := &Usage{InputTokens: u.PromptTokens, OutputTokens: u.CompletionTokens, TotalTokens: u.PromptTokens + u.CompletionTokens}
	out.InputTokensDetails.CachedTokens = u.Cached()
	if u.CompletionDetails != nil {
		out.OutputTokensDetails.ReasoningTokens = min(max(u.CompletionDetails.ReasoningTokens, 0), u.CompletionTokens)
	}
	return out
}

// responseID names the Response after the chat answer it comes from.
func responseID(chatID string) string {
	for _, p := range []string{"chatcmpl-", "cmpl-"} {
		chatID = strings.TrimPrefix(chatID, p)
	}
	if chatID == "" {
		chatID = "evolve"
	}
	return "resp_" + chatID
}

// response is a Response object, with the request's echo.
type response struct {
	id      string
	created int64
	info    Info
}

// object is the Response in the state status, with its output so far.
func (r *response) object(status string, output []json.RawMessage, usage *Usage, incomplete, fail any) json.RawMessage {
	if output == nil {
		output = []json.RawMessage{}
	}
	e := r.info.Echo
	return obj("id", r.id, "object", "response", "created_at", r.created, "status", status,
		"error", fail, "incomplete_details", incomplete, "instructions", e.Instructions,
		"max_output_tokens", e.MaxOutputTokens, "model", r.info.Model, "output", output,
		"parallel_tool_calls", e.ParallelToolCalls, "previous_response_id", nil, "reasoning", e.Reasoning,
		"store", false, "temperature", e.Temperature, "text", e.Text, "tool_choice", e.ToolChoice,
		"tools", e.Tools, "top_p", e.TopP, "truncation", "disabled", "metadata", e.Metadata,
		"prompt_cache_key", e.PromptCacheKey, "usage", usage)
}

// ending is how an answer of a finish reason ends: its status, and for an
// incomplete one, why.
func ending(finish string) (string, any) {
	switch finish {
	case "length":
		return "incomplete", obj("reason", "max_output_tokens")
	case "content_filter":
		return "incomplete", obj("reason", "content_filter")
	}
	return "completed", nil
}

// Items of the output.

func messageItem(id, status, text string) json.RawMessage {
	content := []json.RawMessage{}
	if status == "completed" || text != "" {
		content = append(content, textPart(text))
	}
	return obj("id", id, "type", "message", "status", status, "role", "assistant", "content", content)
}

func textPart(text string) json.RawMessage {
	return obj("type", "output_text", "text", text, "annotations", []any{}, "logprobs", []any{})
}

func reasoningItem(id, text string, done bool) json.RawMessage {
	content := []json.RawMessage{}
	if done {
		content = append(content, obj("type", "reasoning_text", "text", text))
	}
	return obj("id", id, "type", "reasoning", "summary", []any{}, "content", content)
}

// callItem is a function_call item, or a custom_tool_call one for a
// custom tool (whose input is the call's "input" argument).
func callItem(id, status, callID, chatName, args string, tools map[string]ToolName) json.RawMessage {
	tn, ok := tools[chatName]
	if !ok {
		tn = ToolName{Name: chatName}
	}
	if tn.Custom {
		input := args
		var a struct {
			Input *string `json:"input"`
		}
		if json.Unmarshal([]byte(args), &a) == nil && a.Input != nil {
			input = *a.Input
		}
		kv := []any{"id", id, "type", "custom_tool_call", "status", status, "call_id", callID, "name", tn.Name, "input", input}
		if tn.Namespace != "" {
			kv = append(kv, "namespace", tn.Namespace)
		}
		return obj(kv...)
	}
	kv := []any{"id", id, "type", "function_call", "status", status, "call_id", callID, "name", tn.Name}
	if tn.Namespace != "" {
		kv = append(kv, "namespace", tn.Namespace)
	}
	return obj(append(kv, "arguments", args)...)
}

// whole translates a whole chat completion into a Response.
func whole(b []byte, info Info) ([]byte, *openaiapi.Error) {
	var a openaiapi.ChatAnswer
	if err := json.Unmarshal(b, &a); err != nil {
		return nil, &openaiapi.Error{Status: 502, Type: "server_error", Message: "the engine's answer cannot be read: " + err.Error()}
	}
	if len(a.Choices) == 0 {
		return nil, &openaiapi.Error{Status: 502, Type: "server_error", Message: "the engine's answer has no choice"}
	}
	r := &response{id: responseID(a.ID), created: a.Created, info: info}
	if r.created == 0 {
		r.created = time.Now().Unix()
	}
	c := a.Choices[0]
	var output []json.RawMessage
	if t := c.Message.ReasoningText(); t != "" {
		output = append(output, reasoningItem("rs_"+r.id[len("resp_"):], t, true))
	}
	text := ""
	if c.Message.Content != nil {
		text = *c.Message.Content
	}
	if text != "" || len(c.Message.ToolCalls) == 0 {
		output = append(output, messageItem("msg_"+r.id[len("resp_"):], "completed", text))
	}
	for i, tc := range c.Message.ToolCalls {
		output = append(output, callItem(callItemID(r.id, i), "completed", tc.ID, tc.Function.Name, tc.Function.Arguments, info.Tools))
	}
	finish := ""
	if c.FinishReason != nil {
		finish = *c.FinishReason
	}
	status, incomplete := ending(finish)
	return r.object(status, output, usageOf(a.Usage), incomplete, nil), nil
}

func callItemID(respID string, i int) string {
	return "fc_" + respID[len("resp_"):] + "_" + itoa(i)
}

func itoa(i int) string {
	b, _ := json.Marshal(i)
	return string(b)
}

// errorOf is a chat server's refusal as the Responses API gives it:
// OpenAI's error shape, with a type for its status when it has none.
func errorOf(status int, b []byte) *openaiapi.Error {
	e := openaiapi.ErrorOf(status, b)
	if e.Type == "" {
		e.Type = "invalid_request_error"
		if status >= 500 {
			e.Type = "server_error"
		}
	}
	return e
}

// Writer is the http.ResponseWriter a chat completions handler writes to
// when it answers a Responses request: through it the client gets a
// Response, or its stream of events (an openaiapi.TranslatingWriter).
type Writer struct {
	*openaiapi.TranslatingWriter
}

// NewWriter returns a Writer to w for a request ToChat returned info of.
func NewWriter(w http.ResponseWriter, info Info) *Writer {
	return &Writer{openaiapi.NewTranslatingWriter(w, &translation{info: info})}
}

type translation struct {
	info Info
	s    *streamer
}

func (t *translation) StartStream(w io.Writer, _ http.Header) {
	t.s = &streamer{out: w, info: t.info}
}

func (t *translation) StreamData(b []byte) error {
	t.s.data(b)
	return t.s.writeErr
}

func (t *translation) Whole(w http.ResponseWriter, status int, body []byte) {
	if status != 200 {
		errorOf(status, body).Write(w)
		return
	}
	b, err := whole(body, t.info)
	if err != nil {
		err.Write(w)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(200)
	w.Write(append(b, '\n'))
}
