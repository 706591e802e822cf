// Package vllmtest is a stand-in for a vLLM server in tests: the same
// OpenAI HTTP API with kv_transfer_params, POST /tokenize, Prometheus
// metrics named as vLLM names them, and KV events on a ZMQ publisher with
// a replay service, in vLLM's wire format. Its prefix cache is a plain LRU
// of 16-token blocks; it computes nothing and answers at once.
//
// Its token ids are deliberately not evolve's (evolve's tokenizer plus an
// offset), as a real model's are not: a router that hashed its own ids
// would never match its KV events.
package vllmtest

import (
	"cmp"
	"container/list"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/evolvellm/evolve/openaiapi"
	"github.com/evolvellm/evolve/tokenizer"
	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"
	"github.com/zeebo/xxh3"
)

// TokenOffset is added to evolve's token ids to make this server's.
const TokenOffset = 3

// BlockSize is the server's KV block size.
const BlockSize = 16

// Options configure a Server.
type Options struct {
	Model       string // served model name; default "fake/model"
	MaxModelLen int    // default 32768
	GPUBlocks   int    // prefix cache capacity; default 4096
	// MapEvents publishes events as maps tagged by "type" (vLLM since
	// mid-2026) instead of positional arrays; both carry an extra trailing
	// field, as a newer vLLM would.
	MapEvents bool
	Topic     string
	// FirstParent, when not nil, is the parent_block_hash a chain's first
	// block is published with in place of null: 0 as llm-d-inference-sim
	// writes it, another value for a server whose first blocks would read
	// as orphans.
	FirstParent *uint64
	// LLMDSim publishes as llm-d-inference-sim does: sequence numbers
	// from 1, and replay answers that carry the topic frame before the
	// sequence.
	LLMDSim bool
	// NoConnector answers prefill legs as vLLM without a KV connector
	// does: with no kv_transfer_params.
	NoConnector bool
	// TokenDelay paces a stream: one token per delay, so that a test can
	// stop the server mid-answer (Kill).
	TokenDelay time.Duration
	// Version is what GET /version answers; default "0.11.0".
	Version string
	// PriorityScheduling takes a request's "priority", as vLLM's
	// --scheduling-policy priority does; without it a non-zero priority
	// is refused, as vLLM refuses it (Stats.Prioritised counts requests
	// ahead of the default).
	PriorityScheduling bool
	// APIKey, when set, is required of /v1/ requests as a bearer token,
	// as vLLM's --api-key (or VLLM_API_KEY) does; other paths stay open.
	APIKey string
	// PassMetrics, when set, is where the server binds a ZMQ publisher of
	// forward-pass metrics, as vLLM's --forward-pass-metrics-port does:
	// a prefill pass per request and a decode pass per further token,
	// each timed by the costs below (the server computes nothing), and a
	// heartbeat after each request.
	PassMetrics string
}

// The modelled cost of the server's forward passes, in the forms evolve's
// planner learns (a prefill chunk of n new tokens after c cached ones
// attends n*(c+n/2) token pairs; a decode pass reads its context).
const (
	PrefillBaseSec      = 3e-3
	PrefillPerTokenSec  = 40e-6
	PrefillPerPairSec   = 1e-9
	DecodeBaseSec       = 8e-3
	DecodePerSeqSec     = 50e-6
	DecodePerContextSec = 1e-9
)

// Server is a fake vLLM server.
type Server struct {
	opts Options
	pub  zmq4.Socket
	rep  zmq4.Socket
	fpm  zmq4.Socket // forward-pass metrics; nil without Options.PassMetrics
	ln   net.Listener
	http *http.Server
	// URL is the HTTP base URL; Events and Replay the ZMQ endpoints to
	// dial, and PassMetrics the forward-pass one ("" without).
	URL, Events, Replay, PassMetrics string

	mu      sync.Mutex
	seq     uint64
	buffer  [][2][]byte // seq frame, payload: what replay serves
	skip    int         // publish the next n batches to the replay buffer only
	blocks  map[uint64]*list.Element
	lru     *list.List // of uint64 block hashes, most recent at the front
	running int
	fpmSeq  uint64
	stats   Stats
	nextReq int
}

