package apikeys

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/evolvellm/evolve/controlapi"
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

// Limit is one name's share of the cluster. Safe for concurrent use.
type Limit struct {
	wait    time.Duration
	slots   chan struct{} // a value per request in flight, max-concurrency of them
	waiting atomic.Int64
}

// Max is the name's max-concurrency.
func (l *Limit) Max() int { return cap(l.slots) }

// same says whether l and m give the same limits.
func (l *Limit) same(m *Limit) bool { return l.Max() == m.Max() && l.wait == m.wait }

func (l *Limit) String() string {
	return fmt.Sprintf("max-concurrency=%d max-wait=%s", l.Max(), l.wait)
}

// parseLimit reads the limits of name from NAME KEY's further fields.
func parseLimit(name string, fields []string) (*Limit, error) {
	l := &Limit{wait: defaultMaxWait}
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

// Release gives back the slot a request took (Admit).
func (l *Limit) Release() { <-l.slots }

// ErrOverLimit is Admit's answer to a request that found no slot within
// the name's max-wait.
var ErrOverLimit = errors.New("API key name over its max-concurrency")

// Admit takes a slot for a request, waiting up to the name's max-wait:
// nil once it has one (Release gives it back), ErrOverLimit when none came
// in time, ctx's error when the client left first. others, when not nil,
// counts the name's requests in flight at other routers, which take their
// share of max-concurrency: a slot is taken only while this router's and
// theirs are fewer (looked at again every othersPoll while waiting).
func (l *Limit) Admit(ctx context.Context, others func() int) error {
	free := func() bool { return others == nil || len(l.slots)+others() < cap(l.slots) }
	if free() {
		select {
		case l.slots <- struct{}{}:
			return nil
		default:
		}
	}
	if l.wait <= 0 {
		return ErrOverLimit
	}
	l.waiting.Add(1)
	t := time.NewTimer(l.wait)
	defer func() { t.Stop(); l.waiting.Add(-1) }()
	var poll <-chan time.Time
	if others != nil {
		tick := time.NewTicker(othersPoll)
		defer tick.Stop()
		poll = tick.C
	}
	for {
		var slots chan struct{} // nil: not now (others hold the rest)
		if free() {
			slots = l.slots
		}
		select {
		case slots <- struct{}{}:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			return ErrOverLimit
		case <-poll:
		}
	}
}

// othersPoll is how often a waiting request looks again at the other
// routers' requests in flight.
const othersPoll = 25 * time.Millisecond

// InFlight is the name's requests in flight at this router.
func (l *Limit) InFlight() int { return len(l.slots) }

// Wait is the name's max-wait.
func (l *Limit) Wait() time.Duration { return l.wait }

// LimitedPath says whether r asks for an answer, which a limit counts.
func LimitedPath(r *http.Request) bool {
	if r.Method != http.MethodPost {
		return false
	}
	switch r.URL.Path {
	case "/v1/completions", "/v1/chat/completions", "/v1/messages", "/v1/responses":
		return true
	}
	return false
}

// Status is the names with limits, by name, with their requests now:
// in flight at this router, plus at others where others counts them.
func (ks *Keys) Status(others func(name string) int) []controlapi.KeyLimit {
	var out []controlapi.KeyLimit
	for name, l := range ks.limits {
		n := len(l.slots)
		if others != nil {
			n += others(name)
		}
		out = append(out, controlapi.KeyLimit{Name: name, MaxConcurrency: l.Max(), MaxWaitSec: l.wait.Seconds(),
			InFlight: n, Waiting: int(l.waiting.Load())})
	}
	slices.SortFunc(out, func(a, b controlapi.KeyLimit) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Limited are the names with limits.
func (ks *Keys) Limited() []string {
	names := make([]string, 0, len(ks.limits))
	for name := range ks.limits {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}
