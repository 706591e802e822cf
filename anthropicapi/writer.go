package anthropicapi

import (
	"bytes"
	"net/http"
	"strconv"
	"strings"
)

// Writer is the http.ResponseWriter a chat completions handler writes to
// when it answers a Messages request: the client gets, through it, the
// Messages API's answer. A stream (text/event-stream) is translated event
// by event as the handler writes and flushes it; a whole answer, or an
// error, is kept until Finish translates it. The handler's headers pass on,
// but for Content-Type and Content-Length.
type Writer struct {
	w      http.ResponseWriter
	info   Info
	header http.Header
	status int
	sse    bool
	buf    []byte // a whole answer, or a stream's unfinished line
	s      streamer
	// usage names the headers in which the handler gives what it knows
	// of the prompt's usage when the answer starts, for message_start.
	usage UsageHeaders
}

// UsageHeaders name the response headers in which a chat handler states,
// when its answer starts, the prompt's length in tokens and how many of
// them were cached ("" for none: message_start then counts 0, and
// message_delta has the usage).
type UsageHeaders struct {
	Prompt, Cached string
}

// NewWriter returns a Writer to w for a request ToChat returned info of.
func NewWriter(w http.ResponseWriter, info Info, usage UsageHeaders) *Writer {
	return &Writer{w: w, info: info, header: http.Header{}, usage: usage}
}

// Header is the chat handler's response header.
func (t *Writer) Header() http.Header { return t.header }

// WriteHeader starts the answer: a stream's at once, a whole answer's at
// Finish.
func (t *Writer) WriteHeader(status int) {
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
	n, _ := strconv.Atoi(t.header.Get(t.usage.Prompt))
	cached, _ := strconv.Atoi(t.header.Get(t.usage.Cached))
	cached = min(max(cached, 0), n)
	t.s = streamer{out: t.w, info: t.info, begin: Usage{InputTokens: n - cached, CacheReadInputTokens: cached}}
}

// Write takes what the chat handler writes.
func (t *Writer) Write(b []byte) (int, error) {
	if t.status == 0 {
		t.WriteHeader(200)
	}
	t.buf = append(t.buf, b...)
	if !t.sse {
		return len(b), nil
	}
	rest := t.buf
	for {
		i := bytes.IndexByte(rest, '\n')
		if i < 0 {
			break
		}
		line := bytes.TrimRight(rest[:i], "\r")
		rest = rest[i+1:]
		// Blank lines, comments and event names are the chat stream's
		// framing; the translation writes its own.
		if d, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			t.s.data(bytes.TrimPrefix(d, []byte(" ")))
		}
	}
	t.buf = append(t.buf[:0], rest...)
	if t.s.writeErr != nil {
		return 0, t.s.writeErr
	}
	return len(b), nil
}

// Flush sends what the translation wrote to the client.
func (t *Writer) Flush() {
	if f, ok := t.w.(http.Flusher); ok {
		f.Flush()
	}
}

// Finish writes a whole answer or an error, once the chat handler has
// returned. A stream is already written: one the handler left without its
// end stays cut short, and the client knows it has no message_stop.
func (t *Writer) Finish() {
	if t.sse || t.status == 0 {
		return
	}
	if t.status != 200 {
		fromChatError(t.status, t.buf).Write(t.w)
		return
	}
	b, err := message(t.buf, t.info)
	if err != nil {
		err.Write(t.w)
		return
	}
	t.w.Header().Set("Content-Type", "application/json")
	t.w.WriteHeader(200)
	t.w.Write(append(b, '\n'))
}
