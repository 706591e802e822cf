package openaiapi

import "encoding/json"

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
// checked: a list of token ids as it is read, any other by json.Valid. The
// values share b's bytes (capped, so appending to one copies it). When the
// member named idsOf is a list of token ids, its ids are appended to *ids:
// a router reads an agent's prompt once.
func splitObject(b []byte, idsOf string, ids *[]uint32) (map[string]json.RawMessage, bool) {
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
		if key == idsOf && ids != nil {
			keep = ids
			if *keep == nil {
				// An id and its comma take about as many bytes as a uint32.
				*keep = make([]uint32, 0, (len(b)-i)/4+1)
			}
		}
		end, ok := valueEnd(b, i, keep)
		if !ok {
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
// ends. A list of token ids is checked as it is read (its ids appended to
// *ids unless ids is nil); any other value is delimited (strings, nesting)
// and then checked by json.Valid, so what lies between the values is all
// splitObject has to check itself.
func valueEnd(b []byte, i int, ids *[]uint32) (int, bool) {
	if i >= len(b) {
		return 0, false
	}
	if b[i] == '[' {
		if n, ok := readIDs(b[i:], ids); ok {
			return i + n, true
		}
		if ids != nil {
			*ids = (*ids)[:0]
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
