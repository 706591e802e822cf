package orchestrator

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/evolvellm/evolve/anthropicapi"
	"github.com/evolvellm/evolve/openaiapi"
)

// API keys guard the agents' API (everything under /v1/) when the router
// listens beyond loopback: a cluster's router otherwise serves whoever
// reaches its port. A client sends a key as OpenAI's and vLLM's clients
// do (Authorization: Bearer KEY) or as Anthropic's SDKs do with an API key
// (x-api-key: KEY). /health and /metrics stay open, as vLLM's do with
// --api-key, for load balancers and Prometheus.

// An API key entry is KEY or NAME KEY, and a named one may go on with the
// name's limits (keylimits.go). The name labels the key's requests and
// tokens in the router's metrics (several keys may share one, as a team's
// old and new keys do while it rotates them); a key without one is
// labelled by its fingerprint, sha256: and the first 8 hex digits of its
// SHA-256, which says nothing of the key itself. Keys hold no spaces or
// commas, so an entry reads the same in a key file, a flag and a
// comma-separated environment variable.

// apiKey is a key and its metrics label.
type apiKey struct{ label, key string }

// apiKeys is what key entries give: the keys, and the limits of the names
// that have some.
type apiKeys struct {
	keys   []apiKey
	limits map[string]*keyLimit
}

var keyNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// CheckAPIKeys says what is wrong with key entries, if anything, as
// Config.APIKeys takes them: a command checks them before it starts an
// orchestrator anywhere.
func CheckAPIKeys(entries []string) error {
	_, err := parseAPIKeys(entries)
	return err
}

// splitEntry is a key entry's name ("" when it has none), key and the
// name's limits (what follows NAME KEY); ok is false when the entry is
// neither KEY nor NAME KEY [LIMIT...].
func splitEntry(entry string) (name, key string, limits []string, ok bool) {
	f := strings.Fields(entry)
	switch {
	case strings.Contains(entry, ","):
		return "", "", nil, false
	case len(f) == 1:
		return "", f[0], nil, true
	case len(f) >= 2:
		return f[0], f[1], f[2:], true
	}
	return "", "", nil, false
}

// EntryKey is the key of a key entry (KEY or NAME KEY ...), "" if it is
// none.
func EntryKey(entry string) string {
	_, key, _, _ := splitEntry(entry)
	return key
}

// parseAPIKeys reads key entries, refusing keys a header cannot carry and
// limits that do not parse or that disagree between keys of one name.
func parseAPIKeys(entries []string) (apiKeys, error) {
	var ks apiKeys
	for _, e := range entries {
		name, key, limits, ok := splitEntry(e)
		switch {
		case !ok:
			return apiKeys{}, errors.New("an API key entry is KEY or NAME KEY, then the name's limits if any (max-concurrency=N, max-wait=D): a key must be non-empty, with no spaces or commas")
		case name != "" && !keyNameRE.MatchString(name):
			return apiKeys{}, fmt.Errorf("API key name %q: want letters, digits, dots, dashes and underscores (up to 64)", name)
		case name == "":
			sum := sha256.Sum256([]byte(key))
			name = "sha256:" + hex.EncodeToString(sum[:4])
		}
		if len(limits) > 0 {
			l, err := parseKeyLimit(name, limits)
			if err != nil {
				return apiKeys{}, err
			}
			if old, ok := ks.limits[name]; ok && !old.same(l) {
				return apiKeys{}, fmt.Errorf("API key name %s: its keys give different limits (%s, then %s): give them once, or alike", name, old, l)
			}
			if ks.limits == nil {
				ks.limits = map[string]*keyLimit{}
			}
			if _, ok := ks.limits[name]; !ok {
				ks.limits[name] = l
			}
		}
		ks.keys = append(ks.keys, apiKey{label: name, key: key})
	}
	return ks, nil
}

// requireKey wraps the agents' API: a request without one of the keys is
// answered 401, in Anthropic's shape on its paths or for its clients. A
// request with one carries the key's label in its context (keyLabel).
func (o *Orchestrator) requireKey(h http.Handler) http.Handler {
	if len(o.keys.get(time.Now()).keys) == 0 {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, "/v1/") {
			h.ServeHTTP(w, r)
			return
		}
		ks := o.keys.get(time.Now())
		if label, ok := ks.keyOf(r); ok {
			r = r.WithContext(context.WithValue(r.Context(), keyLabelKey{}, label))
			if l := ks.limits[label]; l != nil && limitedPath(r) {
				if !o.admitUnder(l, w, r) {
					return
				}
				defer l.release()
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

// keyOf says which of the keys r carries, by its label. Every key is
// compared, in constant time, whichever matches.
func (ks *apiKeys) keyOf(r *http.Request) (string, bool) {
	given := r.Header.Get("x-api-key")
	if auth := r.Header.Get("Authorization"); given == "" && len(auth) > 7 && strings.EqualFold(auth[:7], "bearer ") {
		given = strings.TrimSpace(auth[7:])
	}
	if given == "" {
		return "", false
	}
	label := "" // labels are never empty
	for _, k := range ks.keys {
		if subtle.ConstantTimeCompare([]byte(given), []byte(k.key)) == 1 {
			label = k.label
		}
	}
	return label, label != ""
}
