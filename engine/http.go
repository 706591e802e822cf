package engine

import (
	"bufio"
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/evolvellm/evolve/engine/stepmodel"
	"github.com/evolvellm/evolve/kv"
	"github.com/evolvellm/evolve/openaiapi"
	"github.com/evolvellm/evolve/protocol"
	"github.com/evolvellm/evolve/tokenizer"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

const maxBodyBytes = openaiapi.MaxBodyBytes

// pullTimeout bounds a decode leg's wait for its prefill peer.
const pullTimeout = 10 * time.Second

// Handler serves the engine's HTTP API: OpenAI's /v1 endpoints, /health,
// /metrics and the /evolve/v1/kv extensions (see package protocol).
func (e *Simulated) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) { e.serveGenerate(w, r, false) })
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) { e.serveGenerate(w, r, true) })
	mux.HandleFunc("GET /v1/models", e.serveModels)
	mux.HandleFunc("GET /health", e.serveHealth)
	mux.Handle("GET /metrics", promhttp.HandlerFor(e.met.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("POST /evolve/v1/kv/pull", e.servePull)
	mux.HandleFunc("POST /evolve/v1/kv/lookup", e.serveLookup)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &apiError{Status: 404, Type: "invalid_request_error", Message: fmt.Sprintf("no route %s %s", r.Method, r.URL.Path)})
	})
	if e.cfg.Token == "" {
		return mux
	}
	return requireToken(e.cfg.Token, mux)
}

// requireToken refuses requests to /v1/ and /evolve/v1/ that do not
// carry the engine token; /health and /metrics stay open, as vLLM's do
// under --api-key, for load balancers and Prometheus.
func requireToken(token string, next http.Handler) http.Handler {
	want := []byte(token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.Path
		// The scheme in any case: "bearer TOKEN" is "Bearer TOKEN".
		given, _ := protocol.BearerToken(r.Header.Get("Authorization"))
		if (strings.HasPrefix(p, "/v1/") || strings.HasPrefix(p, "/evolve/")) &&
			subtle.ConstantTimeCompare([]byte(given), want) != 1 {
			writeError(w, &apiError{Status: 401, Type: "invalid_request_error", Code: "invalid_engine_token",
				Message: "this engine serves its cluster's routers only: send Authorization: Bearer with the engine token " +
					"(by default the event plane's: the TOKEN of the engine's nats://TOKEN@host)"})
			return
		}
		next.ServeHTTP(w, r)
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) { openaiapi.WriteJSON(w, status, v) }

func writeError(w http.ResponseWriter, ae *apiError) { ae.Write(w) }

type apiError = openaiapi.Error

func badRequest(param, format string, args ...any) *apiError {
	return openaiapi.BadRequest(param, format, args...)
}

// submitError maps a model's refusal to an HTTP error; a prompt too long
// names the field that carried it (messages in a chat, else prompt).
func submitError(err error, chat bool) *apiError {
	var overflow *stepmodel.ContextOverflow
	switch {
	case errors.Is(err, stepmodel.ErrDraining):
		return &apiError{Status: 503, Type: "service_unavailable", Code: "engine_draining", Message: err.Error() + "; retry on another engine", RetryAfter: 1}
	case errors.Is(err, stepmodel.ErrWrongRole):
		return &apiError{Status: 503, Type: "service_unavailable", Code: "wrong_role", Message: err.Error() + "; retry on another engine", RetryAfter: 1}
	case errors.As(err, &overflow):
		// In vLLM's words, which clients read (and the router turns into
		// each API's own).
		if overflow.Prompt >= overflow.MaxModelLen {
			e := openaiapi.ContextTooLong(overflow.MaxModelLen, overflow.Prompt)
			e.Param = promptParam(chat)
			return e
		}
		return openaiapi.OutputTooLong(overflow.MaxModelLen, overflow.Prompt, overflow.MaxTokens)
	case errors.Is(err, stepmodel.ErrTooLong):
		return &apiError{Status: 400, Type: "invalid_request_error", Code: "context_length_exceeded", Param: promptParam(chat), Message: err.Error()}
	}
	return &apiError{Status: 400, Type: "invalid_request_error", Message: err.Error()}
}

func promptParam(chat bool) string {
	if chat {
		return "messages"
	}
	return "prompt"
}

func (e *Simulated) serveModels(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, 200, map[string]any{
		"object": "list",
		"data": []map[string]any{{
			"id": e.cfg.ServedModelName, "object": "model", "created": e.start.Unix(), "owned_by": "evolve",
			"max_model_len": e.cfg.Profile.MaxModelLen,
		}},
	})
}

