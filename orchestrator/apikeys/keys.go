// Package apikeys holds the agents' API keys: entries (KEY, or NAME KEY
// with the name's limits), a key file read again when it changes, the
// lookup of a request's key, and the per-name concurrency limits. The
// orchestrator's router puts them in front of the agents' API.
package apikeys

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strings"
)

// API keys guard the agents' API (everything under /v1/) when the router
// listens beyond loopback: a cluster's router otherwise serves whoever
// reaches its port. A client sends a key as OpenAI's and vLLM's clients
// do (Authorization: Bearer KEY) or as Anthropic's SDKs do with an API key
// (x-api-key: KEY). /health and /metrics stay open, as vLLM's do with
// --api-key, for load balancers and Prometheus.

// An API key entry is KEY or NAME KEY, and a named one may go on with the
// name's limits (limits.go). The name labels the key's requests and
// tokens in the router's metrics (several keys may share one, as a team's
// old and new keys do while it rotates them); a key without one is
// labelled by its fingerprint, sha256: and the first 8 hex digits of its
// SHA-256, which says nothing of the key itself. Keys hold no spaces or
// commas, so an entry reads the same in a key file, a flag and a
// comma-separated environment variable.

// apiKey is a key and its metrics label.
type apiKey struct{ label, key string }

// Keys is what key entries give: the keys, and the limits of the names
// that have some.
type Keys struct {
	keys   []apiKey
	limits map[string]*Limit
}

// Empty reports whether there are no keys (the agents' API is open).
func (ks *Keys) Empty() bool { return len(ks.keys) == 0 }

// Limit is the limit of a key's name (its label), or nil.
func (ks *Keys) Limit(label string) *Limit { return ks.limits[label] }

var keyNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// Check says what is wrong with key entries, if anything, as the
// orchestrator's Config.APIKeys takes them: a command checks them before
// it starts an orchestrator anywhere.
func Check(entries []string) error {
	_, err := parse(entries)
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

// parse reads key entries, refusing keys a header cannot carry and
// limits that do not parse or that disagree between keys of one name.
func parse(entries []string) (Keys, error) {
	var ks Keys
	for _, e := range entries {
		name, key, limits, ok := splitEntry(e)
		switch {
		case !ok:
			return Keys{}, errors.New("an API key entry is KEY or NAME KEY, then the name's limits if any (max-concurrency=N, max-wait=D): a key must be non-empty, with no spaces or commas")
		case name != "" && !keyNameRE.MatchString(name):
			return Keys{}, fmt.Errorf("API key name %q: want letters, digits, dots, dashes and underscores (up to 64)", name)
		case name == "":
			sum := sha256.Sum256([]byte(key))
			name = "sha256:" + hex.EncodeToString(sum[:4])
		}
		if len(limits) > 0 {
			l, err := parseLimit(name, limits)
			if err != nil {
				return Keys{}, err
			}
			if old, ok := ks.limits[name]; ok && !old.same(l) {
				return Keys{}, fmt.Errorf("API key name %s: its keys give different limits (%s, then %s): give them once, or alike", name, old, l)
			}
			if ks.limits == nil {
				ks.limits = map[string]*Limit{}
			}
			if _, ok := ks.limits[name]; !ok {
				ks.limits[name] = l
			}
		}
		ks.keys = append(ks.keys, apiKey{label: name, key: key})
	}
	return ks, nil
}

// Of says which of the keys r carries (as Authorization: Bearer KEY or
// x-api-key: KEY), by its label. Every key is compared, in constant time,
// whichever matches.
func (ks *Keys) Of(r *http.Request) (string, bool) {
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

// Len is how many keys there are.
func (ks *Keys) Len() int { return len(ks.keys) }
