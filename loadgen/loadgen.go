package loadgen

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/evolvellm/evolve/internal/networds"
	"github.com/evolvellm/evolve/protocol"
	"github.com/evolvellm/evolve/tokenizer"
	"github.com/evolvellm/evolve/workload"
)

// BenchConfig configures a closed-loop load run against an OpenAI-style
// router.
type BenchConfig struct {
	// URL is the router's base URL, e.g. http://127.0.0.1:8000, or
	// several routers' (comma-separated): each session is sent to one of
	// them, and a call that gets no answer or is cut short goes to the
	// next, as a client behind a load balancer sees it.
	URL      string
	Model    workload.Model
	Agents   int
	Duration time.Duration // 0: until ctx ends
	// Speedup divides think and tool times, to match engines that run
	// faster than real time.
	Speedup float64
	Seed    uint64
	// Progress, if set, is called with a snapshot every ProgressEvery.
	Progress      func(Snapshot)
	ProgressEvery time.Duration
	Client        *http.Client
	// Record, if set, receives every call as a trace line.
	Record *workload.TraceWriter
	// APIKey, if set, is sent as a bearer token with every request.
	APIKey string
	// VocabSize, if set, folds the prompts' token ids below it (FoldVocab):
	// a real model served by vLLM refuses ids beyond its vocabulary, and
	// evolve's tokenizer uses ids up to tokenizer.VocabSize.
	VocabSize int
	// Unreachable is how long the router may refuse connections before
	// the run stops early: from the first call that cannot connect, with
	// no answer (of any status) since, until a call fails to connect that
	// long after. 0 or negative: never stop, for a run that should ride
	// out a long router restart (DefaultUnreachable is evolve's default).
	Unreachable time.Duration

	routers []string // URL's routers
}

// DefaultUnreachable is how long a run waits, by default, for a router that
// refuses connections: longer than a router's restart, short enough that a
// dead one does not leave a long run counting errors.
const DefaultUnreachable = 15 * time.Second

// MinVocabSize is the smallest vocabulary FoldVocab folds into: evolve's
// special, byte and output-word ids stay as they are below it.
const MinVocabSize = 8192

// FoldVocab maps ids at or above n into [tokenizer.FirstHashID, n), the same id
// always to the same one, so that prompts that share a prefix still share
// it; ids below n are kept. It returns ids itself when none needs folding.
func FoldVocab(ids []uint32, n int) []uint32 {
	if n <= 0 || n >= tokenizer.VocabSize {
		return ids
	}
	lo := uint32(tokenizer.FirstHashID)
	var out []uint32
	for i, id := range ids {
		if id < uint32(n) {
			if out != nil {
				out[i] = id
			}
			continue
		}
		if out == nil {
			out = make([]uint32, len(ids))
			copy(out, ids[:i])
		}
		out[i] = lo + (id-lo)%(uint32(n)-lo)
	}
	if out == nil {
		return ids
	}
	return out
}

// authorize adds the API key, if any, to a request to the router.
func (cfg BenchConfig) authorize(req *http.Request) {
	if cfg.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+cfg.APIKey)
	}
}

