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
	// promptHeader names the header in which the handler gives the
	// prompt's length in tokens, for message_start's usage.
	promptHeader string
}

// NewWriter returns a Writer to w for a request ToChat returned info of;
// promptHeader names the response header in which the chat handler states
// the prompt's length in tokens ("" for none: message_start then counts 0
// input tokens, and message_delta has them).
func NewWriter(w http.ResponseWriter, info Info, promptHeader string) *Writer {
	return &Writer{w: w, info: info, header: http.Header{}, promptHeader: promptHeader}
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
	n, _ := strconv.Atoi(t.header.Get(t.promptHeader))
	t.s = streamer{out: t.w, info: t.info, inputTokens: n}
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
