package orchestrator

// The front door: how the router serves one request.
//
//	read body      bounded, with a large-body budget (largebodies.go)
//	  |            cheap checks first: parse, context length, sampling limits
//	route          tokenize, hash the prompt into blocks, match the KV
//	  |            directory, pick nodes (routing.Policy); start KV fetches
//	attempt.run    one attempt per routing, at most maxAttempts before the
//	  |            client has a byte
//	  |-- split:   prefill leg on the prefill node (it computes the prompt's
//	  |            KV and holds it), then the decode leg on the decode node,
//	  |            which pulls the held KV (kv_transfer_params)
//	  '-- whole:   one leg on one node
//	relay          the decode leg's answer streamed to the client (legs.go);
//	               its engine names each token it samples (token comments)
//	goOn           the leg ended before the answer did (continuation.go):
//	                 handover: the node was switching role: moveOn
//	                 failure:  the engine died or stalled: resume
//	               either way the answer goes on on another node, in the
//	               same stream, with the same id; vLLM engines: vllmresume.go
//
// An attempt's phase says how far the answer has come (routed, prefilled,
// first token out: it only advances); clientHasBytes, set once the client
// has any byte of an answer or of an error, ends retries in any phase.
//
// Glossary (one spelling each):
//   - leg: one HTTP request the router sends an engine for a client's
//     request: a prefill leg, a decode leg, or a whole one.
//   - hold: the KV a prefill leg computed, kept by its engine until the
//     decode leg pulls it (or releaseHold frees it, or it times out).
//   - claim: a node counted as busy with this request (in-flight), taken
//     when routed or when chosen to go on (claimPeer, claimResumer),
//     released when the leg ends.
//   - handover: a decode node that switches role ends its answers with a
//     HandOver (the KV to pull and the output so far) instead of the rest.
//   - continuation: the client's request sent again with evolve_resume,
//     so that another node writes the rest of the answer; moveOn sends it
//     after a handover.
//   - resume: a continuation after a failure: the new node pulls or
//     recomputes the KV of the prompt and the output so far.

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/evolvellm/evolve/anthropicapi"
	"github.com/evolvellm/evolve/kv"
	"github.com/evolvellm/evolve/openaiapi"
	"github.com/evolvellm/evolve/orchestrator/apikeys"
	"github.com/evolvellm/evolve/orchestrator/routing"
	"github.com/evolvellm/evolve/protocol"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// maxAttempts bounds how often a request is routed again when its engine
// fails before the first byte reaches the client.
const maxAttempts = 3

// routerHandler serves the OpenAI API to agents.
func (o *Orchestrator) routerHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) { o.serveGenerate(w, r, false) })
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) { o.serveGenerate(w, r, true) })
	mux.HandleFunc("POST /v1/messages", o.serveMessages)
	mux.HandleFunc("POST /v1/responses", o.serveResponses)
	mux.HandleFunc("GET /v1/responses/{id}", o.serveStoredResponse)
	mux.HandleFunc("DELETE /v1/responses/{id}", o.serveStoredResponse)
	mux.HandleFunc("POST /v1/responses/{id}/cancel", o.serveStoredResponse)
	mux.HandleFunc("GET /v1/responses/{id}/input_items", o.serveStoredResponse)
	mux.HandleFunc("POST /v1/messages/count_tokens", o.serveCountTokens)
	mux.HandleFunc("GET /v1/models", o.serveModels)
	mux.HandleFunc("GET /v1/models/{model...}", o.serveModel)
	mux.HandleFunc("DELETE /v1/sessions/{session}", o.serveEndSession)
	mux.HandleFunc("DELETE /v1/sessions/{session}/branches/{branch}", o.serveEndSession)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		openaiapi.WriteJSON(w, 200, map[string]any{"status": "ok", "serving_nodes": o.servingNodes()})
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(o.met.reg, promhttp.HandlerOpts{}))
	// Clients check the base URL they were given (Claude Code sends HEAD /).
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		openaiapi.WriteJSON(w, 200, map[string]any{"service": "evolve router", "api": []string{"/v1/completions", "/v1/chat/completions", "/v1/messages", "/v1/responses", "/v1/models"}})
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if allow := routerMethods(r.URL.Path); allow != "" {
			w.Header().Set("Allow", allow)
			writeShaped(w, r, &openaiapi.Error{Status: http.StatusMethodNotAllowed, Type: "invalid_request_error",
				Message: fmt.Sprintf("%s takes %s, not %s", r.URL.Path, allow, r.Method)})
			return
		}
		msg := fmt.Sprintf("no route %s %s", r.Method, r.URL.Path)
		if strings.HasPrefix(r.URL.Path, "/api/") {
			// An operator's command pointed at the wrong port.
			msg += ": this is evolve's router (the OpenAI API); the control API is served on the orchestrator's control address (--control-addr)"
		}
		writeShaped(w, r, &openaiapi.Error{Status: 404, Type: "invalid_request_error", Message: msg})
	})
	return o.countInFlight(o.logFailures(o.requireKey(o.trackBodies(mux))))
}