// Stats counts what the server did.
type Stats struct {
	Requests       int // completions served (prefill legs included)
	PrefillLegs    int // requests with do_remote_decode
	DecodeLegs     int // requests with do_remote_prefill
	Tokenize       int
	IDPrompts      int // completions whose prompt came as token ids
	Continued      int // chat requests with continue_final_message
	Prioritised    int // requests with a priority below the default 0
	PromptTokens   int
	CachedTokens   int // prompt tokens found in the prefix cache
	Generated      int // output tokens
	Passes         int // forward passes published (with Options.PassMetrics)
	BlocksStored   int
	BlocksEvicted  int
	PublishedBatch int
}

// Start runs a server on loopback: HTTP on a free port (or addr), the
// publisher and replay service on free ports (or the given endpoints).
func Start(ctx context.Context, opts Options, httpAddr, events, replay string) (*Server, error) {
	if opts.Model == "" {
		opts.Model = "fake/model"
	}
	if opts.MaxModelLen == 0 {
		opts.MaxModelLen = 32768
	}
	if opts.GPUBlocks == 0 {
		opts.GPUBlocks = 4096
	}
	s := &Server{opts: opts, blocks: map[uint64]*list.Element{}, lru: list.New()}
	if opts.LLMDSim {
		s.seq = 1
	}
	s.pub = zmq4.NewPub(ctx)
	if events == "" {
		events = "tcp://127.0.0.1:0"
	}
	if err := s.pub.Listen(events); err != nil {
		return nil, fmt.Errorf("fake vLLM: listen %s: %w", events, err)
	}
	s.Events = "tcp://" + dialAddr(s.pub.Addr())
	s.rep = zmq4.NewRouter(ctx, zmq4.WithID(zmq4.SocketIdentity("replay")))
	if replay == "" {
		replay = "tcp://127.0.0.1:0"
	}
	if err := s.rep.Listen(replay); err != nil {
		s.pub.Close()
		return nil, fmt.Errorf("fake vLLM: listen %s: %w", replay, err)
	}
	s.Replay = "tcp://" + dialAddr(s.rep.Addr())
	go s.serveReplay()
	if opts.PassMetrics != "" {
		s.fpm = zmq4.NewPub(ctx)
		if err := s.fpm.Listen(opts.PassMetrics); err != nil {
			s.Close()
			return nil, fmt.Errorf("fake vLLM: listen %s: %w", opts.PassMetrics, err)
		}
		s.PassMetrics = "tcp://" + dialAddr(s.fpm.Addr())
	}
	if httpAddr == "" {
		httpAddr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", httpAddr)
	if err != nil {
		s.Close()
		return nil, err
	}
	s.ln = ln
	s.URL = "http://" + dialAddr(ln.Addr())
	s.http = &http.Server{Handler: s.handler()}
	go s.http.Serve(ln)
	return s, nil
}

func dialAddr(a net.Addr) string {
	host, port, _ := net.SplitHostPort(a.String())
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port)
}

// Kill stops the server at once, as a crashed vLLM stops: every
// connection is cut, a stream mid-answer included.
func (s *Server) Kill() { s.Close() }

// Close stops the server.
func (s *Server) Close() {
	if s.http != nil {
		s.http.Close()
	}
	s.pub.Close()
	s.rep.Close()
	if s.fpm != nil {
		s.fpm.Close()
	}
}

// Stats returns the counters so far.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// SkipNext makes the next n batches reach only the replay buffer, as if
// the subscriber had lost them.
func (s *Server) SkipNext(n int) {
	s.mu.Lock()
	s.skip = n
	s.mu.Unlock()
}

// Resident says whether the cache holds the block of this server's hash.
func (s *Server) Resident() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.blocks)
}

