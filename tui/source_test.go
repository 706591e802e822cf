package tui

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
)

// A switch asked from evolve top while no orchestrator leads the planner
// (its lease moving after the leader died) is asked again until one does,
// as `evolve role set` is, rather than failing on the screen.
func TestSwitchWaitsForAPlannerLeader(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != "POST" || r.URL.Path != "/api/v1/nodes/e1/role" {
			http.NotFound(w, r)
			return
		}
		if calls.Add(1) == 1 {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte(`{"error":{"message":"no orchestrator leads the planner now"}}`))
			return
		}
		w.Write([]byte(`{}`))
	}))
	defer srv.Close()
	if err := NewHTTPSource(srv.URL, "").SetRole(context.Background(), "e1", "prefill"); err != nil {
		t.Fatalf("switch: %v", err)
	}
	if calls.Load() != 2 {
		t.Fatalf("%d calls, want 2", calls.Load())
	}
}