// routerMethods is the methods the router serves path with ("" for a
// path it does not serve), for a 405's Allow.
func routerMethods(path string) string {
	switch {
	case path == "/v1/completions", path == "/v1/chat/completions", path == "/v1/messages", path == "/v1/messages/count_tokens",
		path == "/v1/responses":
		return "POST"
	case path == "/", path == "/v1/models", strings.HasPrefix(path, "/v1/models/"), path == "/health", path == "/metrics":
		return "GET"
	case strings.HasPrefix(path, "/v1/sessions/"):
		return "DELETE"
	}
	return ""
}

// checkLengths refuses, before any routing, a request no engine can
// serve, in vLLM's words (openaiapi.ContextTooLong, OutputTooLong): a
// prompt of maxLen tokens or more, or max tokens asked for that do not fit
// beside the prompt (maxLen 0: not known yet). Checked here, a huge prompt
// costs no hashing, matching or engine's time. Max tokens the client did
// not ask for (the default) are the engine's to fit.
func checkLengths(p *openaiapi.Parsed, maxLen int) *openaiapi.Error {
	if maxLen <= 0 {
		return nil
	}
	if p.Tokens == nil {
		return nil // the engine tokenizes it: checked again then
	}
	asked := p.Req.MaxTokens != nil || p.Req.MaxCompletionTokens != nil
	if len(p.Tokens) >= maxLen {
		return openaiapi.ContextTooLong(maxLen, len(p.Tokens))
	}
	if asked && p.MaxTokens > maxLen-len(p.Tokens) {
		return openaiapi.OutputTooLong(maxLen, len(p.Tokens), p.MaxTokens)
	}
	return nil
}

// countInFlight keeps the number of answers the router is writing
// (evolve_router_in_flight; what a shutdown waits for).
func (o *Orchestrator) countInFlight(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if apikeys.LimitedPath(r) {
			o.inFlight.Add(1)
			defer o.inFlight.Add(-1)
		}
		h.ServeHTTP(w, r)
	})
}

func (o *Orchestrator) servingNodes() int {
	o.c.mu.Lock()
	defer o.c.mu.Unlock()
	n := 0
	for _, x := range o.c.nodes {
		if x.state == StateServing {
			n++
		}
	}
	return n
}

// anthropicClient says whether r comes from a client of Anthropic's API
// (its SDKs send anthropic-version).
func anthropicClient(r *http.Request) bool { return r.Header.Get("anthropic-version") != "" }

// serveModels lists the served model, in OpenAI's shape or, for a client
// of Anthropic's API, in Anthropic's.
func (o *Orchestrator) serveModels(w http.ResponseWriter, r *http.Request) {
	model, maxLen := o.servedModel()
	anthropic := anthropicClient(r)
	data := []any{}
	if model != "" {
		data = append(data, o.modelInfo(model, maxLen, anthropic))
		for _, a := range o.literalAliases() {
			data = append(data, o.modelInfo(a, maxLen, anthropic))
		}
	}
	if anthropic {
		first, last := any(nil), any(nil)
		if model != "" {
			first, last = model, model
		}
		openaiapi.WriteJSON(w, 200, map[string]any{"data": data, "has_more": false, "first_id": first, "last_id": last})
		return
	}
	openaiapi.WriteJSON(w, 200, map[string]any{"object": "list", "data": data})
}

// serveModel describes one model (GET /v1/models/{model}), in either shape.
func (o *Orchestrator) serveModel(w http.ResponseWriter, r *http.Request) {
	model, maxLen := o.servedModel()
	anthropic := anthropicClient(r)
	id := r.PathValue("model")
	if model == "" || !o.resolveModel(id, model) {
		e := o.unknownModel(id, model)
		if anthropic {
			anthropicapi.NewError(e.Status, e.Message).Write(w)
		} else {
			e.Write(w)
		}
		return
	}
	openaiapi.WriteJSON(w, 200, o.modelInfo(id, maxLen, anthropic))
}