func (s *Server) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(200) })
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, r *http.Request) {
		openaiapi.WriteJSON(w, 200, map[string]any{"object": "list", "data": []map[string]any{
			{"id": s.opts.Model, "object": "model", "owned_by": "vllm", "max_model_len": s.opts.MaxModelLen}}})
	})
	mux.HandleFunc("GET /metrics", s.serveMetrics)
	mux.HandleFunc("GET /version", func(w http.ResponseWriter, r *http.Request) {
		openaiapi.WriteJSON(w, 200, map[string]string{"version": cmp.Or(s.opts.Version, "0.11.0")})
	})
	mux.HandleFunc("POST /tokenize", s.serveTokenize)
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) { s.serveGenerate(w, r, false) })
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) { s.serveGenerate(w, r, true) })
	if s.opts.APIKey == "" {
		return mux
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/v1") && r.Header.Get("Authorization") != "Bearer "+s.opts.APIKey {
			openaiapi.WriteJSON(w, 401, map[string]string{"error": "Unauthorized"})
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// vllmError writes an error in vLLM's flat shape.
func vllmError(w http.ResponseWriter, status int, msg string) {
	openaiapi.WriteJSON(w, status, map[string]any{"object": "error", "message": msg, "type": "BadRequestError", "code": status})
}

func (s *Server) serveMetrics(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	st, used, running := s.stats, len(s.blocks), s.running
	s.mu.Unlock()
	m := fmt.Sprintf(`# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name=%[1]q} %[2]d
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name=%[1]q} 0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name=%[1]q} %[3]g
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="%[4]d",cache_dtype="auto",enable_prefix_caching="True",num_cpu_blocks="None",num_gpu_blocks="%[5]d"} 1.0
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name=%[1]q} %[6]d
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name=%[1]q} %[10]d
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name=%[1]q} %[9]d
# TYPE vllm:request_prefill_time_seconds histogram
vllm:request_prefill_time_seconds_bucket{engine="0",model_name=%[1]q,le="+Inf"} %[7]d
vllm:request_prefill_time_seconds_sum{engine="0",model_name=%[1]q} %[8]g
vllm:request_prefill_time_seconds_count{engine="0",model_name=%[1]q} %[7]d
`, s.opts.Model, running, float64(used)/float64(s.opts.GPUBlocks), BlockSize, s.opts.GPUBlocks,
		st.PromptTokens, st.Requests, float64(st.PromptTokens-st.CachedTokens)*20e-6, st.Generated, st.CachedTokens)
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	io.WriteString(w, m)
}

// tokens are this server's ids for evolve's.
func tokens(evolve []uint32) []uint32 {
	out := make([]uint32, len(evolve))
	for i, t := range evolve {
		out[i] = t + TokenOffset
	}
	return out
}

func (s *Server) serveTokenize(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var req struct {
		Model    string          `json:"model"`
		Prompt   *string         `json:"prompt"`
		Messages json.RawMessage `json:"messages"`
		// What else the chat template renders, as vLLM's does.
		Tools                json.RawMessage `json:"tools"`
		AddGenerationPrompt  *bool           `json:"add_generation_prompt"`
		ContinueFinalMessage bool            `json:"continue_final_message"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		vllmError(w, 400, "malformed JSON: "+err.Error())
		return
	}
	if req.Model != "" && req.Model != s.opts.Model {
		vllmError(w, 404, fmt.Sprintf("The model `%s` does not exist.", req.Model))
		return
	}
	var p *openaiapi.Parsed
	var perr *openaiapi.Error
	switch {
	case req.Prompt != nil:
		b, _ := json.Marshal(map[string]any{"prompt": *req.Prompt})
		p, perr = openaiapi.Parse(b, false, 0)
	case len(req.Messages) > 0:
		var msgs []struct {
			Role string `json:"role"`
		}
		json.Unmarshal(req.Messages, &msgs)
		for _, m := range msgs {
			switch m.Role {
			case "system", "user", "assistant", "tool":
			default: // as a chat template raises
				vllmError(w, 400, fmt.Sprintf("the chat template has no role %q", m.Role))
				return
			}
		}
		b, _ := json.Marshal(map[string]any{"messages": req.Messages, "tools": req.Tools,
			"add_generation_prompt": req.AddGenerationPrompt, "continue_final_message": req.ContinueFinalMessage})
		p, perr = openaiapi.Parse(b, true, 0)
	default:
		vllmError(w, 400, "either prompt or messages is required")
		return
	}
	if perr != nil {
		vllmError(w, 400, perr.Message)
		return
	}
	s.mu.Lock()
	s.stats.Tokenize++
	s.mu.Unlock()
	ids := tokens(p.Tokens)
	openaiapi.WriteJSON(w, 200, map[string]any{"count": len(ids), "max_model_len": s.opts.MaxModelLen, "tokens": ids})
}

func (s *Server) serveGenerate(w http.ResponseWriter, r *http.Request, chat bool) {
	body, _ := io.ReadAll(r.Body)
	var raw map[string]any
	if err := json.Unmarshal(body, &raw); err != nil {
		vllmError(w, 400, "malformed JSON: "+err.Error())
		return
	}
	p, perr := openaiapi.Parse(body, chat, 0)
	if perr != nil {
		vllmError(w, 400, perr.Message)
		return
	}
	prio, _ := raw["priority"].(float64)
	if prio != 0 && !s.opts.PriorityScheduling {
		vllmError(w, 400, fmt.Sprintf("Got priority %v but Priority scheduling is not enabled.", prio))
		return
	}
	ids := p.Tokens // token ids given are used as they are, as vLLM does
	// Text, alone or as a list of one string, is tokenized as vLLM does.
	_, textPrompt := raw["prompt"].(string)
	if list, ok := raw["prompt"].([]any); ok && len(list) == 1 {
		_, textPrompt = list[0].(string)
	}
	if textPrompt || chat {
		ids = tokens(p.Tokens)
	}
	if len(ids)+p.MaxTokens > s.opts.MaxModelLen {
		vllmError(w, 400, fmt.Sprintf("This model's maximum context length is %d tokens.", s.opts.MaxModelLen))
		return
	}
	s.mu.Lock()
	s.running++
	s.nextReq++
	id := fmt.Sprintf("cmpl-fake-%d", s.nextReq)
	s.stats.Requests++
	s.stats.PromptTokens += len(ids)
	if !textPrompt && !chat {
		s.stats.IDPrompts++
	}
	if p.Req.ContinueFinalMessage {
		s.stats.Continued++
	}
	if prio < 0 {
		s.stats.Prioritised++
	}
	if p.KV.DoRemoteDecode {
		s.stats.PrefillLegs++
	}
	if p.KV.DoRemotePrefill {
		s.stats.DecodeLegs++
	}
	cached := s.cacheLocked(ids)
	s.stats.CachedTokens += cached
	s.running--
	s.mu.Unlock()

	n := p.MaxTokens
	if p.KV.DoRemoteDecode {
		n = 1
	}
	s.mu.Lock()
	s.stats.Generated += n
	s.passesLocked(len(ids), cached, n, !p.KV.DoRemotePrefill)
	s.mu.Unlock()
	// The output depends only on where it starts, as a greedy model's
	// on its context: a continuation from the prompt and the output so
	// far writes what the whole answer would have.
	words, out := make([]string, n), make([]uint32, n)
	for i := range words {
		w := tokenizer.Word(len(ids) + i)
		words[i], out[i] = tokenizer.TokenText(w), w+TokenOffset
	}
	text := strings.Join(words, "")
	withIDs, _ := raw["return_token_ids"].(bool)
	usage := map[string]any{"prompt_tokens": len(ids), "completion_tokens": n, "total_tokens": len(ids) + n,
		"prompt_tokens_details": map[string]any{"cached_tokens": cached}}
	var kvp any
	if p.KV.DoRemoteDecode && !s.opts.NoConnector {
		kvp = map[string]any{"do_remote_prefill": true, "do_remote_decode": false, "remote_engine_id": "fake-" + s.URL,
			"remote_request_id": id, "remote_block_ids": [][]int{{1, 2, 3}}, "remote_host": "127.0.0.1", "remote_port": 5600, "tp_size": 1}
	}
	object, choice := "text_completion", map[string]any{"index": 0, "text": text, "finish_reason": "length"}
	if chat {
		object = "chat.completion"
		choice = map[string]any{"index": 0, "message": map[string]any{"role": "assistant", "content": text}, "finish_reason": "length"}
	}
	answer := map[string]any{"id": id, "object": object, "created": time.Now().Unix(), "model": s.opts.Model,
		"choices": []any{choice}, "usage": usage, "kv_transfer_params": kvp}
	if withIDs { // vLLM's return_token_ids: the prompt's at the top of a chat answer, in the choice of a completion
		choice["token_ids"] = out
		if chat {
			answer["prompt_token_ids"] = ids
		} else {
			choice["prompt_token_ids"] = ids
		}
	}
	if stream, _ := raw["stream"].(bool); stream && !p.KV.DoRemoteDecode {
		w.Header().Set("Content-Type", "text/event-stream")
		fl, _ := w.(http.Flusher)
		streamObject := "text_completion" // as vLLM names a completion's chunks
		if chat {
			streamObject = "chat.completion.chunk"
		}
		for i, word := range words {
			if s.opts.TokenDelay > 0 {
				select {
				case <-time.After(s.opts.TokenDelay):
				case <-r.Context().Done():
					return
				}
			}
			c := map[string]any{"index": 0, "text": word, "finish_reason": nil}
			if chat {
				c = map[string]any{"index": 0, "delta": map[string]any{"content": word}, "finish_reason": nil}
			}
			if i == n-1 {
				c["finish_reason"] = "length"
			}
			chunk := map[string]any{"id": id, "object": streamObject, "model": s.opts.Model, "choices": []any{c}}
			if withIDs {
				c["token_ids"] = out[i : i+1]
				if i == 0 && chat {
					chunk["prompt_token_ids"] = ids
				} else if i == 0 {
					c["prompt_token_ids"] = ids
				}
			}
			b, _ := json.Marshal(chunk)
			fmt.Fprintf(w, "data: %s\n\n", b)
			if fl != nil {
				fl.Flush()
			}
		}
		b, _ := json.Marshal(map[string]any{"id": id, "object": streamObject, "model": s.opts.Model, "choices": []any{}, "usage": usage})
		fmt.Fprintf(w, "data: %s\n\ndata: [DONE]\n\n", b)
		return
	}
	openaiapi.WriteJSON(w, 200, answer)
}

// passesLocked publishes the forward passes of a request of prompt tokens
// (cached of them found) and n output tokens: its prefill (unless its KV
// came from a prefill engine), then a decode pass per further token, then
// a heartbeat. The server answers a request at once, so each pass holds
// one request.
func (s *Server) passesLocked(prompt, cached, n int, prefill bool) {
	if s.fpm == nil {
		return
	}
	if prefill {
		c := min(cached, prompt-1) // the last prompt token is always computed
		k := float64(prompt - c)
		wall := PrefillBaseSec + PrefillPerTokenSec*k + PrefillPerPairSec*k*(float64(c)+k/2)
		s.publishPassLocked(wall, map[string]any{"num_prefill_requests": 1, "sum_prefill_tokens": prompt - c,
			"var_prefill_length": 0.0, "sum_prefill_kv_tokens": c})
	}
	for i := 1; i < n; i++ {
		ctx := prompt + i - 1 // before the pass; it reads one more
		wall := DecodeBaseSec + DecodePerSeqSec + DecodePerContextSec*float64(ctx+1)
		s.publishPassLocked(wall, map[string]any{"num_decode_requests": 1, "sum_decode_kv_tokens": ctx})
	}
	s.publishPassLocked(0, map[string]any{})
}

// publishPassLocked sends one forward-pass metrics message as vLLM does:
// an empty topic, the sequence, the msgspec struct as a msgpack map (with
// a field a later schema might add).
func (s *Server) publishPassLocked(wall float64, scheduled map[string]any) {
	payload, err := msgpack.Marshal(map[string]any{"version": 1, "worker_id": "fake", "dp_rank": 0, "counter_id": s.fpmSeq,
		"timing_scope": "execute_model_cuda", "wall_time": wall, "scheduled_requests": scheduled,
		"queued_requests": map[string]any{"num_prefill_requests": 0}, "later_field": true})
	if err != nil {
		panic(err)
	}
	seq := binary.BigEndian.AppendUint64(nil, s.fpmSeq)
	s.fpmSeq++
	if wall > 0 {
		s.stats.Passes++
	}
	_ = s.fpm.Send(zmq4.NewMsgFrom([]byte{}, seq, payload))
}

// blockHash is this server's opaque hash of a block (not evolve's).
func blockHash(parent uint64, toks []uint32) uint64 {
	b := binary.LittleEndian.AppendUint64(nil, parent)
	for _, t := range toks {
		b = binary.LittleEndian.AppendUint32(b, t)
	}
	return xxh3.HashSeed(b, 0x5eed) | 1<<63 // large: exercises uint64 encoding
}

// cacheLocked looks the prompt's full blocks up, stores the missing ones
// and evicts the least recent beyond capacity, publishing one batch. It
// returns the prompt tokens found cached.
func (s *Server) cacheLocked(ids []uint32) int {
	type run struct {
		parent any // nil for a chain's first block
		hashes []uint64
		toks   []uint32
	}
	var runs []run
	open := false
	nb := len(ids) / BlockSize
	var parent uint64
	hit, missed := 0, false
	for i := 0; i < nb; i++ {
		toks := ids[i*BlockSize : (i+1)*BlockSize]
		h := blockHash(parent, toks)
		if el, ok := s.blocks[h]; ok {
			s.lru.MoveToFront(el)
			if !missed {
				hit++
			}
			open = false
		} else {
			missed = true
			if !open {
				var p any
				if i > 0 {
					p = parent
				} else if s.opts.FirstParent != nil {
					p = *s.opts.FirstParent
				}
				runs = append(runs, run{parent: p})
				open = true
			}
			r := &runs[len(runs)-1]
			r.hashes = append(r.hashes, h)
			r.toks = append(r.toks, toks...)
			s.blocks[h] = s.lru.PushFront(h)
			s.stats.BlocksStored++
		}
		parent = h
	}
	var removed []uint64
	for len(s.blocks) > s.opts.GPUBlocks {
		el := s.lru.Back()
		h := el.Value.(uint64)
		s.lru.Remove(el)
		delete(s.blocks, h)
		removed = append(removed, h)
	}
	s.stats.BlocksEvicted += len(removed)
	var events []any
	for _, r := range runs {
		events = append(events, s.event("BlockStored", []string{"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name", "extra_keys", "group_idx", "future_field"},
			r.hashes, r.parent, r.toks, BlockSize, nil, "GPU", nil, nil, 0, "x"))
	}
	if len(removed) > 0 {
		events = append(events, s.event("BlockRemoved", []string{"block_hashes", "medium", "group_idx", "future_field"}, removed, "GPU", 0, 7))
	}
	if len(events) > 0 {
		s.publishLocked(events)
	}
	return hit * BlockSize
}

// event encodes one event positionally or as a map.
func (s *Server) event(typ string, names []string, values ...any) any {
	if s.opts.MapEvents {
		m := map[string]any{"type": typ}
		for i, n := range names {
			m[n] = values[i]
		}
		return m
	}
	return append([]any{typ}, values...)
}

// publishLocked sends one batch: [ts, events, dp_rank].
func (s *Server) publishLocked(events []any) {
	payload, err := msgpack.Marshal([]any{float64(time.Now().UnixNano()) / 1e9, events, 0})
	if err != nil {
		panic(err)
	}
	seq := binary.BigEndian.AppendUint64(nil, s.seq)
	s.seq++
	s.buffer = append(s.buffer, [2][]byte{seq, payload})
	if len(s.buffer) > 10000 {
		s.buffer = s.buffer[1:]
	}
	s.stats.PublishedBatch++
	if s.skip > 0 {
		s.skip--
		return
	}
	_ = s.pub.Send(zmq4.NewMsgFrom([]byte(s.opts.Topic), seq, payload))
}

// serveReplay answers replay requests as vLLM does: [id, "", start] in,
// [id, "", seq, payload]... then [id, "", -1, ""] out.
func (s *Server) serveReplay() {
	for {
		msg, err := s.rep.Recv()
		if err != nil {
			return
		}
		if len(msg.Frames) != 3 || len(msg.Frames[2]) != 8 {
			continue
		}
		id := msg.Frames[0]
		start := binary.BigEndian.Uint64(msg.Frames[2])
		s.mu.Lock()
		var out [][2][]byte
		for _, b := range s.buffer {
			if binary.BigEndian.Uint64(b[0]) >= start {
				out = append(out, b)
			}
		}
		s.mu.Unlock()
		for _, b := range out {
			if s.opts.LLMDSim {
				_ = s.rep.SendMulti(zmq4.NewMsgFrom(id, []byte{}, []byte(s.opts.Topic), b[0], b[1]))
				continue
			}
			_ = s.rep.SendMulti(zmq4.NewMsgFrom(id, []byte{}, b[0], b[1]))
		}
		end := binary.BigEndian.AppendUint64(nil, ^uint64(0))
		if s.opts.LLMDSim {
			_ = s.rep.SendMulti(zmq4.NewMsgFrom(id, []byte{}, []byte(s.opts.Topic), end, []byte{}))
			continue
		}
		_ = s.rep.SendMulti(zmq4.NewMsgFrom(id, []byte{}, end, []byte{}))
	}
}
