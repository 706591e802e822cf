package orchestrator

import (
	"encoding/json"
	"maps"
	"strconv"

	"github.com/evolvellm/evolve/openaiapi"
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
		return withMembers(rb, map[string]json.RawMessage{openaiapi.PromptTokensMember: nil})
	}
	return withMembers(rb, map[string]json.RawMessage{"messages": nil, openaiapi.PromptTokensMember: appendIDs(nil, p.Tokens)})
}

// enginesReadPromptTokens reports whether every registered engine reads a
// chat prompt given as token ids.
func (o *Orchestrator) enginesReadPromptTokens() bool {
	o.c.mu.Lock()
	defer o.c.mu.Unlock()
	for _, n := range o.c.nodes {
		if !n.reg.PromptTokens {
			return false
		}
	}
	return len(o.c.nodes) > 0
}

// withMembers is rb with the members of set replaced, added or (nil)
// left out, its members and its bytes alike.
func withMembers(rb openaiapi.Body, set map[string]json.RawMessage) openaiapi.Body {
	members := maps.Clone(rb.Members)
	for k, v := range set {
		if v == nil {
			delete(members, k)
		} else {
			members[k] = v
		}
	}
	return openaiapi.Body{Raw: rb.With(set), Members: members}
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
