package orchestrator

import (
	"crypto/subtle"
	"errors"
	"net/http"
	"strings"

	"github.com/evolvellm/evolve/anthropicapi"
	"github.com/evolvellm/evolve/openaiapi"
)

// API keys guard the agents' API (everything under /v1/) when the router
// listens beyond loopback: a cluster's router otherwise serves whoever
// reaches its port. A client sends a key as OpenAI's and vLLM's clients
// do (Authorization: Bearer KEY) or as Anthropic's SDKs do with an API key
// (x-api-key: KEY). /health and /metrics stay open, as vLLM's do with
// --api-key, for load balancers and Prometheus.

// checkAPIKeys refuses keys a header cannot carry.
func checkAPIKeys(keys []string) error {
	for _, k := range keys {
		if k == "" || strings.ContainsAny(k, " \t\r\n,") {
			return errors.New("an API key must be non-empty, with no spaces or commas")
		}
	}
	return nil
}

// requireKey wraps the agents' API: a request without one of the keys is
// answered 401, in Anthropic's shape on its paths or for its clients.
func (o *Orchestrator) requireKey(h http.Handler) http.Handler {
	if len(o.cfg.APIKeys) == 0 {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, "/v1/") || o.keyOK(r) {
			h.ServeHTTP(w, r)
			return
		}
		o.met.requests.WithLabelValues(o.policy.Name(), "unauthorized").Inc()
		w.Header().Set("WWW-Authenticate", `Bearer realm="evolve"`)
		const msg = "a valid API key is required: send it as Authorization: Bearer KEY or x-api-key: KEY"
		if strings.HasPrefix(r.URL.Path, "/v1/messages") || anthropicClient(r) {
			anthropicapi.NewError(401, msg).Write(w)
			return
		}
		(&openaiapi.Error{Status: 401, Type: "invalid_request_error", Code: "invalid_api_key", Message: msg}).Write(w)
	})
}

// keyOK says whether r carries one of the keys.
func (o *Orchestrator) keyOK(r *http.Request) bool {
	given := r.Header.Get("x-api-key")
	if auth := r.Header.Get("Authorization"); given == "" && len(auth) > 7 && strings.EqualFold(auth[:7], "bearer ") {
		given = strings.TrimSpace(auth[7:])
	}
	if given == "" {
		return false
	}
	ok := 0
	for _, k := range o.cfg.APIKeys {
		ok |= subtle.ConstantTimeCompare([]byte(given), []byte(k))
	}
	return ok == 1
}