// servedModel is the model the cluster serves ("" before any engine
// registered) and the longest context an engine takes.
func (o *Orchestrator) servedModel() (string, int) {
	o.c.mu.Lock()
	defer o.c.mu.Unlock()
	// The shortest context of the engines that serve the model: any of
	// them may get the request. A rejected or down engine (another
	// model, a longer context) says nothing of what the cluster takes.
	serving, any := 0, 0
	for _, n := range o.c.nodes {
		if n.reg.Model != o.model || n.reg.MaxModelLen <= 0 {
			continue
		}
		any = max(any, n.reg.MaxModelLen)
		if n.state == StateServing || n.state == StateSwitching || n.state == StateDraining {
			if serving == 0 || n.reg.MaxModelLen < serving {
				serving = n.reg.MaxModelLen
			}
		}
	}
	if serving > 0 {
		return o.model, serving
	}
	return o.model, any
}

func (o *Orchestrator) modelInfo(model string, maxLen int, anthropic bool) map[string]any {
	if anthropic {
		return map[string]any{"type": "model", "id": model, "display_name": model,
			"created_at": o.started.UTC().Format(time.RFC3339), "max_input_tokens": maxLen}
	}
	return map[string]any{"id": model, "object": "model", "created": o.started.Unix(), "owned_by": "evolve", "max_model_len": maxLen}
}

// view builds the router's view of the cluster and matches chain against
// the directory, leaving out nodes in exclude.
func (o *Orchestrator) view(chain []kv.BlockHash, m *kv.Match, exclude map[string]bool) *routing.View {
	o.c.mu.Lock()
	defer o.c.mu.Unlock()
	v := &routing.View{BlockSize: o.blockSize, Nodes: make([]routing.Node, 0, len(o.c.nodes))}
	for id, n := range o.c.nodes {
		blockBytes := float64(n.reg.BlockSize * n.reg.KVBytesPerToken)
		rn := routing.Node{
			ID: id, Dir: n.dir, Role: n.role, Serving: n.state == StateServing && !exclude[id],
			Running: n.hb.Running, Waiting: n.hb.Waiting, MaxSeqs: n.reg.MaxNumSeqs, MaxBatchedTokens: n.reg.MaxNumBatchedTokens,
			GPUBlocks: n.reg.GPUBlocks, GPUBlocksUse: int(n.hb.GPUKVUsage * float64(n.reg.GPUBlocks)),
			PrefillSecPerToken: n.reg.PrefillUsPerToken * 1e-6, SelfManagedKV: n.reg.SelfManagedKV,
		}
		if sec := o.learnedPrefillSec(n.reg.Speedup); sec > 0 {
			rn.PrefillSecPerToken = sec // learned beats the profile's hint
		}
		if n.reg.HostGBps > 0 {
			rn.HostSecPerBlock = blockBytes / (n.reg.HostGBps * 1e9)
		}
		if n.reg.NetworkGBps > 0 {
			rn.NetSecPerBlock = blockBytes / (n.reg.NetworkGBps * 1e9)
		}
		v.Nodes = append(v.Nodes, rn)
	}
	o.c.dir.Match(chain, m)
	return v
}

// attempt is one try at serving a request on the nodes a decision named.
type attempt struct {
	o *Orchestrator
	attemptRequest
	attemptProgress
	attemptAnswer
	attemptMoves
}

// attemptRequest is what the attempt serves: the client's request, as
// parsed and as the legs get it, and where it was routed.
type attemptRequest struct {
	w       http.ResponseWriter
	r       *http.Request
	p       *openaiapi.Parsed
	body    openaiapi.Body // the body evolve's engines get (legBody)
	client  openaiapi.Body // the client's, re-sent to vLLM engines
	path    string
	reqID   string
	dec     routing.Decision
	urls    map[string]string
	arrival time.Time
	chain   []kv.BlockHash // the prompt's blocks
	bs      int            // the cluster's block size
	// reuse: what the request's first placement knew, for its lost KV
	// reuse; shared by its attempts, emptied once counted (never twice).
	reuse *kv.PlacedReuse
	// legPath is the path legs are sent to when not the client's (a
	// vLLM continuation's completions).
	legPath string
}

// attemptProgress is how far the request has gone.
type attemptProgress struct {
	phase phase
	// clientHasBytes: the client has bytes of the answer (or of an
	// error answer, which may come in any phase): no more retries.
	clientHasBytes bool
	legAnswered    bool // the current leg sent its first byte
	// prefillFreed: the prefill node's in-flight count no longer has
	// this split request (freePrefill), or never had it apart from the
	// decode's (a request served whole on one node).
	prefillFreed bool
	// prefillKV: the prefill leg's "evolve" object, added to the decode
	// leg's answer (protocol.ResponseKV.Prefill).
	prefillKV json.RawMessage
	firstAt   time.Time // when the first token left for the client
	// prefillCached is the prompt tokens a split request's prefill leg
	// found cached (-1: none told yet), and placedCached those the router
	// placed the request by (the directory's match and its fetches): what
	// the answer's usage reports cached (cachedusage.go).
	prefillCached, placedCached int
}

