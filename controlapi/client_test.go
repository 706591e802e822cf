package controlapi

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// An answer that is not the control API's (another service on the port,
// an HTML page) is named for what it is, with the question to ask, rather
// than pasted into the error.
func TestClientNamesAnswersThatAreNotTheAPIs(t *testing.T) {
	for _, tc := range []struct {
		status int
		ctype  string
		body   string
		want   []string
		absent string
	}{
		{404, "text/html", "<!DOCTYPE HTML>\n<html><body>File not found</body></html>\n", []string{"GET /api/v1/nodes: 404 Not Found (text/html)", "evolve's control address"}, "<html"},
		{200, "text/html", "<html>an app</html>", []string{"GET /api/v1/nodes: the answer is not the control API's JSON (text/html)", "evolve's control address"}, "<html"},
		{502, "text/plain", "upstream unreachable\n", []string{"GET /api/v1/nodes: 502 Bad Gateway: upstream unreachable"}, "control address"},
		{409, "application/json", `{"error": {"message": "engine-3 is switching"}}`, []string{"engine-3 is switching"}, "/api/v1"}, // the API's message, as it wrote it
	} {
		t.Run(tc.ctype, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", tc.ctype)
				w.WriteHeader(tc.status)
				w.Write([]byte(tc.body))
			}))
			var out map[string]any
			err := (&Client{Base: srv.URL}).Do(context.Background(), "GET", "/api/v1/nodes", nil, &out)
			srv.Close()
			if err == nil {
				t.Fatalf("%d %s: no error", tc.status, tc.ctype)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%d %s: error %q, want %q", tc.status, tc.ctype, err, w)
				}
			}
			if strings.Contains(err.Error(), tc.absent) {
				t.Errorf("%d %s: error %q has %q", tc.status, tc.ctype, err, tc.absent)
			}
			var apiErr *Error
			if tc.status >= 300 && (!errors.As(err, &apiErr) || apiErr.Status != tc.status) {
				t.Errorf("%d: error %T %v, want an *Error with its status", tc.status, err, err)
			}
		})
	}
}

// A 503 with a Retry-After (no planner leader while its lease moves) is
// asked again for up to RetryFor, and OnRetry hears of each wait; asked
// once by default, and never waited past the context's end.
func TestClientAsksAgainWhileNoLeader(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) <= 2 {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte(`{"error":{"message":"no orchestrator leads the planner now"}}`))
			return
		}
		w.Write([]byte(`{"role":"prefill"}`))
	}))
	defer srv.Close()

	once := &Client{Base: srv.URL}
	var e *Error
	if err := once.Do(context.Background(), "POST", "/api/v1/nodes/e0/role", nil, nil); !errors.As(err, &e) || e.Status != 503 || e.RetryAfter != time.Second {
		t.Fatalf("without RetryFor: %v", err)
	}

	calls.Store(0)
	var waits []string
	c := &Client{Base: srv.URL, RetryFor: 10 * time.Second, OnRetry: func(e *Error) { waits = append(waits, e.Message) }}
	var out struct{ Role string }
	if err := c.Do(context.Background(), "POST", "/api/v1/nodes/e0/role", nil, &out); err != nil || out.Role != "prefill" {
		t.Fatalf("with RetryFor: %v, %+v", err, out)
	}
	if calls.Load() != 3 || len(waits) != 2 || waits[0] != "no orchestrator leads the planner now" {
		t.Fatalf("%d calls, waits %q", calls.Load(), waits)
	}

	calls.Store(0)
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if err := c.Do(ctx, "POST", "/api/v1/nodes/e0/role", nil, nil); !errors.As(err, &e) || calls.Load() != 1 {
		t.Fatalf("a wait past the context's end was begun: %v after %d calls", err, calls.Load())
	}
}