func (e *Simulated) serveHealth(w http.ResponseWriter, r *http.Request) {
	hb := e.Heartbeat()
	writeJSON(w, 200, map[string]any{
		"status": "ok", "engine": e.cfg.ID, "model": e.cfg.ServedModelName, "role": hb.Role, "draining": hb.Draining,
		"waiting": hb.Waiting, "running": hb.Running,
	})
}

func (e *Simulated) servePull(w http.ResponseWriter, r *http.Request) {
	var req protocol.PullRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, maxBodyBytes)).Decode(&req); err != nil || req.RemoteRequestID == "" {
		writeError(w, badRequest("remote_request_id", "body must be JSON with remote_request_id"))
		return
	}
	blocks, ok := e.release(req.RemoteRequestID)
	if !ok {
		writeError(w, &apiError{Status: 404, Type: "invalid_request_error", Code: "kv_not_held", Message: fmt.Sprintf("no KV held for request %q (expired, pulled already, or unknown)", req.RemoteRequestID)})
		return
	}
	writeJSON(w, 200, protocol.PullReply{Engine: e.cfg.ID, Blocks: blocks})
}

func (e *Simulated) serveLookup(w http.ResponseWriter, r *http.Request) {
	var req protocol.LookupRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, maxBodyBytes)).Decode(&req); err != nil {
		writeError(w, badRequest("blocks", "body must be JSON with blocks"))
		return
	}
	writeJSON(w, 200, e.lookup(req.Blocks))
}