// Result is what a run measured. Latencies are wall seconds as agents saw
// them (multiply by the engines' speedup for modelled time).
type Result struct {
	Workload    string        `json:"workload"`
	Agents      int           `json:"agents"`
	DurationSec float64       `json:"duration_s"`
	Requests    int           `json:"requests_completed"`
	Errors      int           `json:"errors"`
	Sessions    int           `json:"sessions_completed"`
	E2E         workload.Dist `json:"e2e"`
	TTFT        workload.Dist `json:"ttft"`
	ITL         workload.Dist `json:"itl"`
	// LongestGapSec is the longest wait between two tokens of one
	// streamed answer: a stream stalled on a hung engine shows here.
	LongestGapSec float64 `json:"longest_token_gap_s"`
	PromptTokens  int64   `json:"prompt_tokens"`
	OutputTokens  int64   `json:"output_tokens"`
	TokensPerSec  float64 `json:"output_tokens_per_s"`
	CachedTokens  int64   `json:"cached_tokens"`
	// Where the prompts' KV came from, as evolve's engines say: a GPU hit,
	// a host hit or computed on the engine that prefilled it (these three
	// add up to the prompt tokens), and, of those, how many a decode engine
	// then pulled from the prefill engine (as in evolve sim's results).
	GPUHitTokens      int64 `json:"gpu_hit_tokens"`
	HostHitTokens     int64 `json:"host_hit_tokens"`
	TransferredTokens int64 `json:"transferred_tokens"`
	ComputedTokens    int64 `json:"computed_tokens"`
	// Preemptions is how often engines preempted the requests for KV
	// (both legs of a split request): each recomputes what it had, and
	// that recomputation counts in ComputedTokens.
	Preemptions int64 `json:"preemptions"`
	// HandedOver is how many requests' decodes moved to another engine
	// while they streamed (a node switching role or stopping hands its
	// decodes over; a router continues an answer whose engine failed);
	// their answers went on as if nothing had moved.
	HandedOver int `json:"requests_handed_over"`
	// Sessions that ended because their next prompt outgrew the model's
	// context (max_model_len), as agents give up a session then.
	OverContext int `json:"sessions_over_context"`
	// GaveUp says the run stopped before its time because no prompt fits
	// the model's context: giveUpAfter sessions in a row ended at their
	// first call and none was ever sent.
	GaveUp bool `json:"gave_up_over_context,omitempty"`
	// Retried is how often a request was sent again because the server
	// asked to retry later (429 or 503 with Retry-After: an API key at its
	// max-concurrency, an engine draining) or gave no answer at all (a
	// router restarting); a request refused every time is an error.
	Retried int `json:"requests_retried"`
	// Cut is how many of those were sent again because their answer's
	// stream broke off without an error event (the router or its host
	// died while it streamed): the client saw an answer begin and end
	// early, and sends the call again as Claude Code does. The part
	// streamed before the cut is not counted.
	Cut        int `json:"requests_cut_and_resent"`
	MaxContext int `json:"max_model_len,omitempty"`
	// The first and the last failed request: what went wrong and when, in
	// wall seconds from the start (to line them up with a role switch or
	// an engine's log).
	FirstError    string  `json:"first_error,omitempty"`
	FirstErrorAtS float64 `json:"first_error_at_s,omitempty"`
	LastError     string  `json:"last_error,omitempty"`
	LastErrorAtS  float64 `json:"last_error_at_s,omitempty"`
	// RouterGone says the run stopped before its time because the router
	// refused connections for BenchConfig.Unreachable; RouterGoneAtS is
	// when the first call that could not connect failed (wall seconds from
	// the start). What ran until then is measured as usual, and
	// TokensPerSec is over that time.
	RouterGone    bool    `json:"stopped_router_unreachable,omitempty"`
	RouterGoneAtS float64 `json:"router_unreachable_since_s,omitempty"`
}

// Snapshot is the progress of a run so far.
type Snapshot struct {
	Elapsed  time.Duration
	Requests int
	Errors   int
	Sessions int
	// OverContext is how many sessions ended because their next prompt
	// outgrew the model's context.
	OverContext int
	TTFT        workload.Dist // over the last interval
	E2E         workload.Dist // over the last interval
}

// withLimit bounds ctx by d when d is positive.
func withLimit(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if d > 0 {
		return context.WithTimeout(ctx, d)
	}
	return context.WithCancel(ctx)
}

// defaults fills what a run needs and the caller left out.
func (cfg *BenchConfig) defaults() {
	cfg.routers = nil
	for _, u := range strings.Split(cfg.URL, ",") {
		if u = strings.TrimRight(strings.TrimSpace(u), "/"); u != "" {
			cfg.routers = append(cfg.routers, u)
		}
	}
	if cfg.Speedup <= 0 {
		cfg.Speedup = 1
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024}}
	}
	if cfg.ProgressEvery <= 0 {
		cfg.ProgressEvery = 5 * time.Second
	}
}