// attemptAnswer is the answer the client has read so far: with it the
// answer can go on elsewhere if its engine fails.
type attemptAnswer struct {
	// outTokens: output tokens the client got, from the answer's usage
	// or, in a stream without usage, one per content chunk.
	outTokens int
	// out is the output the client has read in its stream, as its
	// engines named it (protocol.TokenComment), and sampler the state of
	// the output stream after it; answerID and created are the answer's.
	out      []uint32
	outLost  bool // a token comment could not be read: out is incomplete
	sampler  uint64
	answerID string
	created  int64
	// finish is the answer's finish reason, and toolCalls the calls of
	// tools it made, as its engine said (for the recording).
	finish    string
	toolCalls int
	// vllm is set while a vLLM engine streams the answer: the token ids
	// it names, with which another can go on (vllmresume.go).
	vllm *vllmStream
}

// phase is how far a request's answer has come, in order; it only
// advances.
type phase uint8

const (
	// phaseRouted: placed on its nodes; its prompt is being prefilled.
	phaseRouted phase = iota
	// phasePrefilled: its prefill is over, and the routing policy was
	// told (its queued prefill work leaves the node's bookkeeping).
	phasePrefilled
	// phaseFirstToken: the first token is on its way to the client (its
	// time to first token is observed); the rest streams.
	phaseFirstToken
)

// attemptMoves is where the answer is decoded now and how it got there:
// handovers, resumes and the nodes that failed it.
type attemptMoves struct {
	// decode is the node decoding the request now: dec.Decode until a
	// switching node hands the request over (moveOn), then its peer.
	decode string
	// leaving is the node that handed the request over; its claim ends
	// when the peer answers (the peer has pulled the KV by then).
	leaving string
	// handOver is the continuation the last leg ended with, if it moved.
	handOver *protocol.HandOver
	moves    int             // handovers so far
	resumes  int             // times the answer went on after its engine failed or no peer took it
	resuming string          // why the current leg continues the answer (resume), until it answers
	failed   map[string]bool // nodes that failed this answer mid-way or refused to continue it
	// interruptedOn is the node that last failed mid-stream.
	interruptedOn string
	// stayURL is a node sent the answer with protocol.HandOverNever.
	stayURL string
	// resumePrefillNode computed and holds, under resumePrefillKV, the
	// KV a resumed answer's decode leg pulls (resumePrefill); its claim
	// ends when that leg answers or ends.
	resumePrefillNode string
	resumePrefillKV   json.RawMessage
}

var reqCounter atomic.Uint64

