package anthropicapi

import (
	"io"
	"net/http"
	"strconv"

	"github.com/evolvellm/evolve/openaiapi"
)

// Writer is the http.ResponseWriter a chat completions handler writes to
// when it answers a Messages request: the client gets, through it, the
// Messages API's answer (an openaiapi.TranslatingWriter). A stream is
// translated event by event as the handler writes and flushes it; a whole
// answer, or an error, is kept until Finish translates it.
type Writer struct {
	*openaiapi.TranslatingWriter
	tr *translation
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
	tr := &translation{info: info, usage: usage}
	return &Writer{TranslatingWriter: openaiapi.NewTranslatingWriter(w, tr), tr: tr}
}

// translation turns a chat answer into a Message, or its events.
type translation struct {
	info  Info
	usage UsageHeaders
	s     streamer
}

func (t *translation) StartStream(w io.Writer, h http.Header) {
	n, _ := strconv.Atoi(h.Get(t.usage.Prompt))
	cached, _ := strconv.Atoi(h.Get(t.usage.Cached))
	cached = min(max(cached, 0), n)
	t.s = streamer{out: w, info: t.info, begin: Usage{InputTokens: n - cached, CacheReadInputTokens: cached}}
}

func (t *translation) StreamData(b []byte) error {
	t.s.data(b)
	return t.s.writeErr
}

func (t *translation) Whole(w http.ResponseWriter, status int, body []byte) {
	if status != 200 {
		fromChatError(status, body).Write(w)
		return
	}
	b, err := message(body, t.info)
	if err != nil {
		err.Write(w)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(200)
	w.Write(append(b, '\n'))
}
