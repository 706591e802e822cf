package openaiapi

import (
	"bytes"
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/evolvellm/evolve/tokenizer"
)

// FuzzParse sends arbitrary bodies through the parser both front doors
// share: it answers every one with a request or an OpenAI-shaped 4xx,
// never a panic, and what it accepts has a prompt and a token budget.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		`{"prompt": "Hello, agent", "max_tokens": 8}`,
		`{"prompt": [[1, 2, 3]], "kv_transfer_params": {"do_remote_decode": true}}`,
		`{"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "max_completion_tokens": 4}`,
		`{"messages": [{"role": "system", "content": null}], "n": 2}`,
		`{"prompt": ["a"], "metadata": {"session": "s", "branch": 3}}`,
	} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	f.Fuzz(func(t *testing.T, body []byte, chat bool) {
		p, err := Parse(body, chat, 0)
		if err != nil {
			if err.Status < 400 || err.Status >= 500 || err.Message == "" {
				t.Fatalf("error %+v", err)
			}
			return
		}
		if len(p.Tokens) == 0 || p.MaxTokens < 1 {
			t.Fatalf("accepted %d prompt tokens, max_tokens %d", len(p.Tokens), p.MaxTokens)
		}
	})
}

// referencePromptTokens reads a prompt with encoding/json alone: what
// promptTokens did before it read token ids itself.
func referencePromptTokens(raw json.RawMessage) ([]uint32, *Error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, BadRequest("prompt", "prompt is required")
	}
	return decodePrompt(raw, parseOptions{})
}

// FuzzPromptTokens: reading token ids in one pass gives what encoding/json
// gives, ids and errors alike, for any prompt a valid body can carry.
func FuzzPromptTokens(f *testing.F) {
	for _, s := range []string{
		`[1, 2, 3]`, `[[1,2,3]]`, ` [ [ 7 ] ] `, `[]`, `[[]]`, `[[1],[2]]`, `[0]`, `[00]`, `[-1]`, `[1.0]`, `[1e3]`,
		`[131071]`, `[131072]`, `[99999999999999999999]`, `["a"]`, `"hi"`, `""`, `[1, "a"]`, `[[1], 2]`, `[1]  `, `{"a": 1}`,
		`[ 1 ,2 , 3 ]`, "[1,\n2\t,3\r]", `[[1, 2]  ]`, `null`, `true`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		if !json.Valid(raw) {
			return // a prompt comes out of a body encoding/json read
		}
		got, gerr := promptTokens(raw, parseOptions{})
		want, werr := referencePromptTokens(raw)
		if !slices.Equal(got, want) || (gerr == nil) != (werr == nil) || (gerr != nil && gerr.Message != werr.Message) {
			t.Fatalf("prompt %q: got %v %v, want %v %v", raw, got, gerr, want, werr)
		}
	})
}

// FuzzParseBody: the router's ParseBody reads a body as the engines' Parse
// does, accepting and refusing the same bodies with the same words, and
// keeps every member the client sent.
func FuzzParseBody(f *testing.F) {
	for _, s := range []string{
		`{"prompt": [1, 2, 3], "max_tokens": 8, "stream": true, "temperature": 0.2}`,
		`{"prompt": "Hello", "Prompt": [4, 5]}`, `{"PROMPT": [1]}`, `{"prompt": null}`, `{"prompt": [1], "prompt": [2, 3]}`,
		`{"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 4}`, `null`, `[1]`, `"x"`, `{}`,
		`{"prompt": [1], "max_tokens": "8"}`, `{"prompt": [[7, 8]], "kv_transfer_params": {"do_remote_decode": true}}`,
		`{"prompt": [1], "metadata": {"session": "s"}, "n": 2}`, `{"prompt": [1] `,
	} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	f.Fuzz(func(t *testing.T, body []byte, chat bool) {
		want, werr := Parse(body, chat, 0)
		got, b, gerr := ParseBody(body, chat, 0)
		if (werr == nil) != (gerr == nil) || (werr != nil && *werr != *gerr) {
			t.Fatalf("body %q: ParseBody says %v, Parse %v", body, gerr, werr)
		}
		if werr != nil {
			return
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("body %q: ParseBody read %+v, Parse %+v", body, got, want)
		}
		var members map[string]json.RawMessage
		json.Unmarshal(body, &members)
		if !bytes.Equal(b.Raw, body) || !reflect.DeepEqual(b.Members, members) {
			t.Fatalf("body %q: kept %q %v", body, b.Raw, b.Members)
		}
	})
}

