package openaiapi

import (
	"encoding/json"
	"strings"
	"testing"
)

// A body encoding/json cannot decode is refused in the API's words, with
// nothing of Go's types in them.
func TestDecodeErrorTextSaysItInTheAPIsWords(t *testing.T) {
	for _, c := range []struct{ body, want string }{
		{`{"max_tokens": "three"}`, "max_tokens must be a whole number, not a string"},
		{`{"messages": "hi"}`, "messages must be a list, not a string"},
		{`{"stream": 1}`, "stream must be true or false, not a number"},
		{`{"max_tokens": 1.5}`, "max_tokens must be a whole number, not the number 1.5"},
		{`[1]`, "expected an object, found a list"},
		{`{"model": }`, "not valid JSON (at byte 11)"},
	} {
		var r Request
		err := json.Unmarshal([]byte(c.body), &r)
		got := DecodeErrorText(err)
		if !strings.HasPrefix(got, c.want) || strings.Contains(got, "Go ") || strings.Contains(got, "openaiapi.") {
			t.Errorf("%s: %q (encoding/json: %v), want %q", c.body, got, err, c.want)
		}
	}
}