func (o *Orchestrator) serveGenerate(w http.ResponseWriter, r *http.Request, chat bool) {
	arrival := time.Now()
	r = o.tracing(r)
	reqID := o.requestID(r)
	w.Header().Set("X-Request-Id", reqID) // on every answer, refusals too: the log names it
	body, status, err := readRequestBody(w, r)
	if err != nil {
		o.countRequest(r, "bad_request")
		(&openaiapi.Error{Status: status, Type: "invalid_request_error", Message: err.Error()}).Write(w)
		return
	}
	_, maxLen := o.servedModel()
	p, rb, perr := o.parseRequest(body, chat, maxLen)
	if perr != nil {
		o.countRequest(r, "bad_request")
		perr.Write(w)
		return
	}
	o.c.mu.Lock()
	model, bs := o.model, o.blockSize
	o.c.mu.Unlock()
	if bs == 0 {
		openaiapi.Unavailable("no_engines", "no engine has registered yet").Write(w)
		return
	}
	if !o.resolveModel(p.Req.Model, model) {
		o.unknownModel(p.Req.Model, model).Write(w)
		return
	}
	if p.Req.Model != "" && p.Req.Model != model {
		rb, p.Req.Model = servedBody(rb, model), model
	}
	if e := checkLengths(p, maxLen); e != nil {
		o.countRequest(r, "bad_request")
		e.Write(w)
		return
	}
	if terr := o.engineTokens(r.Context(), p, rb, model, reqID); terr != nil {
		outcome := "bad_request"
		if terr.Status >= 500 {
			outcome = "no_engine"
		}
		o.countRequest(r, outcome)
		terr.Write(w)
		return
	}
	if e := checkLengths(p, maxLen); e != nil { // the engine's tokens
		o.countRequest(r, "bad_request")
		e.Write(w)
		return
	}
	rb = fillContext(r, p, rb, maxLen)
	if r.Context().Err() != nil {
		// The client gave up while the prompt was read and tokenized (an
		// agent cancelling, then often ending its session): its turn
		// would bring an ended session back, and its branch would hold
		// its context as referenced until the idle TTL.
		o.countRequest(r, "client_gone")
		return
	}
	chain := kv.ChainHashes(p.Tokens, bs)
	doneWithBody(r) // parsed and hashed: the large-body budget's work is over
	agent := agentOf(r, p)
	turn := o.branchBegin(agent.Identity, chain)
	defer o.branchFinish(turn, agent.Final)
	defer o.recordRequest(r, p, turn, arrival)
	legs := o.legBody(p, rb)
	var match kv.Match
	var reuse kv.PlacedReuse // the first placement's, for lost KV reuse
	exclude := o.suspects()
	path := r.URL.Path
	routed, ok := o.queued(r.Context(), exclude)
	if !ok {
		o.countRequest(r, "client_gone") // it left while the router's queue held it
		return
	}
	defer routed()
	trace := traceOf(r)
	if trace != nil {
		trace.routedAt = time.Now()
	}
	var lastErr error
	for try := 0; try < maxAttempts; try++ {
		v := o.view(chain, &match, exclude)
		rr := &routing.Request{ID: reqID, Tokens: len(p.Tokens), Chain: chain, Match: &match, MaxTokens: p.MaxTokens, ExpectedOutput: agent.Hints.OSL}
		o.policyMu.Lock()
		dec, err := o.policy.Route(time.Now(), rr, v)
		o.policyMu.Unlock()
		routed() // its load is the policy's now: the next queued request may look
		if err != nil && lastErr != nil {
			// Engines failed it and no other is left: the log says why.
			o.countRequest(r, "failed")
			noteCause(r, lastErr)
			openaiapi.Unavailable("engines_failed", "the request failed on %d engine(s) and no other can take it; retry (request %s)", try, reqID).Write(w)
			return
		}
		if err != nil {
			o.countRequest(r, "no_engine")
			noteCause(r, err)
			openaiapi.Unavailable("no_engine", "no serving engine can take the request now; retry (request %s)", reqID).Write(w)
			return
		}
		o.met.decisions.WithLabelValues(o.policy.Name(), strconv.FormatBool(dec.Disaggregated)).Inc()
		o.shareLoad(reqID, loadPlaced)
		if o.log.Enabled(r.Context(), slog.LevelDebug) {
			o.log.Debug("routed", "request", reqID, "try", try+1, "prefill", dec.Prefill, "decode", dec.Decode,
				"disaggregated", dec.Disaggregated, "fetches", len(dec.Fetches), "prompt_tokens", len(p.Tokens),
				"compute_tokens", dec.ComputeTokens, "est_ttft", dec.EstTTFT, "why", dec.Reason)
		}
		hits, held := o.countHits(&match, v, dec, bs, len(p.Tokens), try == 0)
		computed := hits.computed
		if try == 0 {
			if trace != nil {
				trace.hits = hits
			}
			o.planArrival(len(p.Tokens), computed, dec)
			o.c.mu.Lock()
			reuse = kv.NotePlacement(chain, held, everStored{o.c.dir, o.c.ever})
			o.c.mu.Unlock()
		}
		a := &attempt{o: o,
			attemptRequest:  attemptRequest{w: w, r: r, p: p, body: legs, client: rb, path: path, reqID: reqID, dec: dec, arrival: arrival, urls: o.urls(dec), reuse: &reuse, bs: bs, chain: chain},
			attemptProgress: attemptProgress{phase: phaseRouted, prefillFreed: !dec.Disaggregated, prefillCached: -1, placedCached: len(p.Tokens) - computed},
			attemptMoves:    attemptMoves{decode: dec.Decode, failed: map[string]bool{}}}
		if trace != nil {
			trace.last = a
		}
		o.startFetches(dec, chain)
		failed, err := a.run()
		if a.clientHasBytes && reuse.Noted() {
			// Its engine did not say what it found cached: count the lost
			// reuse as placed.
			o.kvc.lostReuse.Add(reuse.Planned(bs))
			reuse = kv.PlacedReuse{}
		}
		o.policyMu.Lock()
		o.policy.Finished(time.Now(), reqID)
		o.policyMu.Unlock()
		o.shareLoad(reqID, loadFinished)
		o.queue.kick()
		var ce *clientError
		if a.clientHasBytes && !errors.As(err, &ce) {
			// Served, whole or in part: the key's tokens count.
			o.countTokens(r, len(p.Tokens), a.outTokens)
		}
		if err == nil {
			o.planFinish(len(p.Tokens), a.outTokens)
			o.countRequest(r, "ok")
			o.met.e2e.Observe(time.Since(arrival).Seconds())
			o.recent.addE2E(time.Now(), time.Since(arrival).Seconds())
			return
		}
		lastErr = err
		switch {
		case r.Context().Err() != nil:
			o.countRequest(r, "client_gone")
			return
		case errors.As(err, &ce) && a.clientHasBytes:
			// The engine refused the request itself (too long a prompt,
			// a bad parameter) and the client has its answer.
			o.countRequest(r, "bad_request")
			return
		case a.clientHasBytes:
			o.countRequest(r, "failed")
			return
		}
		o.log.Warn("engine failed before the first token; routing again", "request", reqID, "node", failed, "err", err)
		exclude[failed] = true
		if unreachable(err) {
			o.suspectNode(failed)
		}
	}
	o.countRequest(r, "failed")
	noteCause(r, lastErr)
	openaiapi.Unavailable("engines_failed", "the request failed on %d engines; retry (request %s)", maxAttempts, reqID).Write(w)
}

