package loadgen

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/evolvellm/evolve/tokenizer"
	"github.com/evolvellm/evolve/workload"
)

// A run whose server refuses some requests counts them and says which
// went wrong first and last, and when, so that an operator can line the
// failures up with what the cluster did then; the answered requests'
// KV sources and preemptions are summed over both legs of a split, and
// the requests handed over mid-answer are counted.
func TestBenchReportsErrorsAndKVSources(t *testing.T) {
	var n, moved atomic.Int64
	srv := fakeRouter(t, func() int64 { return 1000000 }, func(w http.ResponseWriter, r *http.Request) {
		i := n.Add(1)
		if i%3 == 0 {
			http.Error(w, fmt.Sprintf(`{"error": {"message": "refusal %d"}}`, i), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\": [{\"text\": \"the answer\"}]}\n\n")
		// A split request: the decode leg was preempted twice, the
		// prefill leg once.
		// Every other one moved to another decode engine mid-answer.
		handedOver := 0
		if i%2 == 0 {
			handedOver = 1
			moved.Add(1)
		}
		fmt.Fprintf(w, "data: {\"choices\": [], \"usage\": {\"prompt_tokens\": 100, \"completion_tokens\": 2},"+
			" \"evolve\": {\"transferred_tokens\": 96, \"preemptions\": 2, \"handed_over\": %d, \"prefill\": {\"gpu_hit_tokens\": 64, \"computed_tokens\": 36, \"preemptions\": 1}}}\n\n", handedOver)
		fmt.Fprint(w, "data: [DONE]\n\n")
	})
	model, err := workload.New("math", 2)
	if err != nil {
		t.Fatal(err)
	}
	res, err := Bench(context.Background(), BenchConfig{URL: srv.URL, Model: model, Agents: 2, Duration: 1500 * time.Millisecond, Speedup: 1000, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	if res.Errors < 2 || res.Requests < 2*res.Errors-2 {
		t.Fatalf("%d requests and %d errors: want every third refused", res.Requests, res.Errors)
	}
	if !strings.Contains(res.FirstError, "503") || !strings.Contains(res.LastError, "refusal") || res.FirstError == res.LastError {
		t.Fatalf("first error %q, last %q: want two different refusals", res.FirstError, res.LastError)
	}
	if res.FirstErrorAtS <= 0 || res.LastErrorAtS < res.FirstErrorAtS || res.LastErrorAtS > res.DurationSec {
		t.Fatalf("errors at %.3fs and %.3fs of a %.3fs run", res.FirstErrorAtS, res.LastErrorAtS, res.DurationSec)
	}
	// Where the answered prompts' KV came from, and both legs' preemptions.
	k := int64(res.Requests)
	if res.PromptTokens != 100*k || res.GPUHitTokens != 64*k || res.ComputedTokens != 36*k || res.TransferredTokens != 96*k || res.Preemptions != 3*k {
		t.Fatalf("%d requests: prompt %d, GPU hit %d, computed %d, moved %d, preemptions %d", k,
			res.PromptTokens, res.GPUHitTokens, res.ComputedTokens, res.TransferredTokens, res.Preemptions)
	}
	if res.HandedOver < 1 || int64(res.HandedOver) > moved.Load() || res.HandedOver >= res.Requests {
		t.Fatalf("%d of %d requests handed over; the server moved %d", res.HandedOver, res.Requests, moved.Load())
	}
}

// Folding keeps ids below the vocabulary, maps the others below it, the
// same id to the same one, so that shared prefixes stay shared.
func TestFoldVocab(t *testing.T) {
	ids := []uint32{1, 600, 5000, 100000, 131071, 100000}
	if got := FoldVocab(ids, 0); &got[0] != &ids[0] {
		t.Fatal("no vocabulary: the ids were copied")
	}
	got := FoldVocab(ids, 50000)
	if got[0] != 1 || got[1] != 600 || got[2] != 5000 || got[3] != got[5] || ids[3] != 100000 {
		t.Fatalf("folded %v (from %v)", got, ids)
	}
	for _, id := range got {
		if id >= 50000 {
			t.Fatalf("folded %v: %d is not below 50000", got, id)
		}
	}
	if got[3] < tokenizer.FirstHashID || got[4] < tokenizer.FirstHashID {
		t.Fatalf("folded %v onto evolve's special, byte or word ids", got)
	}
}

// Against a model whose vocabulary is smaller than evolve's ids, vLLM
// refuses the prompts: the run says to pass --vocab-size, and with it
// every prompt is taken.
func TestBenchFoldsIDsForASmallVocabulary(t *testing.T) {
	const vocab = 50000
	srv := fakeRouter(t, func() int64 { return 1000000 }, func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Prompt []uint32 `json:"prompt"`
		}
		json.NewDecoder(r.Body).Decode(&req)
		for _, id := range req.Prompt {
			if id >= vocab {
				http.Error(w, fmt.Sprintf(`{"object":"error","message":"Token id %d is out of vocabulary","type":"BadRequestError","code":400}`, id), 400)
				return
			}
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\": [{\"text\": \" baca\"}]}\n\ndata: [DONE]\n\n")
	})
	model, _ := workload.New("coding", 2)
	cfg := BenchConfig{URL: srv.URL, Model: model, Agents: 2, Duration: 500 * time.Millisecond, Speedup: 1000, Seed: 1}
	res, err := Bench(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if res.Errors == 0 || !strings.Contains(res.FirstError, "pass --vocab-size") {
		t.Fatalf("%d errors, first %q: want vLLM's refusal and the way out", res.Errors, res.FirstError)
	}
	cfg.VocabSize = vocab
	if res, err = Bench(context.Background(), cfg); err != nil || res.Errors != 0 || res.Requests == 0 {
		t.Fatalf("with --vocab-size: %v, %d requests, %d errors (%s)", err, res.Requests, res.Errors, res.FirstError)
	}
}

// A model whose context is shorter than the agents' first prompt serves
// nothing: the sessions end as the context is outgrown, are counted as
// such and not as completed, and the agents back off rather than spin. A
// model that takes the first prompts but not the grown ones completes
// each session that was served.
func TestBenchCountsSessionsPastTheContext(t *testing.T) {
	var posts atomic.Int64
	maxLen := atomic.Int64{}
	srv := fakeRouter(t, maxLen.Load, func(w http.ResponseWriter, r *http.Request) {
		posts.Add(1)
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\": [{\"text\": \" baca\"}]}\n\ndata: [DONE]\n\n")
	})
	model, _ := workload.New("coding", 2)
	maxLen.Store(64) // below the shared system prompt
	cfg := BenchConfig{URL: srv.URL, Model: model, Agents: 2, Duration: 1500 * time.Millisecond, Speedup: 1000, Seed: 1}
	res, err := Bench(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if posts.Load() != 0 || res.Sessions != 0 || res.OverContext == 0 || res.OverContext > 2*2 {
		t.Fatalf("%d requests sent, %d sessions completed, %d over the context: want none sent, none completed, and the 2 agents backing off a second between tries",
			posts.Load(), res.Sessions, res.OverContext)
	}

	// A run that has nothing to send stops once every agent has tried
	// twice, not at the end of its ten minutes.
	long := cfg
	long.Agents, long.Duration = 8, 10*time.Minute
	if res, err = Bench(context.Background(), long); err != nil {
		t.Fatal(err)
	}
	if !res.GaveUp || posts.Load() != 0 || res.OverContext < giveUpAfter(8) || res.DurationSec > 60 {
		t.Fatalf("gave up %v after %.1fs, %d sessions over the context, %d sent: want it to give up after %d sessions, with none sent",
			res.GaveUp, res.DurationSec, res.OverContext, posts.Load(), giveUpAfter(8))
	}

	first, _ := model.NewSession(rand.New(rand.NewPCG(1, 1)), 0, 0, 0).Lanes[0].Next()
	maxLen.Store(int64(len(first.Tokens) + 4*first.MaxTokens))
	if res, err = Bench(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	if res.Requests == 0 || res.Sessions == 0 || res.Sessions > res.OverContext || res.GaveUp {
		t.Fatalf("%d requests, %d sessions completed, %d over the context: want every served session to end at the context and count",
			res.Requests, res.Sessions, res.OverContext)
	}
}

// fakeRouter serves one model of max_model_len maxLen() at GET
// /v1/models and answers POST /v1/completions with complete; it closes
// when the test ends.
func fakeRouter(t *testing.T, maxLen func() int64, complete http.HandlerFunc) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == "GET" && r.URL.Path == "/v1/models":
			fmt.Fprintf(w, `{"object": "list", "data": [{"id": "m", "max_model_len": %d}]}`, maxLen())
		case r.Method == "POST" && r.URL.Path == "/v1/completions":
			complete(w, r)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// A request the router asks to retry later (429 or 503 with Retry-After)
// is sent again after the wait, as agents' clients do, and counts as an
// error only once refused maxRetries+1 times; a 503 without Retry-After
// is an error at once.
func TestBenchRetriesWhatTheRouterAsksToRetryLater(t *testing.T) {
	model, err := workload.New("math", 2)
	if err != nil {
		t.Fatal(err)
	}
	answer := func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\": [{\"text\": \"ok\"}]}\n\n")
		fmt.Fprint(w, "data: {\"choices\": [], \"usage\": {\"prompt_tokens\": 10, \"completion_tokens\": 1}}\n\ndata: [DONE]\n\n")
	}
	var n atomic.Int64
	srv := fakeRouter(t, func() int64 { return 1000000 }, func(w http.ResponseWriter, r *http.Request) {
		switch i := n.Add(1); {
		case i == 1:
			w.Header().Set("Retry-After", "0")
			http.Error(w, `{"error": {"code": "rate_limit_exceeded"}}`, http.StatusTooManyRequests)
		case i == 2:
			w.Header().Set("Retry-After", "0")
			http.Error(w, `{"error": {"code": "engine_draining"}}`, http.StatusServiceUnavailable)
		default:
			answer(w)
		}
	})
	res, err := Bench(context.Background(), BenchConfig{URL: srv.URL, Model: model, Agents: 1, Duration: 300 * time.Millisecond, Speedup: 1000, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	if res.Retried != 2 || res.Errors != 0 || res.Requests < 1 {
		t.Fatalf("%d retried, %d errors, %d requests: want the two refusals retried and the call served", res.Retried, res.Errors, res.Requests)
	}

	// An answer that breaks off (its router died while it streamed) is
	// sent again; a stream error event is the server's answer, not sent
	// again.
	var m atomic.Int64
	cuts := fakeRouter(t, func() int64 { return 1000000 }, func(w http.ResponseWriter, r *http.Request) {
		switch i := m.Add(1); {
		case i == 1:
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: {\"choices\": [{\"text\": \"ok\"}]}\n\n")
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler) // the connection drops mid-answer
		case i == 2:
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: {\"error\": {\"message\": \"engine failed\"}}\n\n")
		default:
			answer(w)
		}
	})
	res, err = Bench(context.Background(), BenchConfig{URL: cuts.URL, Model: model, Agents: 1, Duration: 300 * time.Millisecond, Speedup: 1000, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	if res.Cut != 1 || res.Retried != 1 || res.Errors != 1 || !strings.Contains(res.FirstError, "engine failed") || res.Requests < 1 {
		t.Fatalf("%d cut, %d retried, %d errors (first %q), %d requests: want the cut answer sent again, the error event counted", res.Cut, res.Retried, res.Errors, res.FirstError, res.Requests)
	}

	var calls atomic.Int64
	always := fakeRouter(t, func() int64 { return 1000000 }, func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("Retry-After", "0")
		http.Error(w, `{"error": {"code": "rate_limit_exceeded"}}`, http.StatusTooManyRequests)
	})
	res, err = Bench(context.Background(), BenchConfig{URL: always.URL, Model: model, Agents: 1, Duration: 300 * time.Millisecond, Speedup: 1000, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	// (the run may end while a call is being retried: its retries count,
	// its error does not)
	if res.Errors < 1 || res.Retried < maxRetries*res.Errors || res.Retried >= maxRetries*(res.Errors+1) || !strings.Contains(res.FirstError, "refused 5 times") || int(calls.Load()) < (maxRetries+1)*res.Errors {
		t.Fatalf("always refused: %d errors, %d retried, %d calls, first error %q", res.Errors, res.Retried, calls.Load(), res.FirstError)
	}
}