// serveGenerate serves /v1/completions (chat false) and /v1/chat/completions.
func (e *Simulated) serveGenerate(w http.ResponseWriter, r *http.Request, chat bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		writeError(w, badRequest("", "read body: %v", err))
		return
	}
	parsed, perr := openaiapi.Parse(body, chat, e.cfg.DefaultMaxTokens)
	if perr != nil {
		writeError(w, perr)
		return
	}
	req, tokens, maxTokens, kvp := &parsed.Req, parsed.Tokens, parsed.MaxTokens, parsed.KV
	if req.Model != "" && req.Model != e.cfg.ServedModelName {
		writeError(w, &apiError{Status: 404, Type: "invalid_request_error", Code: "model_not_found", Param: "model",
			Message: fmt.Sprintf("The model `%s` does not exist. This engine serves `%s`.", req.Model, e.cfg.ServedModelName)})
		return
	}

	var tool *toolPlan
	if chat {
		if tool, perr = requiredTool(req); perr != nil {
			writeError(w, perr)
			return
		}
	}

	// Where the model ends its turn, from the prompt the client sent.
	stopAt := answerTokens(tokens, req, maxTokens)

	var resume *protocol.Resume
	continues := len(req.EvolveResume) > 0 && string(req.EvolveResume) != "null"
	if continues {
		resume = new(protocol.Resume)
		if err := json.Unmarshal(req.EvolveResume, resume); err != nil {
			writeError(w, badRequest("evolve_resume", "evolve_resume: %v", err))
			return
		}
		if resume.ID == "" || len(resume.Output) == 0 {
			writeError(w, badRequest("evolve_resume", "evolve_resume needs the answer's id and its output so far"))
			return
		}
		if !kvp.DoRemoteDecode && len(resume.Output) >= maxTokens {
			writeError(w, badRequest("evolve_resume", "evolve_resume has %d output tokens; max_tokens %d leaves none to write", len(resume.Output), maxTokens))
			return
		}
		// The prompt now ends with the output so far, whose KV the
		// engine that handed the answer over holds.
		tokens = append(append(make([]uint32, 0, len(tokens)+len(resume.Output)), tokens...), resume.Output...)
		maxTokens -= len(resume.Output)
		stopAt = max(1, stopAt-len(resume.Output))
		if kvp.DoRemoteDecode {
			// The prefill leg of a resumed answer: a router has this
			// engine compute the KV of the prompt and the output so far
			// (the engine that was writing the answer died with it) and
			// hold it for the decode engine that goes on with the answer.
			// The leg is a plain prefill of those tokens: it writes none
			// of the answer.
			resume = nil
		}
	}

	prefix := "cmpl"
	if chat {
		prefix = "chatcmpl"
	}
	id := e.newRequestID(prefix)
	routed := r.Header.Get(protocol.HeaderHandOver) // the client is a router
	sr := stepmodel.Request{ID: id, Tokens: tokens, MaxTokens: maxTokens, StopAt: stopAt, RemoteDecode: kvp.DoRemoteDecode,
		// An answer it handed over that no peer took comes back to be
		// finished, even while the engine drains (Leave).
		Finishing: resume != nil && resume.Prior.Engine == e.cfg.ID && routed == protocol.HandOverNever,
		// Its client is mid-read: it waits ahead of new arrivals.
		Continues: continues}
	if kvp.DoRemoteDecode {
		sr.MaxTokens = 1
	}
	if req.Seed != nil {
		// The same seed and prompt give the same output; without one every
		// request draws its own stream (as sampling with temperature would).
		sr.Seed = uint64(*req.Seed)*0x9e3779b97f4a7c15 + uint64(len(tokens)) | 1
	}
	if resume != nil && resume.Sampler != 0 {
		sr.Seed = resume.Sampler // the stream the first engine was writing
	}
	var pullErr string
	if kvp.DoRemotePrefill {
		// Refuse early if this engine cannot take a decode leg, before taking
		// the peer's KV.
		e.mu.Lock()
		acceptErr := e.model.Accepts(false, true)
		e.mu.Unlock()
		if acceptErr != nil {
			writeError(w, submitError(acceptErr, chat))
			return
		}
		blocks, err := e.pull(r.Context(), kvp)
		if err != nil {
			pullErr = err.Error()
			e.log.Warn("KV pull failed; recomputing the prompt", "err", err, "peer", kvp.RemoteEngineID)
		} else {
			sr.Remote = &stepmodel.RemoteKV{Blocks: blocks}
			e.met.xfer.Add(float64(len(blocks) * e.cfg.Profile.BlockSize * e.cfg.Profile.KVBytesPerToken))
		}
	}
	// A prefill leg ends at its first token: there is nothing to hand over.
	movable := routed == protocol.HandOverAllowed && !kvp.DoRemoteDecode
	p, err := e.submit(sr, movable)
	if err != nil {
		writeError(w, submitError(err, chat))
		return
	}
	if rid := r.Header.Get("X-Request-Id"); rid != "" {
		w.Header().Set("X-Request-Id", rid)
	}
	g := generation{e: e, w: w, id: id, reqID: id, chat: chat, created: time.Now().Unix(), stream: req.Stream,
		includeUsage: req.StreamOptions != nil && req.StreamOptions.IncludeUsage, remoteDecode: kvp.DoRemoteDecode, pullErr: pullErr,
		promptLen: len(tokens), resume: resume, tool: tool,
		// A router that reads a whole answer's opening lines says so: one
		// from before them would pass them on to its client.
		tokenComments: routed != "" && !kvp.DoRemoteDecode && (req.Stream || r.Header.Get(protocol.HeaderWholeTokens) == "1")}
	if resume != nil {
		// The answer goes on as the client has seen it begin.
		g.id, g.created, g.promptLen = resume.ID, resume.Created, len(tokens)-len(resume.Output)
		g.sent = len(resume.Output)
		if !g.stream {
			for _, t := range resume.Output {
				g.text.WriteString(tokenizer.TokenText(t))
			}
		}
	}
	g.run(r.Context(), p)
}

