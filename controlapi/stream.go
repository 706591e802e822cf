package controlapi

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// Recent is what requests measured over a recent window (the control
// API's cluster summary carries it as "recent").
type Recent struct {
	WindowSec   float64 `json:"window_s"`
	Requests    int     `json:"requests"` // completed in the window
	RequestsSec float64 `json:"requests_per_s"`
	TTFTP50     float64 `json:"ttft_p50_s"`
	TTFTP95     float64 `json:"ttft_p95_s"`
	E2EP50      float64 `json:"e2e_p50_s"`
	E2EP95      float64 `json:"e2e_p95_s"`
}

// Stream serves the watch stream's server-sent events: first, then every
// value from events, each as a data line of JSON; a comment every 5 s
// keeps idle connections alive. It returns when the client goes, or when
// events is closed (the server dropped a client too slow to keep up: it
// says so, and the client resyncs by reconnecting).
func Stream[T any](w http.ResponseWriter, r *http.Request, first T, events <-chan T) {
	flusher, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	send := func(v T) error {
		b, _ := json.Marshal(v)
		if _, err := fmt.Fprintf(w, "data: %s\n\n", b); err != nil {
			return err
		}
		flusher.Flush()
		return nil
	}
	if send(first) != nil {
		return
	}
	ping := time.NewTicker(5 * time.Second)
	defer ping.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case v, ok := <-events:
			if !ok {
				fmt.Fprint(w, "event: dropped\ndata: {\"reason\":\"too slow\"}\n\n")
				flusher.Flush()
				return
			}
			if send(v) != nil {
				return
			}
		case <-ping.C:
			if _, err := io.WriteString(w, ": ping\n\n"); err != nil {
				return
			}
			flusher.Flush()
		}
	}
}

// Watch reads a watch stream (the server-sent events Stream writes) at
// path into out until ctx ends or the stream breaks; io.EOF when the
// server closed it.
func (c *Client) Watch(ctx context.Context, path string, out chan<- WatchEvent) error {
	req, err := c.NewRequest(ctx, "GET", path, nil)
	if err != nil {
		return err
	}
	resp, err := (&http.Client{}).Do(req) // no timeout: the stream is long-lived
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return fmt.Errorf("watch: %s", resp.Status)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var ev WatchEvent
		if json.Unmarshal([]byte(line), &ev) != nil || ev.Type == "" {
			continue
		}
		select {
		case out <- ev:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return io.EOF
}