type collector struct {
	mu              sync.Mutex
	start           time.Time
	record          *workload.TraceWriter
	res             Result
	e2e, ttft, itl  []float64
	winE2E, winTTFT []float64
	maxContext      int
	sent            int                // calls sent so far
	stop            context.CancelFunc // ends the run early
	// When the first call that could not connect failed, since the last
	// answer from the router (zero: it answers).
	unreachableSince time.Time
}

// reached notes that the router answered a call (with any status).
func (c *collector) reached() {
	c.mu.Lock()
	c.unreachableSince = time.Time{}
	c.mu.Unlock()
}

// unreachable notes a call that could not connect to the router, and
// stops the run once calls have failed so for limit with no answer
// between (limit <= 0: never).
func (c *collector) unreachable(limit time.Duration) {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.unreachableSince.IsZero() {
		c.unreachableSince = now
		return
	}
	if limit > 0 && now.Sub(c.unreachableSince) >= limit && !c.res.RouterGone {
		c.res.RouterGone = true
		c.res.RouterGoneAtS = c.unreachableSince.Sub(c.start).Seconds()
		c.stop()
	}
}

// cannotConnect says err is a failure to reach the server at all (no
// connection: refused, no route, an unknown host), not an answer or a
// connection lost mid-call.
func cannotConnect(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// giveUpAfter is how many sessions in a row must end at their first call,
// past the model's context with nothing ever sent, before a run of agents
// agents stops: every agent has tried twice, and the run has a few tries.
func giveUpAfter(agents int) int { return max(2*agents, 8) }

// Bench runs cfg.Agents closed-loop agents until cfg.Duration passes or ctx
// ends, and returns what they measured.
func Bench(ctx context.Context, cfg BenchConfig) (Result, error) {
	if cfg.Agents < 1 || cfg.Model == nil || cfg.URL == "" {
		return Result{}, errors.New("bench needs a URL, a workload and at least one agent")
	}
	cfg.defaults()
	c := &collector{res: Result{Workload: cfg.Model.Name(), Agents: cfg.Agents}, record: cfg.Record}
	model, maxLen, err := serverModel(ctx, cfg)
	if err != nil {
		return Result{}, err
	}
	c.maxContext, c.res.MaxContext = maxLen, maxLen
	ctx, cancel := withLimit(ctx, cfg.Duration)
	defer cancel()
	c.stop = cancel
	start := time.Now()
	c.start = start
	var wg sync.WaitGroup
	for a := 0; a < cfg.Agents; a++ {
		wg.Add(1)
		go func(agent int) {
			defer wg.Done()
			r := rand.New(rand.NewPCG(cfg.Seed, uint64(agent)+1))
			for seq := 0; ctx.Err() == nil; seq++ {
				elapsed := time.Duration(float64(time.Since(start)) * cfg.Speedup)
				s := cfg.Model.NewSession(r, agent, seq, elapsed)
				ok, served := runSession(ctx, cfg, c, model, s)
				if ok && served > 0 {
					// As in evolve sim, a session counts once it was served
					// something: one whose first prompt is past the model's
					// context was never an agent's task done.
					c.mu.Lock()
					c.res.Sessions++
					c.mu.Unlock()
				}
				if served == 0 {
					// Nothing was served (errors, or prompts past the model's
					// context): back off rather than spin.
					select {
					case <-ctx.Done():
					case <-time.After(time.Second):
					}
				}
			}
		}(a)
	}
	return c.wait(&wg, cfg, start), nil
}

// wait reports progress until the agents are done, then the result.
func (c *collector) wait(wg *sync.WaitGroup, cfg BenchConfig, start time.Time) Result {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	tick := time.NewTicker(cfg.ProgressEvery)
	defer tick.Stop()
	for {
		select {
		case <-done:
			c.mu.Lock()
			defer c.mu.Unlock()
			res := c.res
			res.DurationSec = time.Since(start).Seconds()
			res.E2E, res.TTFT, res.ITL = workload.Summarize(c.e2e), workload.Summarize(c.ttft), workload.Summarize(c.itl)
			span := res.DurationSec
			if res.RouterGone {
				span = res.RouterGoneAtS // the time after served nothing
			}
			if span > 0 {
				res.TokensPerSec = float64(res.OutputTokens) / span
			}
			return res
		case <-tick.C:
			if cfg.Progress != nil {
				c.mu.Lock()
				snap := Snapshot{Elapsed: time.Since(start), Requests: c.res.Requests, Errors: c.res.Errors, Sessions: c.res.Sessions,
					OverContext: c.res.OverContext, TTFT: workload.Summarize(c.winTTFT), E2E: workload.Summarize(c.winE2E)}
				c.winE2E, c.winTTFT = c.winE2E[:0], c.winTTFT[:0]
				c.mu.Unlock()
				cfg.Progress(snap)
			}
		}
	}
}

// ReplayConfig configures an open-loop trace replay.
type ReplayConfig struct {
	BenchConfig
	Records []workload.TraceRecord
	// Playback divides the trace's timestamps: 60 replays an hour in a
	// minute.
	Playback float64
}

// Replay sends every record of a trace at its (scaled) time, without
// waiting for earlier answers, and returns what it measured. Records whose
// prompt does not fit the served model's context are skipped and counted.
func Replay(ctx context.Context, cfg ReplayConfig) (Result, int, error) {
	if cfg.URL == "" || len(cfg.Records) == 0 {
		return Result{}, 0, errors.New("replay needs a URL and a non-empty trace")
	}
	if cfg.Playback <= 0 {
		cfg.Playback = 1
	}
	cfg.defaults()
	model, maxLen, err := serverModel(ctx, cfg.BenchConfig)
	if err != nil {
		return Result{}, 0, err
	}
	c := &collector{res: Result{Workload: "trace", Agents: 0}, maxContext: maxLen}
	ctx, cancel := withLimit(ctx, cfg.Duration)
	defer cancel()
	c.stop = cancel
	start := time.Now()
	c.start = start
	var wg sync.WaitGroup
	skipped := 0
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range cfg.Records {
			rec := &cfg.Records[i]
			at := start.Add(rec.At(cfg.Playback))
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Until(at)):
			}
			out := rec.OutputLength
			if maxLen > 0 && rec.InputLength+out > maxLen {
				if rec.InputLength >= maxLen {
					skipped++
					continue
				}
				out = maxLen - rec.InputLength
			}
			call := workload.Call{Session: rec.Session, Branch: rec.Branch, Parent: rec.Parent, Rewrite: rec.Rewrite, Tokens: rec.Tokens(), MaxTokens: out}
			wg.Add(1)
			go func() {
				defer wg.Done()
				c.send(ctx, cfg.BenchConfig, model, call)
			}()
		}
	}()
	res := c.wait(&wg, cfg.BenchConfig, start)
	return res, skipped, nil
}

