package orchestrator

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
)

// A request the router refuses or fails is logged once, at warn, where
// it is answered: its id, its API, the status, and the reason in the
// words the client got (an operator matching an agent's complaint to the
// log finds that sentence), with the cause behind it when a handler
// noted one (noteCause: an engine's error, which the client is not told).
// An answer cut mid-stream (its status 200 already sent) is logged where
// it is cut (streamError).

// failureNote is where a handler leaves the cause of a failure for the
// log line; it rides in the request's context.
type failureNote struct{ cause error }

type failureNoteKey struct{}

// noteCause gives the failure log line of r's answer its cause.
func noteCause(r *http.Request, err error) {
	if f, ok := r.Context().Value(failureNoteKey{}).(*failureNote); ok {
		f.cause = err
	}
}

// maxLoggedError bounds the error body read for its message.
const maxLoggedError = 8 << 10

// logFailures logs each answer of 400 or more that h writes.
func (o *Orchestrator) logFailures(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		note := &failureNote{}
		fw := &failureWriter{ResponseWriter: w}
		h.ServeHTTP(fw, r.WithContext(context.WithValue(r.Context(), failureNoteKey{}, note)))
		if fw.status < 400 {
			return
		}
		id := w.Header().Get("X-Request-Id")
		if id == "" {
			id = r.Header.Get("X-Request-Id")
		}
		args := []any{"request", id, "api", apiOf(r.URL.Path), "status", fw.status, "reason", errorMessage(fw.body)}
		if note.cause != nil {
			args = append(args, "cause", note.cause)
		}
		o.log.Warn("request failed", args...)
	})
}

// failureWriter keeps an answer's status and, for an error, the start of
// its body.
type failureWriter struct {
	http.ResponseWriter
	status int
	body   []byte
}

func (w *failureWriter) WriteHeader(status int) {
	if w.status == 0 {
		w.status = status
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *failureWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	if w.status >= 400 && len(w.body) < maxLoggedError {
		w.body = append(w.body, p[:min(len(p), maxLoggedError-len(w.body))]...)
	}
	return w.ResponseWriter.Write(p)
}

// Flush passes a stream's flushes on.
func (w *failureWriter) Flush() { _ = http.NewResponseController(w.ResponseWriter).Flush() }

// Unwrap lets http.ResponseController reach the server's writer.
func (w *failureWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// apiOf names the API a path serves, for the log.
func apiOf(path string) string {
	switch path {
	case "/v1/chat/completions":
		return "chat"
	case "/v1/completions":
		return "completions"
	case "/v1/messages", "/v1/messages/count_tokens":
		return "messages"
	case "/v1/responses":
		return "responses"
	}
	if strings.HasPrefix(path, "/v1/models") {
		return "models"
	}
	if strings.HasPrefix(path, "/v1/sessions/") {
		return "sessions"
	}
	return path
}

// errorMessage is an error body's message, in OpenAI's, Anthropic's or
// the Responses API's shape (all say error.message), or the body itself.
func errorMessage(body []byte) string {
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
		Message string `json:"message"`
	}
	if json.Unmarshal(body, &e) == nil {
		if e.Error.Message != "" {
			return e.Error.Message
		}
		if e.Message != "" {
			return e.Message
		}
	}
	return strings.TrimSpace(string(body))
}
