// Package controlapi is the orchestrator's control API as its clients and
// servers share it: a client (JSON requests with an optional bearer token,
// the API's error answers as errors) for the CLI commands and evolve top,
// the JSON shapes evolve top reads, and the watch stream's writer used by
// the orchestrator and evolve sim --live.
package controlapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Client talks to one orchestrator's control API.
type Client struct {
	Base  string // e.g. http://127.0.0.1:8001
	Token string
	HTTP  *http.Client
	// RetryFor is how long Do goes on asking again when the API answers
	// 503 with a Retry-After (no orchestrator leads the planner while its
	// lease moves to another): 0 asks once. A wait that would end past
	// RetryFor, or past the context's end, is not begun.
	RetryFor time.Duration
	// OnRetry, if set, is told of each such answer before Do waits.
	OnRetry func(e *Error)
}

// Error is an error answer of the control API. Its text is the API's own
// message when the API gave one (written for the operator: "no node
// \"engine-9\" (nodes: ...)"); an answer the API did not write (another
// service on the port, a proxy's page) is named with the request that got
// it, which is what an operator needs to find who answered.
type Error struct {
	Status  int
	Message string // the API's message, or a description of the answer
	// RetryAfter is the wait the API asked for (Retry-After), when it
	// asked: what it refused may succeed then (no planner leader yet).
	RetryAfter time.Duration
}

func (e *Error) Error() string { return e.Message }

// TransportError is a failure to reach the control API at all.
type TransportError struct{ Err error }

func (e *TransportError) Error() string { return e.Err.Error() }
func (e *TransportError) Unwrap() error { return e.Err }

// Do sends in (if not nil) as JSON and decodes the answer into out (if not
// nil). An error answer is an *Error (see there for its text). A 503 with
// a Retry-After is asked again for up to RetryFor.
func (c *Client) Do(ctx context.Context, method, path string, in, out any) error {
	start := time.Now()
	for {
		err := c.do(ctx, method, path, in, out)
		var e *Error
		if !errors.As(err, &e) || e.Status != http.StatusServiceUnavailable || e.RetryAfter <= 0 || time.Since(start)+e.RetryAfter > c.RetryFor {
			return err
		}
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < e.RetryAfter {
			return err
		}
		if c.OnRetry != nil {
			c.OnRetry(e)
		}
		t := time.NewTimer(e.RetryAfter)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := c.NewRequest(ctx, method, path, body)
	if err != nil {
		return err
	}
	h := c.HTTP
	if h == nil {
		h = http.DefaultClient
	}
	resp, err := h.Do(req)
	if err != nil {
		return &TransportError{Err: err}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if resp.StatusCode >= 300 {
		var e struct {
			Error struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		msg := fmt.Sprintf("%s %s: %s%s", method, path, resp.Status, c.foreign(resp, b))
		if json.Unmarshal(b, &e) == nil && e.Error.Message != "" {
			msg = e.Error.Message
		}
		e2 := &Error{Status: resp.StatusCode, Message: msg}
		if secs, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && secs > 0 {
			e2.RetryAfter = time.Duration(secs) * time.Second
		}
		return e2
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("%s %s: the answer is not the control API's JSON%s (%v)", method, path, c.foreign(resp, nil), err)
		}
	}
	return nil
}

// foreign describes an answer that is not the control API's: a short
// plain-text body as it is; anything else (an HTML page, say) by its type,
// with the question an operator should ask.
func (c *Client) foreign(resp *http.Response, body []byte) string {
	text := strings.TrimSpace(string(body))
	ct := resp.Header.Get("Content-Type")
	if text != "" && len(text) <= 200 && !strings.ContainsAny(text, "\n<") {
		return ": " + text
	}
	if ct == "" {
		ct = "no content type"
	}
	return fmt.Sprintf(" (%s): is %s evolve's control address (evolve orchestrator --control-addr)?", ct, c.Base)
}

// NewRequest builds a request to the API with the token set.
func (c *Client) NewRequest(ctx context.Context, method, path string, body io.Reader) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(c.Base, "/")+path, body)
	if err != nil {
		return nil, err
	}
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	return req, nil
}