// router is the router a session's try-th attempt at a call goes to.
func (cfg BenchConfig) router(session string, try int) string {
	if len(cfg.routers) == 0 {
		return cfg.URL
	}
	h := fnv.New32a()
	h.Write([]byte(session))
	return cfg.routers[(int(h.Sum32()%uint32(len(cfg.routers)))+try)%len(cfg.routers)]
}

// serverModel asks the routers which model they serve and its context
// limit: the first that answers says.
func serverModel(ctx context.Context, cfg BenchConfig) (string, int, error) {
	var firstErr error
	for _, r := range cfg.routers {
		one := cfg
		one.URL = r
		model, maxLen, err := routerModel(ctx, one)
		if err == nil {
			return model, maxLen, nil
		}
		if firstErr == nil {
			firstErr = err
		}
	}
	if firstErr == nil {
		return routerModel(ctx, cfg)
	}
	return "", 0, firstErr
}

// routerModel asks the router cfg.URL which model it serves and its
// context limit.
// unreachableError is a router that could not be reached, said in words
// (the cause, not Go's text of the dial), wrapping the cause.
type unreachableError struct {
	url string
	err error
}

func (e *unreachableError) Error() string {
	return fmt.Sprintf("cannot reach a router at %s: %s (is a cluster up? evolve's router is the orchestrator's --router-addr, :8000 by default)",
		e.url, networds.Cause(e.err))
}

