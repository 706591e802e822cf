package orchestrator

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/evolvellm/evolve/controlapi"
	"github.com/evolvellm/evolve/openaiapi"
	"github.com/prometheus/client_golang/prometheus"
)

// A named key entry may end with limits that all the keys of its name
// share, so that one team's agents cannot take the whole cluster from the
// others:
//
//	team-a sk-... max-concurrency=64 max-wait=30s
//
// max-concurrency is how many of the name's requests (completions, chats
// and messages; not model lists or token counts) may be in flight at once,
// an answer being in flight until its last token is written. A request
// over it waits, first come first served, up to max-wait (30 s unless
// given; 0s: not at all), then is answered 429 with Retry-After, which
// OpenAI's and Anthropic's clients retry after a pause.

// defaultMaxWait is how long a request over its name's concurrency waits
// for a slot unless max-wait says otherwise.
const defaultMaxWait = 30 * time.Second

// keyLimit is one name's share of the cluster. Safe for concurrent use.
type keyLimit struct {
	wait    time.Duration
	slots   chan struct{} // a value per request in flight, max-concurrency of them
	waiting atomic.Int64
}

// max is the name's max-concurrency.
func (l *keyLimit) max() int { return cap(l.slots) }

// same says whether l and m give the same limits.
func (l *keyLimit) same(m *keyLimit) bool { return l.max() == m.max() && l.wait == m.wait }

func (l *keyLimit) String() string {
	return fmt.Sprintf("max-concurrency=%d max-wait=%s", l.max(), l.wait)
}

// parseKeyLimit reads the limits of name from NAME KEY's further fields.
func parseKeyLimit(name string, fields []string) (*keyLimit, error) {
	l := &keyLimit{wait: defaultMaxWait}
	n := 0 // max-concurrency
	seen := map[string]bool{}
	for _, f := range fields {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			return nil, fmt.Errorf("API key name %s: %q is no limit: an entry is KEY or NAME KEY, then the name's limits if any: max-concurrency=N, max-wait=DURATION", name, f)
		}
		if seen[k] {
			return nil, fmt.Errorf("API key name %s: %s twice: give each limit at most once", name, k)
		}
		seen[k] = true
		switch k {
		case "max-concurrency":
			var err error
			if n, err = strconv.Atoi(v); err != nil || n < 1 {
				return nil, fmt.Errorf("API key name %s: max-concurrency=%s: want a whole number of requests, 1 or more", name, v)
			}
		case "max-wait":
			d, err := time.ParseDuration(v)
			if err != nil || d < 0 {
				return nil, fmt.Errorf("API key name %s: max-wait=%s: want a duration with its unit (30s, 2m; 0s: do not wait)", name, v)
			}
			l.wait = d
		default:
			return nil, fmt.Errorf("API key name %s: unknown limit %q: want max-concurrency=N or max-wait=DURATION", name, k)
		}
	}
	if n == 0 {
		return nil, fmt.Errorf("API key name %s: max-wait needs max-concurrency=N beside it", name)
	}
	l.slots = make(chan struct{}, n)
	return l, nil
}

func (l *keyLimit) release() { <-l.slots }

// limitedPath says whether r asks for an answer, which a limit counts.
func limitedPath(r *http.Request) bool {
	if r.Method != http.MethodPost {
		return false
	}
	switch r.URL.Path {
	case "/v1/completions", "/v1/chat/completions", "/v1/messages":
		return true
	}
	return false
}

// admitUnder takes a slot of l for r, waiting up to l.wait; when none
// comes it answers r (429, or nothing to a client gone) and returns false.
func (o *Orchestrator) admitUnder(l *keyLimit, w http.ResponseWriter, r *http.Request) bool {
	select {
	case l.slots <- struct{}{}:
		return true
	default:
	}
	if l.wait > 0 {
		l.waiting.Add(1)
		t := time.NewTimer(l.wait)
		defer func() { t.Stop(); l.waiting.Add(-1) }()
		select {
		case l.slots <- struct{}{}:
			return true
		case <-r.Context().Done():
			o.countRequest(r, "client_gone")
			return false
		case <-t.C:
		}
	}
	o.countRequest(r, "rate_limited")
	writeShaped(w, r, &openaiapi.Error{Status: 429, Type: "requests", Code: "rate_limit_exceeded", RetryAfter: 1,
		Message: fmt.Sprintf("API key %s has %d requests in flight, its limit (max-concurrency), and none ended within %s: retry later",
			keyLabel(r), l.max(), l.wait)})
	return false
}

// keyLimitCollector gives, per name with limits, its requests in flight
// and waiting, and its limit, so that a dashboard shows how near each team
// runs to its share; the names are those in force at each scrape.
type keyLimitCollector struct{ keys *keySet }

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
	for _, l := range c.keys.cur.Load().status() {
		ch <- prometheus.MustNewConstMetric(keyInFlightDesc, prometheus.GaugeValue, float64(l.InFlight), l.Name)
		ch <- prometheus.MustNewConstMetric(keyWaitingDesc, prometheus.GaugeValue, float64(l.Waiting), l.Name)
		ch <- prometheus.MustNewConstMetric(keyMaxDesc, prometheus.GaugeValue, float64(l.MaxConcurrency), l.Name)
	}
}

// KeyLimitStatus is an API key name's limit and its requests now.
type KeyLimitStatus = controlapi.KeyLimit

// status is the names with limits, by name.
func (ks *apiKeys) status() []KeyLimitStatus {
	var out []KeyLimitStatus
	for name, l := range ks.limits {
		out = append(out, KeyLimitStatus{Name: name, MaxConcurrency: l.max(), MaxWaitSec: l.wait.Seconds(),
			InFlight: len(l.slots), Waiting: int(l.waiting.Load())})
	}
	slices.SortFunc(out, func(a, b KeyLimitStatus) int { return strings.Compare(a.Name, b.Name) })
	return out
}
