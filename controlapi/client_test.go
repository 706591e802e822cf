package controlapi

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
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
	}
}