func (e *unreachableError) Unwrap() error { return e.err }

func routerModel(ctx context.Context, cfg BenchConfig) (string, int, error) {
	req, _ := http.NewRequestWithContext(ctx, "GET", cfg.URL+"/v1/models", nil)
	cfg.authorize(req)
	resp, err := cfg.Client.Do(req)
	var ve *tls.CertificateVerificationError
	if errors.As(err, &ve) {
		return "", 0, fmt.Errorf("the router at %s has a certificate not trusted here, or one that does not name this address (trust a private CA's with SSL_CERT_FILE=ca.pem): %w", cfg.URL, err)
	}
	if err != nil {
		return "", 0, &unreachableError{url: cfg.URL, err: err}
	}
	defer resp.Body.Close()
	var out struct {
		Data []struct {
			ID          string `json:"id"`
			MaxModelLen int    `json:"max_model_len"`
		} `json:"data"`
	}
	notRouter := func(what string) error {
		return fmt.Errorf("%s answered GET /v1/models with %s: is it an OpenAI-compatible router? (evolve's is the orchestrator's --router-addr, :8000 by default)", cfg.URL, what)
	}
	if resp.StatusCode == http.StatusUnauthorized && strings.Contains(resp.Header.Get("WWW-Authenticate"), `realm="`+protocol.ControlRealm+`"`) {
		return "", 0, fmt.Errorf("%s is evolve's control API, not its router: bench the orchestrator's --router-addr (:8000 by default; 'evolve status' shows it)", cfg.URL)
	}
	if resp.StatusCode == http.StatusUnauthorized {
		if cfg.APIKey == "" {
			return "", 0, fmt.Errorf("%s wants an API key: pass one with --api-key", cfg.URL)
		}
		return "", 0, fmt.Errorf("%s refused the API key given", cfg.URL)
	}
	if resp.StatusCode != http.StatusOK {
		return "", 0, notRouter(resp.Status)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&out); err != nil {
		return "", 0, notRouter("something other than a model list")
	}
	if len(out.Data) == 0 {
		return "", 0, fmt.Errorf("%s serves no model yet (no engine has registered)", cfg.URL)
	}
	return out.Data[0].ID, out.Data[0].MaxModelLen, nil
}

