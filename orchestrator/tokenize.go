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
	"github.com/evolvellm/evolve/protocol"
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

// parseRequest reads a request body as openaiapi.ParseBody does, but
// leaves a prompt of text or messages untokenized when engines tokenize
// for themselves: engineTokens asks one of them for the ids. A prompt of
// maxLen tokens or more (0: not known) is refused before its ids are made.
func (o *Orchestrator) parseRequest(body []byte, chat bool, maxLen int) (*openaiapi.Parsed, openaiapi.Body, *openaiapi.Error) {
	_, ours := o.nodesWith(func(r protocol.Registration) bool { return r.Tokenizer != "engine" })
	return openaiapi.ParseBodyWith(body, openaiapi.BodyOptions{Chat: chat, Untokenized: !ours, MaxModelLen: maxLen})
}

// engineTokens replaces p.Tokens by the token ids an engine with its own
// tokenizer (vLLM) gives the prompt: its KV events are hashed over those
// ids, and so must the router's block chains be. A completion prompt given
// as token ids needs no call, nor does a cluster whose engines all use
// evolve's tokenizer.
func (o *Orchestrator) engineTokens(ctx context.Context, p *openaiapi.Parsed, rb openaiapi.Body, model, reqID string) *openaiapi.Error {
	urls, needed := o.tokenizerURLs()
	if !needed {
		// Read for engines that tokenize, which have left since.
		return localTokens(p, rb)
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
		s, ok := textPrompt(rb.Members["prompt"])
		if !ok {
			return localTokens(p, rb) // token ids: Parse took them as given
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
		o.suspectURL(u)
		o.log.Warn("tokenize failed", "request", reqID, "engine", u, "err", err)
	}
	return openaiapi.Unavailable("tokenize_failed", "no engine could tokenize the prompt; retry (request %s)", reqID)
}

// localTokens gives p the tokens of evolve's tokenizer if it has none (a
// prompt parseRequest left untokenized for engines that tokenize).
func localTokens(p *openaiapi.Parsed, rb openaiapi.Body) *openaiapi.Error {
	if p.Tokens != nil {
		return nil
	}
	q, _, perr := openaiapi.ParseBody(rb.Raw, p.Chat, 0)
	if perr != nil {
		return perr
	}
	p.Tokens = q.Tokens
	return nil
}

// textPrompt is a completion prompt's text, given as a string or as a list
// of one string (as Parse reads it); false for token ids.
func textPrompt(raw json.RawMessage) (string, bool) {
	raw = bytes.TrimSpace(raw)
	if len(raw) > 0 && raw[0] == '[' {
		// A list of one string, not of ids: looked at before decoding,
		// as a list of 100K ids would be read through to refuse it.
		if inner := bytes.TrimLeft(raw[1:], " \t\r\n"); len(inner) == 0 || inner[0] != '"' {
			return "", false
		}
		var ss []string
		if json.Unmarshal(raw, &ss) != nil || len(ss) != 1 {
			return "", false
		}
		return ss[0], true
	}
	var s string
	if len(raw) == 0 || raw[0] != '"' || json.Unmarshal(raw, &s) != nil {
		return "", false
	}
	return s, true
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
	// An agent's context is 100K ids and more: read them in one pass.
	toks, err := openaiapi.TokenIDs(b, "tokens")
	if err != nil {
		return nil, fmt.Errorf("tokenize answer: %w", err)
	}
	return toks, nil
}
