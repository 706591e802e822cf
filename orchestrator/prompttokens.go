package orchestrator

import (
	"encoding/json"
	"strconv"

	"github.com/evolvellm/evolve/openaiapi"
	"github.com/evolvellm/evolve/protocol"
)

// legBody is the body the engines get of a request the client sent as rb.
// A chat request, in a cluster whose every engine reads a prompt given as
// token ids (Registration.PromptTokens: evolve's engines), carries the
// ids the router rendered and tokenized in openaiapi.PromptTokensMember in
// place of its messages, so that no engine reads, renders and tokenizes
// them again. Otherwise it is rb, less any such ids a client put in it:
// the prompt is the messages.
func (o *Orchestrator) legBody(p *openaiapi.Parsed, rb openaiapi.Body) openaiapi.Body {
	if !p.Chat {
		return rb
	}
	if len(p.Tokens) == 0 || !o.enginesReadPromptTokens() {
		if !rb.Has(openaiapi.PromptTokensMember) {
			return rb
		}
		return rb.Set(map[string]json.RawMessage{openaiapi.PromptTokensMember: nil})
	}
	return rb.Set(map[string]json.RawMessage{"messages": nil, openaiapi.PromptTokensMember: appendIDs(nil, p.Tokens)})
}

// enginesReadPromptTokens reports whether every registered engine reads a
// chat prompt given as token ids (and one is registered).
func (o *Orchestrator) enginesReadPromptTokens() bool {
	n, all := o.nodesWith(func(r protocol.Registration) bool { return r.PromptTokens })
	return n > 0 && all
}

// readsPromptTokens reports whether the node at url reads a chat prompt
// given as token ids; false for a node it does not know.
func (o *Orchestrator) readsPromptTokens(url string) bool {
	o.c.mu.Lock()
	defer o.c.mu.Unlock()
	for _, n := range o.c.nodes {
		if n.reg.URL == url {
			return n.reg.PromptTokens
		}
	}
	return false
}

// withMessages is a leg's body with the client's messages in place of
// the router's token ids, for a node that does not read those: one that
// joined (an older engine, in a rolling upgrade) after the request's legs
// were built with them, and that the answer then goes on on. A body that
// does not parse is sent as it is.
func (a *attempt) withMessages(body []byte) []byte {
	b, err := openaiapi.ParseObject(body)
	if err != nil {
		return body
	}
	return b.With(map[string]json.RawMessage{"messages": a.client.Members["messages"], openaiapi.PromptTokensMember: nil})
}

// nodesWith reports how many nodes are registered and whether ok holds for
// every one's registration.
func (o *Orchestrator) nodesWith(ok func(protocol.Registration) bool) (int, bool) {
	o.c.mu.Lock()
	defer o.c.mu.Unlock()
	for _, n := range o.c.nodes {
		if !ok(n.reg) {
			return len(o.c.nodes), false
		}
	}
	return len(o.c.nodes), true
}

// appendIDs appends ids to b as a JSON list.
func appendIDs(b []byte, ids []uint32) []byte {
	b = append(b, '[')
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendUint(b, uint64(id), 10)
	}
	return append(b, ']')
}