// runSession runs a session's lanes concurrently; it reports whether the
// session ended normally (not cut short by the run's end) and how many of
// its requests were answered.
func runSession(ctx context.Context, cfg BenchConfig, c *collector, model string, s *workload.Session) (bool, int) {
	var mu sync.Mutex // lanes share the session's random source
	var wg sync.WaitGroup
	ok, served, overContext := true, 0, false
	var okMu sync.Mutex
	for _, lane := range s.Lanes {
		wg.Add(1)
		go func(l workload.Lane) {
			defer wg.Done()
			for {
				mu.Lock()
				call, more := l.Next()
				mu.Unlock()
				if !more {
					return
				}
				if call.Think > 0 {
					select {
					case <-ctx.Done():
						okMu.Lock()
						ok = false
						okMu.Unlock()
						return
					case <-time.After(time.Duration(float64(call.Think) / cfg.Speedup)):
					}
				}
				if c.maxContext > 0 && len(call.Tokens)+call.MaxTokens > c.maxContext {
					// The context outgrew the model: the agent gives up the session.
					if len(call.Tokens) >= c.maxContext {
						okMu.Lock()
						overContext = true
						okMu.Unlock()
						return
					}
					call.MaxTokens = c.maxContext - len(call.Tokens)
				}
				if c.record != nil {
					c.mu.Lock()
					c.record.Write(float64(time.Since(c.start).Microseconds())/1000*cfg.Speedup, call)
					c.mu.Unlock()
				}
				out, err := c.send(ctx, cfg, model, call)
				if err != nil {
					okMu.Lock()
					ok = false
					okMu.Unlock()
					if ctx.Err() != nil {
						return
					}
					time.Sleep(100 * time.Millisecond)
					return
				}
				okMu.Lock()
				served++
				okMu.Unlock()
				mu.Lock()
				l.Answer(out)
				mu.Unlock()
			}
		}(lane)
	}
	wg.Wait()
	if overContext {
		c.mu.Lock()
		c.res.OverContext++ // once per session, whichever lanes outgrew
		if c.sent == 0 && c.res.OverContext >= giveUpAfter(cfg.Agents) {
			// No prompt of this workload fits: waiting out the run's
			// time would only print empty progress lines.
			c.res.GaveUp = true
			c.stop()
		}
		c.mu.Unlock()
	}
	if s.ID != "" {
		endSession(cfg, s.ID)
	}
	return ok && ctx.Err() == nil, served
}

// endSession tells an evolve router that the agent is done with a session
// (its context can go first); other servers answer 404, which is fine.
func endSession(cfg BenchConfig, session string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "DELETE", cfg.router(session, 0)+"/v1/sessions/"+url.PathEscape(session), nil)
	if err != nil {
		return
	}
	cfg.authorize(req)
	if resp, err := cfg.Client.Do(req); err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

// maxRetries is how often a call the server asks to retry later (429 or
// 503 with Retry-After) is sent again before it counts as an error; each
// wait is the server's Retry-After, at most maxRetryWait.
const (
	maxRetries   = 4
	maxRetryWait = 30 * time.Second
)

// retryLater is a refusal that says when to come back.
type retryLater struct {
	wait time.Duration
	err  error
}

func (r *retryLater) Error() string { return r.err.Error() }

// retryAfter reads a 429's or 503's Retry-After (seconds; a date or
// nonsense reads as a second).
func retryAfter(resp *http.Response) (time.Duration, bool) {
	if resp.StatusCode != http.StatusTooManyRequests && resp.StatusCode != http.StatusServiceUnavailable {
		return 0, false
	}
	v := resp.Header.Get("Retry-After")
	if v == "" {
		return 0, false
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		n = 1
	}
	return min(time.Duration(n)*time.Second, maxRetryWait), true
}

// noAnswer is a call that got no answer at all: it could not connect, or
// its connection ended before the answer's headers.
type noAnswer struct{ err error }

func (n *noAnswer) Error() string { return n.err.Error() }

// cutShort is a call whose answer began and broke off without an error
// event: the connection to the router was lost while it streamed.
type cutShort struct{ err error }

func (c *cutShort) Error() string { return c.err.Error() }

// noAnswerWait is the pause before a call that got no answer is sent
// again the try-th time (from 0), as the SDKs back off: 0.5 s, doubling
// up to 8 s.
func noAnswerWait(try int) time.Duration { return min(500*time.Millisecond<<try, 8*time.Second) }