// FuzzSplitObject: reading a body's members in one pass gives what
// encoding/json gives, members and refusals alike.
func FuzzSplitObject(f *testing.F) {
	for _, s := range []string{
		`{"prompt": [1, 2, 3], "max_tokens": 8}`, `{}`, ` { } `, `{"a":1 "b":2}`, `{"a":1,}`, `{"a":[1,2}`, `{"a":"\"}"}`,
		`{"a":{"b":[1,{"c":"]"}]}}`, `{"a":1}x`, `{"a":tru}`, `{"a":01}`, `{"prompt":[01]}`, `{"prompt":[1,2]]}`,
		`{"prompt":[[1,2]}`, `{"a":1,"a":2}`, `{"A":1,"a":2}`, `{"\u0061":1}`, "{\"a\x01\":1}", "{\"\xff\":1}",
		`{"prompt":[1 ,2 , 3 ]}`, `{"prompt":[]}`, `{"prompt":[-1]}`, `{"prompt":[1e3]}`, `{"s":"a\\"}`, `null`, `[1]`,
		`{"count": 3, "max_model_len": 8192, "tokens": [163839, 0, 7], "token_strs": null}`, `{"tokens": [4294967296]}`,
		`{"tokens": []}`, `{"tokens": null}`, `{"Tokens": [1]}`, `{"tokens": [1], "tokens": [2]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var want map[string]json.RawMessage
		werr := json.Unmarshal(body, &want)
		got, gerr := ParseObject(body)
		if (werr == nil) != (gerr == nil) {
			t.Fatalf("body %q: ParseObject says %v, encoding/json %v", body, gerr, werr)
		}
		if werr == nil && !reflect.DeepEqual(got.Members, want) {
			t.Fatalf("body %q: members %q, encoding/json %q", body, got.Members, want)
		}
		prompt := splitOptions{name: "prompt", limit: tokenizer.VocabSize}
		if m, ok := splitObject(body, &prompt); ok {
			if werr != nil {
				t.Fatalf("body %q: split although encoding/json says %v", body, werr)
			}
			if want, _ := scanIDs(m["prompt"]); !slices.Equal(prompt.ids, want) {
				t.Fatalf("body %q: prompt ids %v, want %v", body, prompt.ids, want)
			}
		}
		// Split for a caller that decodes the other members itself: the
		// same members for any valid body.
		lazy := splitOptions{name: "prompt", limit: tokenizer.VocabSize, decoded: true}
		if m, ok := splitObject(body, &lazy); ok && werr == nil && !reflect.DeepEqual(m, want) {
			t.Fatalf("body %q: members %q (decoded later), encoding/json %q", body, m, want)
		}
		// vLLM's /tokenize answer, its ids unbounded by evolve's vocabulary.
		var tokens []uint32
		aerr := werr
		if raw, ok := want["tokens"]; werr == nil && ok {
			aerr = json.Unmarshal(raw, &tokens)
		}
		ids, err := TokenIDs(body, "tokens")
		if (aerr == nil) != (err == nil) || (err == nil && !slices.Equal(ids, tokens)) {
			t.Fatalf("body %q: tokens %v (%v), encoding/json %v (%v)", body, ids, err, tokens, aerr)
		}
	})
}

// FuzzParseAsEncodingJSON: Parse, which reads a completion's members and
// its token ids in one pass, accepts and refuses what encoding/json alone
// does, with the same words.
func FuzzParseAsEncodingJSON(f *testing.F) {
	for _, s := range []string{
		`{"prompt": [1, 2, 3], "max_tokens": 8, "stream": true}`, `{"prompt": [1], "max_tokens": "8", "stream": "x"}`,
		`{"stream": "x", "prompt": [1], "max_tokens": "8"}`, `{"prompt": [1], "MAX_TOKENS": 3, "max_tokens": 4}`,
		`{"max_tokens": 4, "MAX_TOKENS": 3, "prompt": [1]}`, `{"prompt": [131072]}`, `{"prompt": [[1, 2]]}`,
		`{"prompt": [1], "n": 2}`, `{"prompt": [], "max_tokens": 1}`, `{"prompt": [1], "kv_transfer_params": {"do_remote_decode": true}}`,
		`{"prompt": "text", "seed": 3}`, `{"prompt": [1], "max_tokens": 0}`, `{"prompt": [1], "Prompt": [2]}`,
		`{"prompt": [1], "prompt": [2, 3]}`, `{"prompt": "a", "prompt": [2]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		want, werr := parse(body, parseOptions{})
		got, gerr := Parse(body, false, 0)
		if (werr == nil) != (gerr == nil) || (werr != nil && *werr != *gerr) {
			t.Fatalf("body %q: Parse says %v, encoding/json %v", body, gerr, werr)
		}
		if werr == nil && !reflect.DeepEqual(got, want) {
			t.Fatalf("body %q: Parse read %+v, encoding/json %+v", body, got, want)
		}
	})
}

