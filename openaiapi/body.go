package openaiapi

import (
	"bytes"
	"encoding/json"
	"maps"
	"slices"
	"strings"

	"github.com/evolvellm/evolve/tokenizer"
)

// Body is a request body kept as the client sent it and as its top-level
// members' raw bytes, so that a router can send it on with a few members
// changed and the rest (an agent's prompt of 100K token ids) copied byte
// for byte, without decoding and encoding it again.
type Body struct {
	Raw     []byte                     // the body as the client sent it
	Members map[string]json.RawMessage // its top-level members
}

// ParseObject reads a JSON object body. Its members share b's bytes.
func ParseObject(b []byte) (Body, error) { return parseObject(b, nil) }

// parseObject is ParseObject, and reads the ids of the member want names
// when it is a list of token ids (see splitObject).
func parseObject(b []byte, want *splitOptions) (Body, error) {
	if m, ok := splitObject(b, want); ok {
		return Body{Raw: b, Members: m}, nil
	}
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

// Set is the body with the members of set replaced, added or (nil) left
// out, as With writes them, its members and its bytes alike.
func (b Body) Set(set map[string]json.RawMessage) Body {
	members := maps.Clone(b.Members)
	for k, v := range set {
		if v == nil {
			delete(members, k)
		} else {
			members[k] = v
		}
	}
	return Body{Raw: b.With(set), Members: members}
}

// ParseBody is Parse for a router: it also keeps the body's members (see
// Body) to send on. It reads the body once for both, and a prompt of
// token ids only to tokenize it: a router that kept the members apart
// would read a 128K-token prompt four times instead of twice. What it
// accepts and refuses, and how it says so, are Parse's.
func ParseBody(body []byte, chat bool, defaultMaxTokens int) (*Parsed, Body, *Error) {
	return parseBody(body, parseOptions{chat: chat, defaultMaxTokens: defaultMaxTokens})
}

// ParseBodyUntokenized is ParseBody for a router whose engines tokenize
// text themselves (vLLM's POST /tokenize gives the ids their KV is hashed
// over): a prompt of text or chat messages is checked as ParseBody checks
// it but left untokenized, Tokens nil, where ParseBody would spend a few
// milliseconds per 32K tokens on ids the router throws away. A prompt of
// token ids is read as ParseBody reads it.
func ParseBodyUntokenized(body []byte, chat bool, defaultMaxTokens int) (*Parsed, Body, *Error) {
	return parseBody(body, parseOptions{chat: chat, defaultMaxTokens: defaultMaxTokens, leaveText: true})
}

// BodyOptions say how ParseBodyWith reads a client's body.
type BodyOptions struct {
	Chat             bool
	DefaultMaxTokens int
	// Untokenized leaves a prompt of text or messages untokenized, as
	// ParseBodyUntokenized does.
	Untokenized bool
	// MaxModelLen, when not 0, refuses a prompt of text or messages of
	// that many tokens or more before its ids are made (ContextTooLong):
	// a 30 MB prompt costs a count, not 150 MB of ids.
	MaxModelLen int
}

// ParseBodyWith is ParseBody as o says.
func ParseBodyWith(body []byte, o BodyOptions) (*Parsed, Body, *Error) {
	return parseBody(body, parseOptions{chat: o.Chat, defaultMaxTokens: o.DefaultMaxTokens, leaveText: o.Untokenized, maxModelLen: o.MaxModelLen})
}

func parseBody(body []byte, o parseOptions) (*Parsed, Body, *Error) {
	// Every member but the prompt goes to encoding/json below (parse):
	// it checks them.
	want := splitOptions{name: "prompt", limit: tokenizer.VocabSize, decoded: true}
	b, err := parseObject(body, &want)
	if err != nil { // not an object: parse refuses it too, in its words
		p, perr := parse(body, o)
		return p, Body{}, perr
	}
	prompt, ok := b.Members["prompt"]
	if !ok || !foldUnique(b.Members) {
		// A chat request, or a prompt spelt another way: encoding/json
		// matches names whatever their case, the last one written winning,
		// and the rest below would be in another order.
		p, perr := parse(body, o)
		return p, b, perr
	}
	apart := o
	apart.prompt = prompt
	if !o.chat {
		apart.ids = want.ids // nil for another shape of prompt: parse reads it
	}
	p, perr := parse(b.With(map[string]json.RawMessage{"prompt": nil}), apart)
	if perr != nil && perr.Code != CodeContextLength {
		// Refused: in the words encoding/json has for the body as sent
		// (of two wrong members, the first in the body's order).
		p, perr = parse(body, o)
	}
	return p, b, perr
}

// foldUnique reports whether no two member names are equal whatever their
// case.
func foldUnique(m map[string]json.RawMessage) bool {
	seen := make(map[string]bool, len(m))
	for k := range m {
		l := strings.ToLower(k)
		if seen[l] {
			return false
		}
		seen[l] = true
	}
	return true
}