// send sends a call, and again while the server asks to retry later,
// gives no answer at all or cuts its answer short (up to maxRetries
// times), as an agent's client would; a call still refused then is an
// error.
func (c *collector) send(ctx context.Context, cfg BenchConfig, model string, call workload.Call) ([]uint32, error) {
	hops := 0 // a call that got no answer, or was cut short, goes to the next router (with several)
	for try := 0; ; try++ {
		out, err := c.request(ctx, cfg, cfg.router(call.Session, hops), model, call)
		var rl *retryLater
		var na *noAnswer
		var cut *cutShort
		switch {
		case errors.As(err, &na):
			if try == maxRetries {
				return nil, c.fail(ctx, fmt.Errorf("%w (no answer %d times)", na.err, try+1))
			}
			rl = &retryLater{wait: noAnswerWait(try), err: na.err}
			hops++
		case errors.As(err, &cut):
			if try == maxRetries {
				return nil, c.fail(ctx, fmt.Errorf("%w (cut short %d times)", cut.err, try+1))
			}
			rl = &retryLater{wait: noAnswerWait(try), err: cut.err}
			hops++
			c.mu.Lock()
			c.res.Cut++
			c.mu.Unlock()
		case !errors.As(err, &rl):
			return out, err
		}
		if try == maxRetries {
			return nil, c.fail(ctx, fmt.Errorf("%w (refused %d times, each after its Retry-After)", rl.err, try+1))
		}
		c.mu.Lock()
		c.res.Retried++
		c.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(rl.wait):
		}
	}
}

