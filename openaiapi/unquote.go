package openaiapi

import (
	"strconv"
	"unicode/utf8"
)

// unquote reads a JSON string literal that a checked body holds (so
// valid JSON) in one pass, as json.Unmarshal into a string reads it; false
// for what it leaves to encoding/json: a surrogate escape (\ud83d...) or
// bytes that are not UTF-8, which encoding/json rewrites. A message's
// content is most of an agent's chat request, 100K tokens of it read
// again for every turn; encoding/json would check it once more first.
func unquote(raw []byte) (string, bool) {
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return "", false
	}
	in := raw[1 : len(raw)-1]
	i := 0
	for i < len(in) && in[i] != '\\' && in[i] != '"' && in[i] < utf8.RuneSelf {
		i++
	}
	if i == len(in) {
		return string(in), true
	}
	out := make([]byte, 0, len(in))
	out = append(out, in[:i]...)
	for i < len(in) {
		c := in[i]
		switch {
		case c == '"' || c < 0x20:
			return "", false // not one valid literal
		case c >= utf8.RuneSelf:
			r, n := utf8.DecodeRune(in[i:])
			if r == utf8.RuneError && n == 1 {
				return "", false
			}
			out = append(out, in[i:i+n]...)
			i += n
		case c != '\\':
			out = append(out, c)
			i++
		default:
			if i+1 >= len(in) {
				return "", false
			}
			e := in[i+1]
			i += 2
			switch e {
			case '"', '\\', '/':
				out = append(out, e)
			case 'b':
				out = append(out, '\b')
			case 'f':
				out = append(out, '\f')
			case 'n':
				out = append(out, '\n')
			case 'r':
				out = append(out, '\r')
			case 't':
				out = append(out, '\t')
			case 'u':
				if i+4 > len(in) {
					return "", false
				}
				v, err := strconv.ParseUint(string(in[i:i+4]), 16, 16)
				if err != nil || v >= 0xd800 && v < 0xe000 {
					return "", false
				}
				out = utf8.AppendRune(out, rune(v))
				i += 4
			default:
				return "", false
			}
		}
	}
	return string(out), true
}