// maxRequestIDLen bounds a client's X-Request-Id, which the router passes
// to engines and writes into its log.
const maxRequestIDLen = 128

// requestID is the request's id: the client's X-Request-Id when it is a
// short printable one, else one of the router's own.
func (o *Orchestrator) requestID(r *http.Request) string {
	if id := r.Header.Get("X-Request-Id"); id != "" && len(id) <= maxRequestIDLen && printableASCII(id) {
		return id
	}
	return fmt.Sprintf("evolve-%d-%d", o.started.UnixNano()%1e9, reqCounter.Add(1))
}

func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// countHits records where the prompt's KV comes from for the chosen
// prefill node, by tier.
// It returns the tokens the prefill computes and the leading blocks the
// node holds or fetches; first says whether this is the request's first
// routing (later ones are not counted again).
func (o *Orchestrator) countHits(m *kv.Match, v *routing.View, dec routing.Decision, bs, tokens int, first bool) (hitSplit, int) {
	var dir kv.NodeID
	for _, n := range v.Nodes {
		if n.ID == dec.Prefill {
			dir = n.Dir
		}
	}
	nm := m.For(dir)
	fetched := 0
	for _, f := range dec.Fetches {
		fetched += f.End - f.From
	}
	gpu, host := nm.GPU*bs, (nm.Local-nm.GPU)*bs
	remote := fetched * bs
	o.met.hitTokens.WithLabelValues("gpu").Add(float64(gpu))
	o.met.hitTokens.WithLabelValues("local_host").Add(float64(host))
	o.met.hitTokens.WithLabelValues("remote_host").Add(float64(remote))
	computed := max(tokens-gpu-host-remote, 0)
	o.met.hitTokens.WithLabelValues("recomputed").Add(float64(computed))
	if first {
		k := &o.kvc
		k.gpu.Add(int64(gpu))
		k.localHost.Add(int64(host))
		k.remoteHost.Add(int64(remote))
		k.recomputed.Add(int64(computed))
		k.fetchedBlocks.Add(int64(fetched))
		if dec.Disaggregated {
			k.transferredTokens.Add(int64(tokens))
		}
	}
	return hitSplit{gpu: gpu, host: host, peer: remote, computed: computed}, nm.Local + fetched
}

func (o *Orchestrator) urls(dec routing.Decision) map[string]string {
	o.c.mu.Lock()
	defer o.c.mu.Unlock()
	out := map[string]string{}
	for _, id := range []string{dec.Prefill, dec.Decode} {
		if n := o.c.nodes[id]; n != nil && out[id] == "" {
			out[id] = n.reg.URL // a request served whole claims its node once
			n.inFlight++
		}
	}
	for _, f := range dec.Fetches {
		if n := o.c.nodes[f.Src]; n != nil {
			out[f.Src] = n.reg.URL
		}
	}
	return out
}

// release ends a request's claim on nodes (urls made it).
func (o *Orchestrator) release(ids ...string) {
	o.c.mu.Lock()
	defer o.c.mu.Unlock()
	for _, id := range ids {
		if n := o.c.nodes[id]; n != nil && n.inFlight > 0 {
			n.inFlight--
		}
	}
}

