package loadgen

import (
	"bytes"
	"unicode/utf8"
)

// An answer streams as one server-sent event per token, each a JSON
// object of a dozen members of which the load generator needs one, the
// token's text. Decoding every one with encoding/json took more than
// half the CPU of a load generator driving a cluster at 26K tokens/s;
// tokenText reads that text from a plain token event directly.

var (
	textKey     = []byte(`"text":"`)
	textName    = []byte(`"text"`)
	choicesKey  = []byte(`"choices":[`)
	choicesName = []byte(`"choices"`)
	// Members whose presence needs the whole decode: an error, evolve's
	// KV story, and the answer's usage unless it is null.
	slowKeys  = [][]byte{[]byte(`"error"`), []byte(`"evolve"`)}
	usageName = []byte(`"usage"`)
	usageNull = []byte(`"usage":null`)
)

// tokenText returns the text of event, a completion chunk, when it is a
// plain token event as evolve's engines and vLLM write them: its choices
// begin `"choices":[{"index":N,"text":"` (or without the index), the text
// has no escapes and is valid UTF-8, no other string is "text", and
// none of the members that need decoding (error, evolve, usage but null)
// is there.
// ok is false otherwise, and the caller decodes the event whole. The text
// shares event's bytes.
//
// In valid JSON these byte patterns can only be what they look like: a
// quote inside a string is escaped, and one that closes a string is never
// followed by a letter.
func tokenText(event []byte) (text []byte, ok bool) {
	if len(event) == 0 || event[0] != '{' {
		return nil, false
	}
	for _, k := range slowKeys {
		if bytes.Contains(event, k) {
			return nil, false
		}
	}
	// vLLM writes "usage":null in every event of a stream whose usage it
	// sends at the end: no usage.
	if n := bytes.Count(event, usageName); n > 0 && n != bytes.Count(event, usageNull) {
		return nil, false
	}
	i := bytes.Index(event, choicesKey)
	if i < 0 || bytes.Count(event, choicesName) != 1 {
		return nil, false
	}
	rest := event[i+len(choicesKey):]
	if rest, ok = bytes.CutPrefix(rest, []byte(`{`)); !ok {
		return nil, false
	}
	if r, ok := bytes.CutPrefix(rest, []byte(`"index":`)); ok {
		n := 0
		for n < len(r) && r[n] >= '0' && r[n] <= '9' {
			n++
		}
		if n == 0 || n == len(r) || r[n] != ',' {
			return nil, false
		}
		rest = r[n+1:]
	}
	if rest, ok = bytes.CutPrefix(rest, textKey); !ok {
		return nil, false
	}
	end := bytes.IndexByte(rest, '"')
	if end < 0 || bytes.IndexByte(rest[:end], '\\') >= 0 {
		return nil, false
	}
	text = rest[:end]
	for _, c := range text {
		if c < 0x20 { // a control character: not valid JSON
			return nil, false
		}
	}
	if !utf8.Valid(text) { // encoding/json would replace what is not
		return nil, false
	}
	if bytes.Contains(rest[end:], textName) || bytes.Contains(event[:i], textName) {
		return nil, false // several choices, or text elsewhere
	}
	return text, true
}
