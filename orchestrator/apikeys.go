package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/evolvellm/evolve/anthropicapi"
	"github.com/evolvellm/evolve/controlapi"
	"github.com/evolvellm/evolve/openaiapi"
	"github.com/evolvellm/evolve/orchestrator/apikeys"
	"github.com/prometheus/client_golang/prometheus"
)

// API keys guard the agents' API (everything under /v1/) when the router
// listens beyond loopback: a cluster's router otherwise serves whoever
// reaches its port. Package apikeys holds the keys, their file and their
// limits; here they guard the router and count per key.

// requireKey wraps the agents' API: a request without one of the keys is
// answered 401, in Anthropic's shape on its paths or for its clients. A
// request with one carries the key's label in its context (keyLabel).
func (o *Orchestrator) requireKey(h http.Handler) http.Handler {
	if o.keys.Get(time.Now()).Empty() {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, "/v1/") {
			h.ServeHTTP(w, r)
			return
		}
		ks := o.keys.Get(time.Now())
		if label, ok := ks.Of(r); ok {
			r = r.WithContext(context.WithValue(r.Context(), keyLabelKey{}, label))
			if l := ks.Limit(label); l != nil && apikeys.LimitedPath(r) {
				if !o.admitUnder(l, label, w, r) {
					return
				}
				defer l.Release()
			}
			h.ServeHTTP(w, r)
			return
		}
		o.met.requests.WithLabelValues(o.policy.Name(), "unauthorized").Inc()
		w.Header().Set("WWW-Authenticate", `Bearer realm="evolve"`)
		writeShaped(w, r, &openaiapi.Error{Status: 401, Type: "invalid_request_error", Code: "invalid_api_key",
			Message: "a valid API key is required: send it as Authorization: Bearer KEY or x-api-key: KEY"})
	})
}

// writeShaped answers r with e in the shape of the API it asked:
// Anthropic's on its paths or for its clients (the status's type, e's
// message and Retry-After), else OpenAI's.
func writeShaped(w http.ResponseWriter, r *http.Request, e *openaiapi.Error) {
	if !strings.HasPrefix(r.URL.Path, "/v1/messages") && !anthropicClient(r) {
		e.Write(w)
		return
	}
	if e.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(e.RetryAfter))
	}
	anthropicapi.NewError(e.Status, e.Message).Write(w)
}

type keyLabelKey struct{}

// keyLabel is the label of the API key r came with, or "" (no keys).
func keyLabel(r *http.Request) string {
	l, _ := r.Context().Value(keyLabelKey{}).(string)
	return l
}

// countRequest counts a request's outcome, per policy and per API key.
func (o *Orchestrator) countRequest(r *http.Request, outcome string) {
	o.met.requests.WithLabelValues(o.policy.Name(), outcome).Inc()
	if t := traceOf(r); t != nil {
		t.outcome = outcome // for its recorded row (record.go)
	}
	if l := keyLabel(r); l != "" {
		o.met.keyRequests.WithLabelValues(l, outcome).Inc()
	}
}

// countTokens counts the prompt and completion tokens a request's API
// key was served.
func (o *Orchestrator) countTokens(r *http.Request, prompt, completion int) {
	if l := keyLabel(r); l != "" {
		o.met.keyTokens.WithLabelValues(l, "prompt").Add(float64(prompt))
		o.met.keyTokens.WithLabelValues(l, "completion").Add(float64(completion))
	}
}

// admitUnder takes a slot of l for r, waiting up to its max-wait; when
// none comes it answers r (429, or nothing to a client gone) and returns
// false.
func (o *Orchestrator) admitUnder(l *apikeys.Limit, name string, w http.ResponseWriter, r *http.Request) bool {
	err := l.Admit(r.Context(), o.othersCounter(name))
	switch {
	case err == nil:
		return true
	case !errors.Is(err, apikeys.ErrOverLimit):
		o.countRequest(r, "client_gone")
		return false
	}
	o.countRequest(r, "rate_limited")
	where := ""
	if o.othersCounter(name) != nil {
		where = " across the cluster's routers"
	}
	writeShaped(w, r, &openaiapi.Error{Status: 429, Type: "requests", Code: "rate_limit_exceeded", RetryAfter: 1,
		Message: fmt.Sprintf("API key %s has %d requests in flight%s, its limit (max-concurrency), and none ended within %s: retry later",
			keyLabel(r), l.Max(), where, l.Wait())})
	return false
}

// keyLimitCollector gives, per name with limits, its requests in flight
// and waiting, and its limit, so that a dashboard shows how near each team
// runs to its share; the names are those in force at each scrape.
type keyLimitCollector struct{ keys *apikeys.Set }

var (
	keyInFlightDesc = prometheus.NewDesc("evolve_router_key_in_flight",
		"Requests of an API key name with a max-concurrency in flight now.", []string{"key"}, nil)
	keyWaitingDesc = prometheus.NewDesc("evolve_router_key_waiting",
		"Requests of an API key name waiting for one of its own in flight to end (max-concurrency reached).", []string{"key"}, nil)
	keyMaxDesc = prometheus.NewDesc("evolve_router_key_max_concurrency",
		"The max-concurrency of an API key name.", []string{"key"}, nil)
)

func (c keyLimitCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- keyInFlightDesc
	ch <- keyWaitingDesc
	ch <- keyMaxDesc
}

func (c keyLimitCollector) Collect(ch chan<- prometheus.Metric) {
	for _, l := range c.keys.Current().Status(nil) { // this router's: Prometheus adds the routers up
		ch <- prometheus.MustNewConstMetric(keyInFlightDesc, prometheus.GaugeValue, float64(l.InFlight), l.Name)
		ch <- prometheus.MustNewConstMetric(keyWaitingDesc, prometheus.GaugeValue, float64(l.Waiting), l.Name)
		ch <- prometheus.MustNewConstMetric(keyMaxDesc, prometheus.GaugeValue, float64(l.MaxConcurrency), l.Name)
	}
}

// KeyLimitStatus is an API key name's limit and its requests now.
type KeyLimitStatus = controlapi.KeyLimit