// pull takes the KV a prefill leg holds on its engine.
func (e *Simulated) pull(ctx context.Context, kvp openaiapi.KVTransferParams) ([]kv.BlockHash, error) {
	if kvp.RemoteHost == "" || kvp.RemotePort == 0 || kvp.RemoteRequestID == "" {
		return nil, errors.New("kv_transfer_params lacks remote_host, remote_port or remote_request_id")
	}
	ctx, cancel := context.WithTimeout(ctx, pullTimeout)
	defer cancel()
	base := "http://" + net.JoinHostPort(kvp.RemoteHost, strconv.Itoa(kvp.RemotePort))
	var rep protocol.PullReply
	if err := e.postJSON(ctx, base+"/evolve/v1/kv/pull", protocol.PullRequest{RemoteRequestID: kvp.RemoteRequestID}, &rep); err != nil {
		return nil, fmt.Errorf("pull KV from %s: %w", base, err)
	}
	return rep.Blocks, nil
}

// postJSON posts in as JSON to a peer engine and decodes a 200 answer
// into out.
func (e *Simulated) postJSON(ctx context.Context, url string, in, out any) error {
	b, err := json.Marshal(in)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, "POST", url, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := e.peers.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(msg)))
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// generation writes one request's answer, streamed or whole.
type generation struct {
	e            *Simulated
	w            http.ResponseWriter
	id           string // the answer's id (a resumed answer keeps its first engine's)
	reqID        string // the model's request id
	chat         bool
	created      int64
	stream       bool
	includeUsage bool
	remoteDecode bool
	pullErr      string
	promptLen    int              // the client's prompt, without output resumed
	resume       *protocol.Resume // the answer so far, when another engine began it
	// tokenComments: the client is a router, and the answer is not a
	// prefill leg's; each token's event carries protocol.TokenComment, or,
	// in a whole answer, a protocol.TokenComment line before the answer's
	// JSON names it (after protocol.AnswerComment, written with the first
	// token: bw is then not nil).
	tokenComments bool

	bw   *bufio.Writer
	text strings.Builder
	sent int
	// tool is the call the answer makes, when the request requires one.
	tool *toolPlan
}

func (g *generation) run(ctx context.Context, p *pending) {
	if g.stream {
		h := g.w.Header()
		h.Set("Content-Type", "text/event-stream")
		h.Set("Cache-Control", "no-cache")
		h.Set("Connection", "keep-alive")
		g.w.WriteHeader(200)
		g.bw = bufio.NewWriter(g.w)
	}
	var buf []stepmodel.Token
	for {
		select {
		case <-ctx.Done():
			g.e.abort(g.reqID) // the client went away: free its KV
			return
		case <-p.notify:
		}
		toks, fin, mv, err := p.take(buf)
		buf = toks
		if len(toks) > 0 {
			if g.stream {
				// One chunk per token, as vLLM streams, even when a slow
				// reader lets several accumulate.
				for _, t := range toks {
					if g.tokenComments {
						g.tokenComment(t)
					}
					if werr := g.chunk(tokenizer.TokenText(t.ID), nil); werr != nil {
						g.e.abort(g.reqID)
						return
					}
					g.sent++
				}
			} else {
				if g.tokenComments {
					if werr := g.nameTokens(toks); werr != nil {
						g.e.abort(g.reqID)
						return
					}
				}
				for _, t := range toks {
					g.text.WriteString(tokenizer.TokenText(t.ID))
				}
				g.sent += len(toks)
			}
		}
		if err != nil {
			if g.tokenComments && g.bw != nil {
				// Its router continues the answer elsewhere from the tokens
				// it named: end the answer without an end, as a failure.
				return
			}
			if g.stream {
				g.streamError(err)
			} else {
				writeError(g.w, &apiError{Status: 503, Type: "service_unavailable", Message: err.Error(), RetryAfter: 1})
			}
			return
		}
		if fin != nil {
			g.finish(fin)
			return
		}
		if mv != nil {
			g.handOver(mv)
			return
		}
	}
}

// nameTokens writes a TokenComment line for each token of a whole answer
// to a router, and before the first the answer's AnswerComment, and sends
// them: the router keeps them, and the answer can go on elsewhere should
// this engine die before it ends.
func (g *generation) nameTokens(toks []stepmodel.Token) error {
	if g.bw == nil {
		g.w.Header().Set("Content-Type", "application/json")
		g.w.WriteHeader(200)
		g.bw = bufio.NewWriter(g.w)
		g.bw.WriteString(protocol.AnswerComment)
		g.bw.WriteString(g.id)
		g.bw.WriteByte(' ')
		g.bw.WriteString(strconv.FormatInt(g.created, 10))
		g.bw.WriteByte('\n')
	}
	for _, t := range toks {
		g.tokenComment(t)
	}
	return g.flush()
}

