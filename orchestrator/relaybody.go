package orchestrator

import (
	"bytes"
	"encoding/json"
	"slices"
)

// relayBody is a client's request body, kept as it came and as its
// members' raw bytes: the legs sent to engines change a few members and
// copy the rest (an agent's prompt of 100K token ids) byte for byte,
// without decoding and encoding them again.
type relayBody struct {
	raw     []byte                     // the body as the client sent it
	members map[string]json.RawMessage // its top-level members
}

// parseRelayBody reads a JSON object body.
func parseRelayBody(b []byte) (relayBody, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return relayBody{}, err
	}
	return relayBody{raw: b, members: m}, nil
}

// has reports whether the client's body has the member.
func (b relayBody) has(name string) bool {
	_, ok := b.members[name]
	return ok
}

// with returns the body with the members of set replaced or added, and
// those whose value in set is nil left out. Members are written in key
// order, as encoding/json writes a map.
func (b relayBody) with(set map[string]json.RawMessage) []byte {
	keys := make([]string, 0, len(b.members)+len(set))
	size := 2
	for k, v := range b.members {
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
			v = b.members[k]
		}
		out = append(out, bytes.TrimSpace(v)...)
	}
	return append(out, '}')
}

// withPrefillKV adds a prefill leg's "evolve" object to the one in a
// decode leg's answer (or streamed chunk), as its "prefill" member. An
// answer without that object, or one that does not parse, is returned as
// it is.
func withPrefillKV(answer []byte, prefill json.RawMessage) []byte {
	if prefill == nil {
		return answer
	}
	rb, err := parseRelayBody(answer)
	if err != nil || !rb.has("evolve") {
		return answer
	}
	ev, err := parseRelayBody(rb.members["evolve"])
	if err != nil || ev.members == nil {
		return answer
	}
	return rb.with(map[string]json.RawMessage{"evolve": ev.with(map[string]json.RawMessage{"prefill": prefill})})
}
