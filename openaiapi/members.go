package openaiapi

import (
	"bytes"
	"encoding/json"
)

// splitOptions say what splitObject does besides splitting: it reads the
// token ids of the member named name (below limit) into ids, and, when
// decoded, leaves the other members unchecked.
type splitOptions struct {
	name  string
	limit uint64
	ids   []uint32
	// decoded says the caller decodes every other member with
	// encoding/json, which checks it: splitObject only delimits them
	// (json.Valid would read an agent's 100K tokens of messages once more).
	decoded bool
}

// anyID bounds no id that a list's nine-digit numbers can hold.
const anyID = 1 << 32

// TokenIDs reads the member name of a JSON object, a list of token ids
// (vLLM's /tokenize answer has them under "tokens"), in one pass where it
// can and with encoding/json otherwise. A missing member is no ids.
func TokenIDs(b []byte, name string) ([]uint32, error) {
	want := splitOptions{name: name, limit: anyID}
	m, ok := splitObject(b, &want)
	if ok && want.ids != nil {
		return want.ids, nil
	}
	if !ok {
		if err := json.Unmarshal(b, &m); err != nil {
			return nil, err
		}
	}
	raw, ok := m[name]
	if !ok {
		return nil, nil
	}
	var ids []uint32
	if err := json.Unmarshal(raw, &ids); err != nil {
		return nil, err
	}
	return ids, nil
}

// splitObject splits a JSON object into its top-level members in one pass,
// giving what json.Unmarshal into a map of raw messages gives, without
// encoding/json's two passes over every value (one to check the body, one
// to find each value's end). An agent's prompt of 128K token ids is most
// of its request, and the router and both engines read each request: done
// by encoding/json, that costs several milliseconds of time to first token
// per 32K tokens.
//
// ok is false for a body it leaves to encoding/json: not an object, a key
// with an escape or a byte outside printable ASCII (encoding/json would
// rewrite it), a key given twice, or anything invalid. Every value is
// checked (but those want.decoded leaves to its caller): a list of token
// ids as it is read, any other by json.Valid. The values share b's bytes
// (capped, so appending to one copies it). When the member want names is a
// list of token ids within its bound, they are put in want.ids (nil want:
// none): a router reads an agent's prompt once.
func splitObject(b []byte, want *splitOptions) (map[string]json.RawMessage, bool) {
	m, ok := split(b, want)
	if !ok && want != nil {
		want.ids = nil
	}
	return m, ok
}

// split is splitObject, but for the ids it may have read of a body it then
// refuses.
func split(b []byte, want *splitOptions) (map[string]json.RawMessage, bool) {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return nil, false
	}
	m := map[string]json.RawMessage{}
	if i = skipSpace(b, i+1); i < len(b) && b[i] == '}' {
		return m, skipSpace(b, i+1) == len(b)
	}
	for {
		key, next, ok := plainKey(b, i)
		if !ok {
			return nil, false
		}
		if _, dup := m[key]; dup {
			return nil, false
		}
		if i = skipSpace(b, next); i >= len(b) || b[i] != ':' {
			return nil, false
		}
		i = skipSpace(b, i+1)
		var keep *[]uint32
		limit := uint64(anyID)
		wanted := want != nil && key == want.name
		if wanted && i < len(b) && b[i] == '[' {
			want.ids = make([]uint32, 0, idsIn(b[i:]))
			keep, limit = &want.ids, want.limit
		}
		var end int
		if want != nil && want.decoded && !wanted && i < len(b) {
			if end = delimit(b, i); end <= i {
				return nil, false
			}
		} else if end, ok = valueEnd(b, i, keep, limit); !ok {
			return nil, false
		}
		m[key] = json.RawMessage(b[i:end:end])
		if i = skipSpace(b, end); i >= len(b) {
			return nil, false
		}
		switch b[i] {
		case ',':
			i = skipSpace(b, i+1)
		case '}':
			return m, skipSpace(b, i+1) == len(b)
		default:
			return nil, false
		}
	}
}

// idsIn is how many ids the list that starts b holds, for sizing their
// slice: its commas up to its first ']', plus one, found by two of the
// bytes package's vector loops (cheap beside reading the ids). The slice
// is kept for the request's life, so a guess from the bytes (an id and its
// comma take about as many bytes as a uint32, most ids more) held up to a
// third more than the ids. A list that is nested or unclosed (refused
// later) gets that guess or grows.
func idsIn(b []byte) int {
	end := bytes.IndexByte(b, ']')
	if end < 0 {
		return len(b)/4 + 1
	}
	return bytes.Count(b[:end], []byte{','}) + 1
}

// plainKey reads the key that starts at b[i]: a string of printable ASCII
// without escapes. It returns the key and where it ends.
func plainKey(b []byte, i int) (string, int, bool) {
	if i >= len(b) || b[i] != '"' {
		return "", 0, false
	}
	for j := i + 1; j < len(b); j++ {
		switch c := b[j]; {
		case c == '"':
			return string(b[i+1 : j]), j + 1, true
		case c == '\\' || c < 0x20 || c >= 0x7f:
			return "", 0, false
		}
	}
	return "", 0, false
}

// valueEnd checks the JSON value that starts at b[i] and returns where it
// ends. A list of token ids below limit is checked as it is read (its ids
// appended to *ids unless ids is nil; left nil if it is not such a list);
// any other value is delimited (strings, nesting) and then checked by
// json.Valid, so what lies between the values is all splitObject has to
// check itself.
func valueEnd(b []byte, i int, ids *[]uint32, limit uint64) (int, bool) {
	if i >= len(b) {
		return 0, false
	}
	if b[i] == '[' {
		if n, ok := readIDs(b[i:], ids, limit); ok {
			return i + n, true
		}
		if ids != nil {
			*ids = nil
		}
	}
	end := delimit(b, i)
	return end, end > i && json.Valid(b[i:end])
}

// delimit returns where the value that starts at b[i] would end if it were
// valid: after its closing quote or bracket, or before the next
// delimiter. It returns i when it finds no end.
func delimit(b []byte, i int) int {
	switch b[i] {
	case '"':
		if j := stringEnd(b, i); j > 0 {
			return j
		}
		return i
	case '[', '{':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '[', '{':
				depth++
			case ']', '}':
				if depth--; depth == 0 {
					return j + 1
				}
			case '"':
				k := stringEnd(b, j)
				if k < 0 {
					return i
				}
				j = k - 1
			}
		}
		return i
	}
	j := i
	for j < len(b) {
		switch b[j] {
		case ',', '}', ']', ' ', '\t', '\r', '\n':
			return j
		}
		j++
	}
	return j
}

// stringEnd returns where the string that starts at b[i] ends (after its
// closing quote), or -1.
func stringEnd(b []byte, i int) int {
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			j++
		case '"':
			return j + 1
		}
	}
	return -1
}