// tokenComment writes t's protocol.TokenComment line.
func (g *generation) tokenComment(t stepmodel.Token) {
	g.bw.WriteString(protocol.TokenComment)
	g.bw.WriteString(strconv.FormatUint(uint64(t.ID), 10))
	g.bw.WriteByte(' ')
	g.bw.WriteString(strconv.FormatUint(t.Sampler, 10))
	g.bw.WriteByte('\n')
}

// flush sends what bw holds to the client.
func (g *generation) flush() error {
	if err := g.bw.Flush(); err != nil {
		return err
	}
	if f, ok := g.w.(http.Flusher); ok {
		f.Flush()
	}
	return nil
}

// whole writes a whole answer (or its handover): as plain JSON, or after
// the lines that named its tokens (nameTokens).
func (g *generation) whole(v any) {
	if g.bw == nil {
		writeJSON(g.w, 200, v)
		return
	}
	b, err := json.Marshal(v)
	if err != nil {
		return
	}
	g.bw.Write(b)
	g.bw.WriteByte('\n')
	_ = g.flush()
}

// handOver ends the answer with what a peer needs to go on with it
// (protocol.HandOver); the client's router sends it on. Every token the
// model wrote before it moved has been written out.
func (g *generation) handOver(mv *moved) {
	h := protocol.HandOver{KVTransferParams: mv.kv, Resume: protocol.Resume{
		ID: g.id, Created: g.created, Output: mv.Tokens[g.promptLen:], Sampler: mv.Sampler, Prior: *g.story(mv.Usage),
	}}
	msg := struct {
		HandOver protocol.HandOver `json:"evolve_handover"`
		Object   string            `json:"object,omitempty"`
	}{HandOver: h}
	if g.stream {
		_ = g.event(msg)
		return
	}
	msg.Object = "evolve.handover"
	g.whole(msg)
}

// story is the answer's "evolve" object, given this engine's usage: with
// the legs before this one summed in when it resumes another's answer.
func (g *generation) story(u stepmodel.Usage) *protocol.ResponseKV {
	ext := &protocol.ResponseKV{
		Engine: g.e.cfg.ID, GPUHitTokens: u.GPUHitTokens, HostHitTokens: u.HostHitTokens, TransferredTokens: u.TransferredTokens,
		ComputedTokens: u.ComputedTokens, Preemptions: u.Preemptions, PullError: g.pullErr,
		QueueSec: u.FirstScheduled.Sub(u.Arrival).Seconds(), TTFTSec: u.FirstToken.Sub(u.Arrival).Seconds(), E2ESec: u.Finish.Sub(u.Arrival).Seconds(),
	}
	if g.resume == nil {
		return ext
	}
	// The prompt's KV is the first leg's story; what this leg pulled or
	// recomputed of the output so far is the handover's cost.
	p := &g.resume.Prior
	if p.Engine == "" {
		// The engine that began the answer failed and its story with it:
		// this leg's, which recomputed the prompt, is all there is.
		ext.HandedOver = 1
		return ext
	}
	ext.GPUHitTokens, ext.HostHitTokens, ext.TransferredTokens = p.GPUHitTokens, p.HostHitTokens, p.TransferredTokens
	ext.ComputedTokens += p.ComputedTokens
	ext.Preemptions += p.Preemptions
	ext.QueueSec, ext.TTFTSec = p.QueueSec, p.TTFTSec
	ext.E2ESec += p.E2ESec
	ext.HandedOver = p.HandedOver + 1
	if ext.PullError == "" {
		ext.PullError = p.PullError
	}
	return ext
}

func (g *generation) object(chunk bool) string {
	switch {
	case g.chat && chunk:
		return "chat.completion.chunk"
	case g.chat:
		return "chat.completion"
	}
	return "text_completion"
}

