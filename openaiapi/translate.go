package openaiapi

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
)

// Serving another API in front of chat completions (Anthropic's Messages,
// OpenAI's Responses): the request is translated into a chat request and
// served as one, and the chat handler writes its answer into a
// TranslatingWriter, which gives the client the other API's answer. The
// chat answer's shapes below are what a translation reads of it.

// ChatAnswer is a chat completion, or one chunk of its stream, as far as
// a translation reads it.
type ChatAnswer struct {
	ID      string       `json:"id"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []ChatChoice `json:"choices"`
	Usage   *ChatUsage   `json:"usage"`
	Error   *ChatError   `json:"error"`
}

// ChatChoice is a choice of a chat answer or of a stream chunk.
type ChatChoice struct {
	Message      ChatTurn        `json:"message"`
	Delta        ChatTurn        `json:"delta"`
	FinishReason *string         `json:"finish_reason"`
	StopReason   json.RawMessage `json:"stop_reason"` // vLLM: the stop string (or token id) that matched
}

// ChatTurn is a chat answer's message, or a stream chunk's delta.
type ChatTurn struct {
	Content   *string        `json:"content"`
	Reasoning *string        `json:"reasoning_content"`
	Reason2   *string        `json:"reasoning"` // vLLM's newer name
	ToolCalls []ChatToolCall `json:"tool_calls"`
}

// ReasoningText is the turn's reasoning, under either of vLLM's names.
func (t *ChatTurn) ReasoningText() string {
	switch {
	case t.Reasoning != nil:
		return *t.Reasoning
	case t.Reason2 != nil:
		return *t.Reason2
	}
	return ""
}

// ChatToolCall is a tool call in a chat answer or in a stream's delta.
type ChatToolCall struct {
	Index    int    `json:"index"`
	ID       string `json:"id"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// ChatUsage is a chat answer's usage.
type ChatUsage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	Details          *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
	CompletionDetails *struct {
		ReasoningTokens int `json:"reasoning_tokens"`
	} `json:"completion_tokens_details"`
}

// Cached is the prompt tokens the usage says were cached, within the
// prompt.
func (u *ChatUsage) Cached() int {
	if u == nil || u.Details == nil {
		return 0
	}
	return min(max(u.Details.CachedTokens, 0), u.PromptTokens)
}

// ChatError is the error member of an error answer or of a stream chunk.
type ChatError struct {
	Message string `json:"message"`
	Type    string `json:"type"`
	Code    string `json:"code"`
}

// ErrorOf reads an error answer (OpenAI's nested shape, or vLLM's flat
// one) as an Error with status.
func ErrorOf(status int, b []byte) *Error {
	var e struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Error   *struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Code    any    `json:"code"`
			Param   any    `json:"param"`
		} `json:"error"`
	}
	out := &Error{Status: status, Message: strings.TrimSpace(string(b))}
	if json.Unmarshal(b, &e) == nil {
		switch {
		case e.Error != nil && e.Error.Message != "":
			out.Message, out.Type = e.Error.Message, e.Error.Type
			out.Code, _ = e.Error.Code.(string)
			out.Param, _ = e.Error.Param.(string)
		case e.Message != "":
			out.Message, out.Type = e.Message, e.Type
		}
	}
	if out.Message == "" {
		out.Message = http.StatusText(status)
	}
	return out
}

// ChatTranslation is what a TranslatingWriter does with a chat answer.
type ChatTranslation interface {
	// StartStream begins a streamed answer, with the chat handler's
	// headers h, to be written to w.
	StartStream(w io.Writer, h http.Header)
	// StreamData takes the payload of one data line of the chat stream;
	// it returns the error of writing to the client, once there is one.
	StreamData(b []byte) error
	// Whole writes the answer to a request the chat handler answered
	// whole (status 200) or refused (any other status), with body.
	Whole(w http.ResponseWriter, status int, body []byte)
}

// TranslatingWriter is the http.ResponseWriter a chat completions handler
// writes to when it answers a request of another API: through it the
// client gets that API's answer (its ChatTranslation's). A stream
// (text/event-stream) is translated line by line as the handler writes
// and flushes it; a whole answer, or an error, is kept until Finish. The
// handler's headers pass on, but for Content-Type and Content-Length.
type TranslatingWriter struct {
	w      http.ResponseWriter
	t      ChatTranslation
	header http.Header
	status int
	sse    bool
	buf    []byte // a whole answer, or a stream's unfinished line
	err    error
}

// NewTranslatingWriter returns a TranslatingWriter to w that translates
// with t.
func NewTranslatingWriter(w http.ResponseWriter, t ChatTranslation) *TranslatingWriter {
	return &TranslatingWriter{w: w, t: t, header: http.Header{}}
}

// Header is the chat handler's response header.
func (t *TranslatingWriter) Header() http.Header { return t.header }

// WriteHeader starts the answer: a stream's at once, a whole answer's at
// Finish.
func (t *TranslatingWriter) WriteHeader(status int) {
	if t.status != 0 {
		return
	}
	t.status = status
	out := t.w.Header()
	for k, v := range t.header {
		if k != "Content-Type" && k != "Content-Length" {
			out[k] = v
		}
	}
	t.sse = status == 200 && strings.HasPrefix(t.header.Get("Content-Type"), "text/event-stream")
	if !t.sse {
		return
	}
	out.Set("Content-Type", "text/event-stream")
	out.Set("Cache-Control", "no-cache")
	t.w.WriteHeader(200)
	t.t.StartStream(t.w, t.header)
}

// Write takes what the chat handler writes.
func (t *TranslatingWriter) Write(b []byte) (int, error) {
	if t.status == 0 {
		t.WriteHeader(200)
	}
	t.buf = append(t.buf, b...)
	if !t.sse {
		return len(b), nil
	}
	rest := t.buf
	for t.err == nil {
		i := bytes.IndexByte(rest, '\n')
		if i < 0 {
			break
		}
		line := bytes.TrimRight(rest[:i], "\r")
		rest = rest[i+1:]
		// Blank lines, comments and event names are the chat stream's
		// framing; the translation writes its own.
		if d, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			t.err = t.t.StreamData(bytes.TrimPrefix(d, []byte(" ")))
		}
	}
	t.buf = append(t.buf[:0], rest...)
	if t.err != nil {
		return 0, t.err
	}
	return len(b), nil
}

// Flush sends what the translation wrote to the client.
func (t *TranslatingWriter) Flush() {
	if f, ok := t.w.(http.Flusher); ok {
		f.Flush()
	}
}

// Finish writes a whole answer or an error, once the chat handler has
// returned. A stream is already written: one the handler left without its
// end stays cut short, and the client knows it has no end.
func (t *TranslatingWriter) Finish() {
	if t.sse || t.status == 0 {
		return
	}
	t.t.Whole(t.w, t.status, t.buf)
}

// Object is the JSON object of the key-value pairs kv (a string key, then
// its value), in their order: a translation's answers list their members
// as the API's documentation does (type first).
func Object(kv ...any) json.RawMessage {
	b := []byte{'{'}
	for i := 0; i+1 < len(kv); i += 2 {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(append(b, marshal(kv[i].(string))...), ':')
		b = append(b, marshal(kv[i+1])...)
	}
	return append(b, '}')
}

// marshal is v's JSON without HTML escaping: a message that says "N > L"
// reads so, not "N \u003e L".
func marshal(v any) []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return []byte("null") // never: the values are strings, numbers and objects of them
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}