// FuzzParseBodyUntokenized: a router whose engines tokenize reads a body
// as ParseBody does, refusing the same bodies with the same words, but
// leaves a prompt of text or messages untokenized.
func FuzzParseBodyUntokenized(f *testing.F) {
	for _, s := range []string{
		`{"prompt": [1, 2, 3], "max_tokens": 8}`, `{"prompt": "Hello, agent"}`, `{"prompt": ["Hello"]}`, `{"prompt": [[4, 5]]}`,
		`{"prompt": ""}`, `{"prompt": ["a", "b"]}`, `{"messages": [{"role": "user", "content": "hi"}]}`,
		`{"messages": [{"role": "", "content": "hi"}]}`, `{"messages": [{"role": "user", "content": 3}]}`,
		`{"messages": [{"role": "user", "content": "hi"}], "continue_final_message": true}`,
		`{"messages": [{"role": "assistant", "content": [{"type": "text", "text": "so"}]}], "continue_final_message": true, "tools": [{"type": "function"}]}`,
	} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	f.Fuzz(func(t *testing.T, body []byte, chat bool) {
		want, _, werr := ParseBody(body, chat, 0)
		got, b, gerr := ParseBodyUntokenized(body, chat, 0)
		if (werr == nil) != (gerr == nil) || (werr != nil && *werr != *gerr) {
			t.Fatalf("body %q: untokenized says %v, ParseBody %v", body, gerr, werr)
		}
		if werr != nil {
			return
		}
		for k := range b.Members {
			if k != "prompt" && strings.EqualFold(k, "prompt") {
				return // encoding/json's pick among such names is not this test's
			}
		}
		prompt := bytes.TrimLeft(b.Members["prompt"], " \t\r\n[")
		text := chat || len(prompt) > 0 && prompt[0] == '"'
		if text != (got.Tokens == nil) || (!text && !slices.Equal(got.Tokens, want.Tokens)) {
			t.Fatalf("body %q: untokenized read %v, ParseBody %v", body, got.Tokens, want.Tokens)
		}
		got.Tokens = want.Tokens
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("body %q: untokenized read %+v, ParseBody %+v", body, got, want)
		}
	})
}

// FuzzUnquote: a message's text read in one pass is what encoding/json
// reads, for every string literal it takes.
func FuzzUnquote(f *testing.F) {
	for _, s := range []string{`"plain"`, `"a\nb\t\"c\"\\d\/e"`, `"\u00e9\u4e2d"`, `"\ud83d\ude00"`, `"\ud83d"`, `"é中"`,
		"\"\xff\"", `"\b\f\r"`, `""`, `"\u0000"`, `"x\\"`, `"a"b"`, `"\uZZZZ"`, `"\x"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		got, ok := unquote(raw)
		var want string
		if err := json.Unmarshal(raw, &want); err != nil {
			if ok && json.Valid(raw) {
				t.Fatalf("%q: read %q where encoding/json refuses", raw, got)
			}
			return
		}
		if ok && got != want {
			t.Fatalf("%q: read %q, encoding/json %q", raw, got, want)
		}
	})
}