// freePrefill ends a split request's claim on its prefill node once the
// decode leg answers: the decode engine pulled the KV before its first
// token, so the prefill node holds nothing of the request any more. A
// node switching away from prefill then waits only for the prefills it
// still serves and the KV it still holds, not for the decodes that
// follow them elsewhere (math's run for minutes).
func (a *attempt) freePrefill() {
	if a.prefillFreed {
		return
	}
	a.prefillFreed = true
	a.o.release(a.dec.Prefill)
}

// fetchStartWait bounds how long a request waits for its fetches to start
// before it goes to its engine anyway.
const fetchStartWait = 250 * time.Millisecond

// startFetches asks prefill nodes to pull blocks from peers at once, and
// waits until each engine has taken its fetch on (at most fetchStartWait):
// an engine then holds the request until the blocks have landed instead of
// recomputing them, while the transfer goes on and the request waits in
// its queue.
func (o *Orchestrator) startFetches(dec routing.Decision, chain []kv.BlockHash) {
	var wg sync.WaitGroup
	for _, f := range dec.Fetches {
		o.c.mu.Lock()
		src := o.c.nodes[f.Src]
		url := ""
		if src != nil {
			url = src.reg.URL
		}
		o.c.mu.Unlock()
		if url == "" {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			// The chain is needed whole: the peer checks it holds the prefix.
			_, err := o.control(f.To, protocol.ControlRequest{Op: protocol.OpFetch, Peer: url, Blocks: chain[:f.End], From: f.From})
			if err != nil {
				o.log.Warn("fetch failed", "to", f.To, "from", f.Src, "err", err)
			}
		}()
	}
	started := make(chan struct{})
	go func() { wg.Wait(); close(started) }()
	t := time.NewTimer(fetchStartWait)
	defer t.Stop()
	select {
	case <-started:
	case <-t.C:
		o.log.Debug("fetches slow to start; the request goes on", "fetches", len(dec.Fetches))
	}
}

// run serves the request on the decision's nodes. It returns the node that
// failed and why, or nil when the client got its answer.
func (a *attempt) run() (string, error) {
	defer func() {
		ids := []string{a.decode, a.leaving}
		if !a.prefillFreed {
			ids = append(ids, a.dec.Prefill)
		}
		a.o.release(ids...)
	}()
	if a.dec.Disaggregated {
		params, err := a.prefill()
		var ce *clientError
		if errors.As(err, &ce) { // the request's fault: every engine would say so
			a.clientHasBytes = true
			a.answerHeaders("application/json")
			a.w.WriteHeader(ce.status)
			a.w.Write(ce.body)
			return a.dec.Prefill, err
		}
		var refused *legRefused
		if errors.As(err, &refused) {
			// The prefill node stopped taking prefill legs after it was
			// chosen (a switch to decode began; it may have been the
			// last prefill node): the decode node serves the request
			// whole rather than the client getting a 503.
			a.o.log.Info("prefill node refused the leg; serving the request whole on its decode node", "request", a.reqID,
				"prefill", a.dec.Prefill, "decode", a.decode, "why", refused.code)
			a.prefillDone()
			a.freePrefill()
			return a.whole()
		}
		if err != nil {
			return a.dec.Prefill, err
		}
		// The decode node may have begun handing its decodes over while
		// the prompt was prefilled: the leg goes to a peer at once
		// rather than there and on again.
		a.avoidHandingOver()
		set := map[string]json.RawMessage{"kv_transfer_params": params}
		for k, v := range a.watchVLLM() {
			set[k] = v
		}
		err = a.forward(a.urls[a.decode], a.body.With(set))
		if err != nil && !a.clientHasBytes && !errors.Is(err, errHandedOver) {
			// The decode leg never pulled the KV: free it on the prefill
			// engine now rather than when its hold times out.
			a.releaseHold(a.urls[a.dec.Prefill], params)
		}
		return a.decode, a.goOn(err)
	}
	return a.whole()
}

// whole serves the request unsplit on its decode node.
func (a *attempt) whole() (string, error) {
	body := a.body.Raw
	if set := a.watchVLLM(); set != nil {
		body = a.body.With(set)
	}
	err := a.forward(a.urls[a.decode], body)
	return a.decode, a.goOn(err)
}

// Headers of an answer that say where the router sent the request, for
// an operator asking why a request was slow or where an agent's context
// lives (the engines' node ids, as evolve nodes lists them).
const (
	HeaderPrefillNode = "X-Evolve-Prefill-Node"
	HeaderDecodeNode  = "X-Evolve-Decode-Node"
	// HeaderPromptTokens is the prompt's length in tokens, as the engines
	// tokenize it: a stream's usage comes only at its end.
	HeaderPromptTokens = "X-Evolve-Prompt-Tokens"
	// HeaderCachedTokens is the prompt tokens whose KV existed before the
	// request came, as far as the router knows when the answer starts (a
	// split request's prefill leg's count; else what it placed the request
	// by): the usage at a stream's end has the engine's count.
	HeaderCachedTokens = "X-Evolve-Cached-Tokens"
)

