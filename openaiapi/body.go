package openaiapi

import (
	"bytes"
	"encoding/json"
	"maps"
	"slices"
	"strings"
)

// Body is a request body kept as the client sent it and as its top-level
// members' raw bytes, so that a router can send it on with a few members
// changed and the rest (an agent's prompt of 100K token ids) copied byte
// for byte, without decoding and encoding it again.
type Body struct {
	Raw     []byte                     // the body as the client sent it
	Members map[string]json.RawMessage // its top-level members
}

// ParseObject reads a JSON object body.
func ParseObject(b []byte) (Body, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return Body{}, err
	}
	return Body{Raw: b, Members: m}, nil
}

// Has reports whether the body has the member.
func (b Body) Has(name string) bool {
	_, ok := b.Members[name]
	return ok
}

// With returns the body with the members of set replaced or added, and
// those whose value in set is nil left out. Members are written in key
// order, as encoding/json writes a map.
func (b Body) With(set map[string]json.RawMessage) []byte {
	keys := make([]string, 0, len(b.Members)+len(set))
	size := 2
	for k, v := range b.Members {
		if _, ok := set[k]; !ok {
			keys = append(keys, k)
			size += len(k) + len(v) + 4
		}
	}
	for k, v := range set {
		if v != nil {
			keys = append(keys, k)
			size += len(k) + len(v) + 4
		}
	}
	slices.Sort(keys)
	out := make([]byte, 0, size+16)
	out = append(out, '{')
	for i, k := range keys {
		if i > 0 {
			out = append(out, ',')
		}
		kb, _ := json.Marshal(k) // a string always encodes
		out = append(out, kb...)
		out = append(out, ':')
		v, ok := set[k]
		if !ok {
			v = b.Members[k]
		}
		out = append(out, bytes.TrimSpace(v)...)
	}
	return append(out, '}')
}

// ParseBody is Parse for a router: it also keeps the body's members (see
// Body) to send on. It reads the body once for both, and a prompt of
// token ids only to tokenize it: a router that kept the members apart
// would read a 128K-token prompt four times instead of twice. What it
// accepts and refuses, and how it says so, are Parse's.
func ParseBody(body []byte, chat bool, defaultMaxTokens int) (*Parsed, Body, *Error) {
	b, err := ParseObject(body)
	if err != nil { // not an object: Parse refuses it too, in its words
		p, perr := Parse(body, chat, defaultMaxTokens)
		return p, Body{}, perr
	}
	prompt, ok := b.Members["prompt"]
	for k := range b.Members {
		// encoding/json matches names whatever their case, the last one
		// written winning: a body with "Prompt" too is left to it.
		ok = ok && (k == "prompt" || !strings.EqualFold(k, "prompt"))
	}
	if !ok { // a chat request, or a prompt spelt another way
		p, perr := Parse(body, chat, defaultMaxTokens)
		return p, b, perr
	}
	rest := Body{Members: maps.Clone(b.Members)}
	delete(rest.Members, "prompt")
	p, perr := parse(rest.With(nil), chat, defaultMaxTokens, prompt)
	return p, b, perr
}
