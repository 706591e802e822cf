package orchestrator

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/evolvellm/evolve/openaiapi"
	"golang.org/x/net/netutil"
)

// HTTPLimits bound the router's and control API's connections, so that slow or
// hostile clients cannot hold them for ever. None cuts a long answer: an
// SSE stream that keeps moving may last as long as it needs.
type HTTPLimits struct {
	// MaxConnections is the most connections each server holds at once;
	// more wait in the kernel's accept queue (default 4096).
	MaxConnections int
	// BodyTimeout is how long a request's body may take to arrive,
	// extended by a second for each BodyMinRate bytes that did (default
	// 30 s): a client sending a byte every few seconds is cut, a large
	// prompt over a slow link is not.
	BodyTimeout time.Duration
	BodyMinRate int // bytes a second; default 256 KiB
	// WriteIdle is the longest one write to a client may block, a client
	// that stopped reading its answer (default 60 s).
	WriteIdle time.Duration
	// IdleTimeout closes a keep-alive connection idle that long between
	// requests (default 120 s).
	IdleTimeout time.Duration
	// LargeBodyBudget is the most bytes of large request bodies (over
	// 1 MiB) the router reads and parses at once (default 64 MiB); more
	// wait (largeBodies).
	LargeBodyBudget int64
}

func (l HTTPLimits) withDefaults() HTTPLimits {
	if l.MaxConnections <= 0 {
		l.MaxConnections = 4096
	}
	if l.BodyTimeout <= 0 {
		l.BodyTimeout = 30 * time.Second
	}
	if l.BodyMinRate <= 0 {
		l.BodyMinRate = 256 << 10
	}
	if l.WriteIdle <= 0 {
		l.WriteIdle = 60 * time.Second
	}
	if l.IdleTimeout <= 0 {
		l.IdleTimeout = 120 * time.Second
	}
	if l.LargeBodyBudget <= 0 {
		l.LargeBodyBudget = 64 << 20
	}
	return l
}

// limitListener caps the connections ln holds at once.
func (l HTTPLimits) limitListener(ln net.Listener) net.Listener {
	return netutil.LimitListener(ln, l.MaxConnections)
}

// server is an http.Server for h with the limits' timeouts.
func (l HTTPLimits) server(h http.Handler) *http.Server {
	return &http.Server{Handler: l.bound(h), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: l.IdleTimeout}
}

// bound gives each request a body deadline and each write a deadline of
// its own. http.Server's ReadTimeout and WriteTimeout cannot: the first,
// once past, cancels the context of a handler still streaming, and the
// second cuts any answer longer than it.
func (l HTTPLimits) bound(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		if r.Body != nil && r.Body != http.NoBody {
			start := time.Now()
			if rc.SetReadDeadline(start.Add(l.BodyTimeout)) == nil {
				// On a copy of the request: the server looks at its own
				// to see what is left of a body after the handler, and
				// closes the connection of one far from read (a refused
				// 1 GB Content-Length) where it would read a wrapped one
				// until the body deadline before it sent the answer.
				body := &deadlineBody{ReadCloser: r.Body, rc: rc, start: start, limit: l}
				r = r.WithContext(r.Context())
				r.Body = body
			}
		}
		// The server's own last writes (the end of a chunked answer) get
		// a deadline too.
		defer func() { _ = rc.SetWriteDeadline(time.Now().Add(l.WriteIdle)) }()
		h.ServeHTTP(&idleWriter{ResponseWriter: w, rc: rc, idle: l.WriteIdle}, r)
	})
}

// deadlineBody moves a request's read deadline as its body arrives, and
// lifts it once the body is read: past it, the connection's reads are
// only the server's watch for the client leaving.
type deadlineBody struct {
	io.ReadCloser
	rc    *http.ResponseController
	start time.Time
	limit HTTPLimits
	read  int64
	done  bool
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if b.done {
		return n, err
	}
	b.read += int64(n)
	if err != nil {
		b.done = true
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			// The deadline stays passed: the server, which reads what is
			// left of a body before it answers, gives up on it at once
			// and closes the connection after the answer.
			return n, errBodyTooSlow
		}
		if err == io.EOF {
			_ = b.rc.SetReadDeadline(time.Time{})
		}
		return n, err
	}
	if n > 0 {
		earned := time.Duration(b.read) * time.Second / time.Duration(b.limit.BodyMinRate)
		_ = b.rc.SetReadDeadline(b.start.Add(b.limit.BodyTimeout + earned))
	}
	return n, err
}

// readRequestBody reads an agent's request body, up to
// openaiapi.MaxBodyBytes; on failure, the status to answer: 413 for a body
// too large, 408 for one too slow, 400 otherwise.
//
// A large body first waits for room in the router's budget for them
// (largeBodies): 503 when the client leaves first.
func readRequestBody(w http.ResponseWriter, r *http.Request) ([]byte, int, error) {
	if r.ContentLength > openaiapi.MaxBodyBytes {
		return nil, http.StatusRequestEntityTooLarge, fmt.Errorf("the request body is over %d bytes", openaiapi.MaxBodyBytes)
	}
	bw, _ := r.Context().Value(bodyWorkKey{}).(*bodyWork)
	if err := bw.admit(r.Context(), r.ContentLength); err != nil {
		// The client left while its body waited for room.
		return nil, http.StatusServiceUnavailable, errors.New("the router was busy with other large requests and the request was cancelled while it waited; retry")
	}
	body, err := readBody(http.MaxBytesReader(w, r.Body, openaiapi.MaxBodyBytes), r.ContentLength)
	bw.read(len(body))
	if err == nil {
		return body, 0, nil
	}
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		return nil, http.StatusRequestEntityTooLarge, fmt.Errorf("the request body is over %d bytes", tooBig.Limit)
	case errors.Is(err, errBodyTooSlow):
		w.Header().Set("Connection", "close")
		return nil, http.StatusRequestTimeout, err
	}
	return nil, http.StatusBadRequest, fmt.Errorf("read body: %w", err)
}

// readBody reads a body of n bytes (-1: not said) into one buffer of its
// size, where io.ReadAll's doublings would take twice as much.
func readBody(rd io.Reader, n int64) ([]byte, error) {
	if n < 0 {
		return io.ReadAll(rd)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(rd, body); err != nil {
		return nil, err
	}
	return body, nil
}

// errBodyTooSlow is what a handler reads from a body that came too slowly.
var errBodyTooSlow = errors.New("the request body arrived too slowly")

// idleWriter gives each write to the client a deadline of its own.
type idleWriter struct {
	http.ResponseWriter
	rc   *http.ResponseController
	idle time.Duration
}

func (w *idleWriter) Write(p []byte) (int, error) {
	_ = w.rc.SetWriteDeadline(time.Now().Add(w.idle))
	return w.ResponseWriter.Write(p)
}

func (w *idleWriter) Flush() {
	_ = w.rc.SetWriteDeadline(time.Now().Add(w.idle))
	_ = w.rc.Flush()
}

// Unwrap lets http.ResponseController reach the server's writer.
func (w *idleWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Hijack keeps hijacking possible through the wrapper.
func (w *idleWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return http.NewResponseController(w.ResponseWriter).Hijack()
}
