package orchestrator

import (
	"encoding/json"
	"strconv"

	"github.com/evolvellm/evolve/openaiapi"
)

// Usage that tells the truth: an answer's cached prompt tokens are the
// tokens this request did not compute because their KV existed before it
// arrived (on a GPU, in a host pool, on a peer). An engine cannot tell
// that KV apart from KV computed for this very request elsewhere: a
// decode engine counts what it pulled from the request's prefill leg as
// cached (evolve's and vLLM's alike), and an engine that goes on with an
// answer after a failure counts what the failed engine computed and
// offloaded. The router knows, and says it in the answer's usage.

// noteCached keeps what a split request's prefill leg found cached: what
// existed before the request came.
func (a *attempt) noteCached(u *usage) {
	if u != nil && u.Details != nil && a.prefillCached < 0 {
		a.prefillCached = min(max(u.Details.CachedTokens, 0), len(a.p.Tokens))
	}
}

// promptCached is the prompt tokens the answer's usage reports cached,
// when the router knows better than its last engine: a split request's
// prefill leg's, and for an answer that went on after its engine failed,
// what the router placed (the directory's match and the fetches). false:
// the engine's own figure stands (a request served whole where it was
// placed, or handed over with its first engine's story).
func (a *attempt) promptCached() (int, bool) {
	switch {
	case a.dec.Disaggregated && a.prefillCached >= 0:
		return a.prefillCached, true
	case a.resumes > 0:
		return a.placedCached, true
	}
	return 0, false
}

// trueUsage rewrites the cached tokens of an answer's (or a streamed
// chunk's) usage to promptCached; an answer without usage, or whose
// cached tokens the engine's figure already tells, is returned as it is.
func (a *attempt) trueUsage(answer []byte) []byte {
	cached, ok := a.promptCached()
	if !ok {
		return answer
	}
	return withCachedTokens(answer, cached)
}

// withCachedTokens sets usage.prompt_tokens_details.cached_tokens of an
// answer to cached, keeping every other member as it is.
func withCachedTokens(answer []byte, cached int) []byte {
	rb, err := openaiapi.ParseObject(answer)
	if err != nil || !rb.Has("usage") {
		return answer
	}
	u, err := openaiapi.ParseObject(rb.Members["usage"])
	if err != nil || u.Members == nil {
		return answer
	}
	details := json.RawMessage(`{}`)
	if d, ok := u.Members["prompt_tokens_details"]; ok && string(d) != "null" {
		details = d
	}
	d, err := openaiapi.ParseObject(details)
	if err != nil || d.Members == nil {
		return answer
	}
	n := json.RawMessage(strconv.Itoa(cached))
	if string(d.Members["cached_tokens"]) == string(n) {
		return answer
	}
	return rb.With(map[string]json.RawMessage{"usage": u.With(map[string]json.RawMessage{
		"prompt_tokens_details": d.With(map[string]json.RawMessage{"cached_tokens": n})})})
}
