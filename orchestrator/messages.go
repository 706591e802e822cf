package orchestrator

import (
	"bytes"
	"io"
	"net/http"

	"github.com/evolvellm/evolve/anthropicapi"
	"github.com/evolvellm/evolve/openaiapi"
)

// serveMessages serves Anthropic's Messages API (POST /v1/messages): the
// request is translated into a chat completion request and served as one,
// with the same routing, KV reuse, handovers and continuation on failure,
// and its answer, whole or streamed, is translated back
// (anthropicapi.Writer).
func (o *Orchestrator) serveMessages(w http.ResponseWriter, r *http.Request) {
	body, aerr := readMessagesBody(w, r)
	if aerr != nil {
		aerr.Write(w)
		return
	}
	chat, info, aerr := anthropicapi.ToChat(body)
	if aerr != nil {
		o.countRequest(r, "bad_request")
		aerr.Write(w)
		return
	}
	tw := anthropicapi.NewWriter(w, info, anthropicapi.UsageHeaders{Prompt: HeaderPromptTokens, Cached: HeaderCachedTokens})
	o.serveGenerate(tw, withAPI(asChat(r, chat), "messages"), true)
	tw.Finish()
}

// serveCountTokens serves POST /v1/messages/count_tokens: the prompt's
// length in tokens, as the engines tokenize it.
func (o *Orchestrator) serveCountTokens(w http.ResponseWriter, r *http.Request) {
	body, aerr := readMessagesBody(w, r)
	if aerr != nil {
		aerr.Write(w)
		return
	}
	chat, aerr := anthropicapi.CountTokensChat(body)
	if aerr != nil {
		aerr.Write(w)
		return
	}
	p, rb, perr := o.parseRequest(chat, true, 0) // counted whatever its length
	if perr != nil {
		anthropicapi.NewError(perr.Status, perr.Message).Write(w)
		return
	}
	model, _ := o.servedModel()
	if model == "" {
		anthropicapi.NewError(503, "no engine has registered yet").Write(w)
		return
	}
	if p.Req.Model == "" || !o.resolveModel(p.Req.Model, model) {
		e := o.unknownModel(p.Req.Model, model)
		anthropicapi.NewError(e.Status, e.Message).Write(w)
		return
	}
	if terr := o.engineTokens(r.Context(), p, rb, model, o.requestID(r)); terr != nil {
		anthropicapi.NewError(terr.Status, terr.Message).Write(w)
		return
	}
	openaiapi.WriteJSON(w, 200, map[string]int{"input_tokens": len(p.Tokens)})
}

// readMessagesBody reads a Messages API request's body.
func readMessagesBody(w http.ResponseWriter, r *http.Request) ([]byte, *anthropicapi.Error) {
	body, status, err := readRequestBody(w, r)
	if err != nil {
		return nil, anthropicapi.NewError(status, err.Error())
	}
	return body, nil
}

// asChat is r as the chat completion request body asks: the engines are
// sent it on their chat completions path.
func asChat(r *http.Request, body []byte) *http.Request {
	c := r.Clone(r.Context())
	c.URL.Path = "/v1/chat/completions"
	c.Body = io.NopCloser(bytes.NewReader(body))
	c.ContentLength = int64(len(body))
	return c
}