// request sends one call, streamed, and records what it measured.
func (c *collector) request(ctx context.Context, cfg BenchConfig, router, model string, call workload.Call) ([]uint32, error) {
	body, _ := json.Marshal(map[string]any{
		// ignore_eos: the answer is as long as the workload drew it, on
		// evolve's engines as on vLLM's, not where the model would stop.
		"model": model, "prompt": FoldVocab(call.Tokens, cfg.VocabSize), "max_tokens": call.MaxTokens, "ignore_eos": true, "stream": true,
		"stream_options": map[string]any{"include_usage": true},
	})
	req, err := http.NewRequestWithContext(ctx, "POST", router+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	cfg.authorize(req)
	req.Header.Set(protocol.HeaderSession, call.Session)
	req.Header.Set(protocol.HeaderBranch, call.Branch)
	if call.Parent != "" {
		req.Header.Set(protocol.HeaderParentBranch, call.Parent)
	}
	if call.Rewrite {
		req.Header.Set(protocol.HeaderRewrite, "true")
	}
	c.mu.Lock()
	c.sent++
	c.mu.Unlock()
	start := time.Now()
	resp, err := cfg.Client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, err
		}
		if cannotConnect(err) {
			c.unreachable(cfg.Unreachable)
		}
		// No answer began (a router restarting, a connection cut before
		// the headers): OpenAI's and Anthropic's clients send it again.
		return nil, &noAnswer{err}
	}
	c.reached()
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		msg := strings.TrimSpace(string(b))
		if wait, ok := retryAfter(resp); ok {
			// Come back later, the server says (an API key at its
			// limit, an engine draining): the caller waits and retries,
			// as OpenAI's and Anthropic's clients do.
			return nil, &retryLater{wait: wait, err: fmt.Errorf("%s: %s", resp.Status, msg)}
		}
		if strings.Contains(msg, "out of vocabulary") {
			// vLLM's refusal of an id its model does not have.
			msg += " (the model's vocabulary is smaller than evolve's token ids: pass --vocab-size, the vocab_size of the model's config.json)"
		}
		return nil, c.fail(ctx, fmt.Errorf("%s: %s", resp.Status, msg))
	}
	var text strings.Builder
	var first, last time.Time
	var usage struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	}
	var ext kvSource
	var gap time.Duration // the longest wait between two of its tokens
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	done := false
	gotText := func(t []byte) {
		if len(t) == 0 {
			return
		}
		now := time.Now()
		if first.IsZero() {
			first = now
		} else {
			gap = max(gap, now.Sub(last))
		}
		last = now
		text.Write(t)
	}
	for sc.Scan() {
		line, ok := bytes.CutPrefix(sc.Bytes(), []byte("data: "))
		if !ok {
			continue
		}
		if string(line) == "[DONE]" {
			done = true
			break
		}
		if tok, ok := tokenText(line); ok {
			gotText(tok)
			continue
		}
		var chunk struct {
			Choices []struct {
				Text string `json:"text"`
			} `json:"choices"`
			Usage  *json.RawMessage `json:"usage"`
			Error  *json.RawMessage `json:"error"`
			Evolve *struct {
				kvSource
				Prefill *kvSource `json:"prefill"` // added by evolve's router
			} `json:"evolve"`
		}
		if err := json.Unmarshal(line, &chunk); err != nil {
			continue
		}
		if chunk.Error != nil {
			return nil, c.fail(ctx, fmt.Errorf("stream error: %s", *chunk.Error))
		}
		if len(chunk.Choices) > 0 {
			gotText([]byte(chunk.Choices[0].Text))
		}
		if chunk.Usage != nil {
			json.Unmarshal(*chunk.Usage, &usage)
		}
		if chunk.Evolve != nil {
			ext = chunk.Evolve.kvSource
			if pre := chunk.Evolve.Prefill; pre != nil {
				// Split between a prefill and a decode engine: the
				// prefill engine found or computed the prompt's KV; the
				// decode leg's transferred tokens are the handoff, as
				// evolve sim counts them.
				ext.GPU, ext.Host, ext.Computed = pre.GPU, pre.Host, pre.Computed
				ext.Preemptions += pre.Preemptions
			}
		}
	}
	if !done {
		err := sc.Err()
		if err == nil {
			err = io.ErrUnexpectedEOF
		}
		err = fmt.Errorf("stream ended early: %w", err)
		if ctx.Err() != nil || errors.Is(err, bufio.ErrTooLong) {
			return nil, c.fail(ctx, err)
		}
		// The answer broke off (its router died while it streamed): an
		// agent's client sends the call again.
		return nil, &cutShort{err}
	}
	end := time.Now()
	out := tokenizer.Encode(text.String())
	c.mu.Lock()
	defer c.mu.Unlock()
	r := &c.res
	r.Requests++
	r.PromptTokens += int64(usage.PromptTokens)
	r.OutputTokens += int64(usage.CompletionTokens)
	r.CachedTokens += int64(usage.PromptTokensDetails.CachedTokens)
	r.GPUHitTokens += ext.GPU
	r.HostHitTokens += ext.Host
	r.TransferredTokens += ext.Transferred
	r.ComputedTokens += ext.Computed
	r.Preemptions += ext.Preemptions
	r.LongestGapSec = max(r.LongestGapSec, secs(gap))
	if ext.HandedOver > 0 {
		r.HandedOver++
	}
	e2e := secs(end.Sub(start))
	c.e2e = append(c.e2e, e2e)
	c.winE2E = append(c.winE2E, e2e)
	if !first.IsZero() {
		t := secs(first.Sub(start))
		c.ttft = append(c.ttft, t)
		c.winTTFT = append(c.winTTFT, t)
		if n := usage.CompletionTokens; n > 1 {
			c.itl = append(c.itl, secs(last.Sub(first))/float64(n-1))
		}
	}
	return out, nil
}

func (c *collector) fail(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return err // the run ended; not the server's fault
	}
	c.mu.Lock()
	at := time.Since(c.start).Seconds()
	if c.res.Errors == 0 {
		c.res.FirstError, c.res.FirstErrorAtS = err.Error(), at
	}
	c.res.Errors++
	c.res.LastError, c.res.LastErrorAtS = err.Error(), at
	c.mu.Unlock()
	return err
}

// kvSource is where a prompt's KV came from, as an engine's "evolve"
// object says (protocol.ResponseKV).
type kvSource struct {
	GPU         int64 `json:"gpu_hit_tokens"`
	Host        int64 `json:"host_hit_tokens"`
	Transferred int64 `json:"transferred_tokens"`
	Computed    int64 `json:"computed_tokens"`
	Preemptions int64 `json:"preemptions"`
	HandedOver  int   `json:"handed_over"`
}

func secs(d time.Duration) float64 { return d.Seconds() }