// answerHeaders sets the headers of the answer the client gets from an
// engine: its type, the request's id and the nodes that served it.
func (a *attempt) answerHeaders(contentType string) {
	h := a.w.Header()
	h.Set("Content-Type", contentType)
	h.Set("X-Request-Id", a.reqID)
	h.Set(HeaderPrefillNode, a.dec.Prefill)
	h.Set(HeaderDecodeNode, a.decode)
	h.Set(HeaderPromptTokens, strconv.Itoa(len(a.p.Tokens)))
	cached, ok := a.promptCached()
	if !ok {
		cached = a.placedCached
	}
	h.Set(HeaderCachedTokens, strconv.Itoa(cached))
}

// The members a prefill leg changes: one token, not streamed, and vLLM's
// request that the engine hold the KV for a decode engine to pull.
var (
	jsonOne   = json.RawMessage("1")
	jsonFalse = json.RawMessage("false")
	prefillKV = json.RawMessage(`{"do_remote_decode":true,"do_remote_prefill":false,"remote_block_ids":null,"remote_engine_id":null,"remote_host":null,"remote_port":null}`)
)

// prefill runs the prefill leg (vLLM's step 1) and returns the
// kv_transfer_params the decode leg needs.
func (a *attempt) prefill() (json.RawMessage, error) {
	kvp, err := a.prefillLeg(a.urls[a.dec.Prefill], a.body, nil)
	if err != nil {
		return nil, err
	}
	a.prefillDone()
	return kvp, nil
}

// prefillLeg runs a prefill leg of body (the client's request, or one
// that goes on with its answer), with the members of extra added, on the
// node at url; it returns the kv_transfer_params the decode leg needs,
// and keeps the leg's "evolve" object, if any, as the answer's prefill
// story (prefillKV).
func (a *attempt) prefillLeg(url string, body openaiapi.Body, extra map[string]json.RawMessage) (json.RawMessage, error) {
	set := map[string]json.RawMessage{"max_tokens": jsonOne, "stream": jsonFalse, "stream_options": nil, "kv_transfer_params": prefillKV}
	if body.Has("max_completion_tokens") {
		set["max_completion_tokens"] = jsonOne
	}
	for k, v := range extra {
		set[k] = v
	}
	resp, err := a.post(url, body.With(set))
	if err != nil {
		return nil, err
	}
	b, err := readAnswer(resp, 16<<20, "prefill")
	if err != nil {
		return nil, err
	}
	var out struct {
		KV     json.RawMessage `json:"kv_transfer_params"`
		Usage  *usage          `json:"usage"`
		Evolve json.RawMessage `json:"evolve"`
	}
	if err := json.Unmarshal(b, &out); err == nil && out.Usage != nil {
		a.countComputed(out.Usage)
		if a.phase == phaseRouted { // the request's own prefill, not a resume's
			a.noteCached(out.Usage)
		}
	}
	if len(out.KV) == 0 || string(out.KV) == "null" {
		// vLLM answers so when no KV connector hands its KV to a peer.
		return nil, fmt.Errorf("the prefill engine's answer has no kv_transfer_params: a vLLM engine needs --kv-transfer-config '{\"kv_connector\":\"NixlConnector\",\"kv_role\":\"kv_both\"}' for disaggregated prefill and decode")
	}
	if len(out.Evolve) > 0 && string(out.Evolve) != "null" {
		a.prefillKV = out.Evolve
	}
	return out.KV, nil
}

// prefillDone tells the policy the request's prefill is over (its queued
// prefill work leaves the node's bookkeeping).
func (a *attempt) prefillDone() {
	if a.phase >= phasePrefilled {
		return
	}
	a.phase = phasePrefilled
	a.o.policyMu.Lock()
	a.o.policy.FirstToken(time.Now(), a.reqID)
	a.o.policyMu.Unlock()
	a.o.shareLoad(a.reqID, loadFirst)
	a.o.queue.kick()
}

// firstToken records the first token the client sees.
func (a *attempt) firstToken() {
	a.prefillDone()
	if a.phase >= phaseFirstToken {
		return
	}
	a.phase = phaseFirstToken
	a.firstAt = time.Now()
	a.o.met.ttft.Observe(time.Since(a.arrival).Seconds())
	a.o.recent.addTTFT(time.Now(), time.Since(a.arrival).Seconds())
}
