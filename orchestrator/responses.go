package orchestrator

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"

	"github.com/evolvellm/evolve/openaiapi"
	"github.com/evolvellm/evolve/responsesapi"
)

// serveResponses serves OpenAI's Responses API (POST /v1/responses), which
// the Codex CLI speaks: the request is translated into a chat completion
// request and served as one, with the same routing, KV reuse, handovers
// and continuation on failure, and its answer, whole or streamed, is
// translated back (responsesapi.Writer). Nothing is stored: a request
// carries the whole conversation, as Codex's do (store false).
func (o *Orchestrator) serveResponses(w http.ResponseWriter, r *http.Request) {
	body, status, err := readRequestBody(w, r)
	if err != nil {
		o.countRequest(r, "bad_request")
		(&openaiapi.Error{Status: status, Type: "invalid_request_error", Message: err.Error()}).Write(w)
		return
	}
	chat, info, rerr := responsesapi.ToChat(body)
	if rerr != nil {
		o.countRequest(r, "bad_request")
		rerr.Write(w)
		return
	}
	if len(info.Dropped) > 0 {
		// Hosted tools (Codex offers web_search every turn): not served,
		// and said so, rather than every turn refused.
		w.Header().Set(responsesapi.DroppedToolsHeader, strings.Join(info.Dropped, ","))
	}
	tw := responsesapi.NewWriter(w, info)
	c := withAPI(asChat(r, chat), "responses")
	o.serveGenerate(tw, c.WithContext(context.WithValue(c.Context(), fillsContextKey{}, true)), true)
	tw.Finish()
}

// serveStoredResponse answers the Responses API's calls on a stored
// response (GET, DELETE, cancel, input_items): evolve stores none.
func (o *Orchestrator) serveStoredResponse(w http.ResponseWriter, r *http.Request) {
	(&openaiapi.Error{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "not_found",
		Message: "response " + r.PathValue("id") + " not found: evolve stores no responses; send the whole conversation in each request, with store false"}).Write(w)
}

// fillsContextKey marks a request whose answer may fill the context when
// it gives no max tokens (the Responses API's), as vLLM's answers do,
// where evolve's engines would stop at their default.
type fillsContextKey struct{}

// fillContext gives the legs of a request that may fill the context, and
// names no max tokens, the context that is left as their max_tokens.
func fillContext(r *http.Request, p *openaiapi.Parsed, rb openaiapi.Body, maxLen int) openaiapi.Body {
	if fill, _ := r.Context().Value(fillsContextKey{}).(bool); !fill || maxLen <= 0 ||
		p.Req.MaxTokens != nil || p.Req.MaxCompletionTokens != nil || len(p.Tokens) >= maxLen {
		return rb
	}
	return rb.Set(map[string]json.RawMessage{"max_tokens": json.RawMessage(strconv.Itoa(maxLen - len(p.Tokens)))})
}