func (g *generation) choices(s string, delta bool, finish *string) any {
	if !g.chat {
		return []completionChoice{{Text: s, FinishReason: finish}}
	}
	if g.tool != nil {
		if delta {
			return []chatChoice{{Delta: g.toolDelta(s, finish != nil), FinishReason: finish}}
		}
		return []chatChoice{{Message: g.toolMessage(s), FinishReason: finish}}
	}
	d := text(s)
	if delta {
		if g.sent == 0 {
			d.Role = "assistant"
		}
		return []chatChoice{{Delta: d, FinishReason: finish}}
	}
	d.Role = "assistant"
	return []chatChoice{{Message: d, FinishReason: finish}}
}

func (g *generation) chunk(text string, finish *string) error {
	resp := apiResponse{ID: g.id, Object: g.object(true), Created: g.created, Model: g.e.cfg.ServedModelName,
		Choices: g.choices(text, true, finish)}
	return g.event(resp)
}

func (g *generation) event(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	g.bw.WriteString("data: ")
	g.bw.Write(b)
	g.bw.WriteString("\n\n")
	return g.flush()
}

func (g *generation) streamError(err error) {
	_ = g.event(openaiapi.Unavailable("engine_error", "%v", err).Body())
	g.bw.WriteString("data: [DONE]\n\n")
	g.bw.Flush()
}

func (g *generation) finish(f *stepmodel.Finished) {
	ext := g.story(f.Usage)
	u := f.Usage
	usage := &usageJSON{PromptTokens: g.promptLen, CompletionTokens: u.CompletionTokens}
	cached := u.CachedTokens()
	if g.resume != nil { // the whole answer's, as its first engine found the prompt
		usage.CompletionTokens += len(g.resume.Output)
		cached = ext.GPUHitTokens + ext.HostHitTokens + ext.TransferredTokens
	}
	usage.TotalTokens = usage.PromptTokens + usage.CompletionTokens
	usage.PromptTokensDetails.CachedTokens = cached
	reason := "length"
	switch {
	case g.tool != nil:
		reason = "tool_calls"
	case f.Reason == stepmodel.FinishStop:
		reason = "stop" // its end of turn, before max_tokens
	}
	var kvp map[string]any
	if g.remoteDecode {
		kvp = g.e.transferParams(g.reqID, f.Blocks)
	}
	if !g.stream {
		resp := apiResponse{ID: g.id, Object: g.object(false), Created: g.created, Model: g.e.cfg.ServedModelName,
			Choices: g.choices(g.text.String(), false, &reason), Usage: usage, KVTransferParams: kvp, Evolve: ext}
		g.whole(resp)
		return
	}
	last := apiResponse{ID: g.id, Object: g.object(true), Created: g.created, Model: g.e.cfg.ServedModelName,
		Choices: g.choices("", true, &reason), KVTransferParams: kvp, Evolve: ext}
	if g.chat && g.tool == nil {
		last.Choices = []chatChoice{{Delta: text(""), FinishReason: &reason}}
	}
	if g.event(last) != nil {
		return
	}
	if g.includeUsage {
		if g.event(apiResponse{ID: g.id, Object: g.object(true), Created: g.created, Model: g.e.cfg.ServedModelName,
			Choices: []any{}, Usage: usage}) != nil {
			return
		}
	}
	g.bw.WriteString("data: [DONE]\n\n")
	g.bw.Flush()
	if f, ok := g.w.(http.Flusher); ok {
		f.Flush()
	}
}

// transferParams is the kv_transfer_params a prefill leg answers with, as
// vLLM's NixlConnector does, naming this engine's HTTP address as the place
// to pull from.
func (e *Simulated) transferParams(id string, blocks []kv.BlockHash) map[string]any {
	host, port := "127.0.0.1", 0
	if u, err := url.Parse(e.cfg.AdvertiseURL); err == nil {
		host = u.Hostname()
		port, _ = strconv.Atoi(u.Port())
	}
	ids := make([]uint64, len(blocks))
	for i, b := range blocks {
		ids[i] = uint64(b)
	}
	return map[string]any{
		"do_remote_prefill": true, "do_remote_decode": false,
		"remote_engine_id": e.cfg.ID, "remote_request_id": id, "remote_block_ids": ids,
		"remote_host": host, "remote_port": port, "tp_size": 1,
	}
}
