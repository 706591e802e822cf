package orchestrator

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"time"

	"github.com/evolvellm/evolve/openaiapi"
)

// tokenizeTimeout bounds one POST /tokenize to an engine.
const tokenizeTimeout = 10 * time.Second

// chatTokenizeFields are the chat request fields that change what vLLM's
// chat template renders; /tokenize must see them to give the ids the
// engine will hash.
var chatTokenizeFields = []string{"tools", "chat_template", "chat_template_kwargs", "add_generation_prompt",
	"continue_final_message", "documents", "mm_processor_kwargs"}

// tokenizerURLs returns the base URLs of the serving engines that tokenize
// for themselves (Registration.Tokenizer "engine"), least busy first
// (a node that failed a request lately last: a dead engine looks idle
// until its agent reports it down), and whether the cluster has such
// engines at all.
func (o *Orchestrator) tokenizerURLs() (urls []string, engineTokenizer bool) {
	o.c.mu.Lock()
	defer o.c.mu.Unlock()
	type cand struct {
		url     string
		suspect bool
		busy    int
	}
	now := time.Now()
	var cs []cand
	for _, n := range o.c.nodes {
		if n.reg.Tokenizer != "engine" {
			continue
		}
		engineTokenizer = true
		if n.state == StateServing || n.state == StateSwitching {
			cs = append(cs, cand{n.reg.URL, n.suspect(now), n.inFlight + n.hb.Waiting})
		}
	}
	sort.Slice(cs, func(i, j int) bool {
		if cs[i].suspect != cs[j].suspect {
			return cs[j].suspect
		}
		return cs[i].busy < cs[j].busy || cs[i].busy == cs[j].busy && cs[i].url < cs[j].url
	})
	for _, c := range cs {
		urls = append(urls, c.url)
	}
	return urls, engineTokenizer
}

// engineTokens replaces p.Tokens by the token ids an engine with its own
// tokenizer (vLLM) gives the prompt: its KV events are hashed over those
// ids, and so must the router's block chains be. A completion prompt given
// as token ids needs no call, nor does a cluster whose engines all use
// evolve's tokenizer.
func (o *Orchestrator) engineTokens(ctx context.Context, p *openaiapi.Parsed, rb openaiapi.Body, model string) *openaiapi.Error {
	urls, needed := o.tokenizerURLs()
	if !needed {
		return nil
	}
	body := map[string]any{"model": model}
	if p.Chat {
		body["messages"] = rb.Members["messages"]
		body["add_generation_prompt"] = true
		for _, k := range chatTokenizeFields {
			if v, ok := rb.Members[k]; ok {
				body[k] = v
			}
		}
	} else {
		var s string
		if prompt := bytes.TrimSpace(rb.Members["prompt"]); len(prompt) == 0 || prompt[0] != '"' || json.Unmarshal(prompt, &s) != nil {
			return nil // token ids (or a list): Parse took them as given
		}
		body["prompt"] = s
		if v, ok := rb.Members["add_special_tokens"]; ok {
			body["add_special_tokens"] = v
		}
	}
	if len(urls) == 0 {
		return openaiapi.Unavailable("no_engine", "no serving engine can tokenize the prompt")
	}
	b, err := json.Marshal(body)
	if err != nil {
		return openaiapi.BadRequest("", "encode tokenize request: %v", err)
	}
	var lastErr error
	for _, u := range urls[:min(len(urls), maxAttempts)] {
		toks, err := o.tokenizeAt(ctx, u, b)
		var ce *clientError
		if errors.As(err, &ce) { // the prompt's fault: pass the engine's answer on
			msg := string(bytes.TrimSpace(ce.body))
			var e struct { // OpenAI's shape, or vLLM's flat one
				Message string `json:"message"`
				Error   struct {
					Message string `json:"message"`
				} `json:"error"`
			}
			if json.Unmarshal(ce.body, &e) == nil {
				msg = cmp.Or(e.Error.Message, e.Message, msg)
			}
			return &openaiapi.Error{Status: ce.status, Type: "invalid_request_error", Message: msg}
		}
		if err == nil {
			p.Tokens = toks
			return nil
		}
		lastErr = err
		o.suspectURL(u)
		o.log.Warn("tokenize failed", "engine", u, "err", err)
	}
	return openaiapi.Unavailable("tokenize_failed", "tokenize the prompt: %v", lastErr)
}

// tokenizeAt posts a /tokenize request to one engine.
func (o *Orchestrator) tokenizeAt(ctx context.Context, base string, body []byte) ([]uint32, error) {
	ctx, cancel := context.WithTimeout(ctx, tokenizeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "POST", base+"/tokenize", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := o.http.Do(req)
	if err != nil {
		return nil, err
	}
	b, err := readAnswer(resp, 64<<20, "tokenize")
	if err != nil {
		return nil, err
	}
	var out struct {
		Tokens []uint32 `json:"tokens"`
	}
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, fmt.Errorf("tokenize answer: %w", err)
	}
	return out.Tokens, nil
}
