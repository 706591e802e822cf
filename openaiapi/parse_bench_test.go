package openaiapi

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// benchBody is a completion request carrying n prompt token ids, as evolve
// bench's agents send their contexts.
func benchBody(n int) []byte {
	ids := make([]int, n)
	for i := range ids {
		ids[i] = 1000 + (i*7919)%120000
	}
	b, _ := json.Marshal(map[string]any{"model": "m", "prompt": ids, "max_tokens": 512, "stream": true,
		"stream_options": map[string]bool{"include_usage": true}})
	return b
}

// chatBody is a chat request whose history holds about n words.
func chatBody(n int) []byte {
	var sb strings.Builder
	for i := range n {
		fmt.Fprintf(&sb, " w%d", i%5000)
	}
	b, _ := json.Marshal(map[string]any{"model": "m", "messages": []map[string]string{
		{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": sb.String()}}, "max_tokens": 512})
	return b
}

// BenchmarkParse: what each front door (router, engine) spends reading a
// request, for a 32K- and a 128K-token context given as ids and for a
// 32K-word one as chat text. A request of ids is read three times on its
// way (the router, the prefill engine, the decode engine), all of it
// before its first token.
func BenchmarkParse(b *testing.B) {
	for _, c := range []struct {
		name string
		body []byte
		chat bool
	}{{"ids-32k", benchBody(32768), false}, {"ids-128k", benchBody(131072), false}, {"chat-32k-words", chatBody(32768), true}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(c.body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Parse(c.body, c.chat, 0); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkTokenIDs: what a router spends reading a vLLM engine's
// /tokenize answer for a 128K-token chat prompt, with TokenIDs and with
// encoding/json.
func BenchmarkTokenIDs(b *testing.B) {
	ids := make([]int, 131072)
	for i := range ids {
		ids[i] = (i * 7919) % 163840 // Kimi K2's vocabulary: larger than evolve's
	}
	body, _ := json.Marshal(map[string]any{"count": len(ids), "max_model_len": 262144, "tokens": ids, "token_strs": nil})
	b.Run("TokenIDs", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			if toks, err := TokenIDs(body, "tokens"); err != nil || len(toks) != len(ids) {
				b.Fatal(err, len(toks))
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			var out struct {
				Tokens []uint32 `json:"tokens"`
			}
			if err := json.Unmarshal(body, &out); err != nil || len(out.Tokens) != len(ids) {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkParseBodyUntokenized: a router whose engines tokenize (vLLM)
// reads a 32K-word chat request without tokenizing it, against ParseBody.
func BenchmarkParseBodyUntokenized(b *testing.B) {
	body := chatBody(32768)
	for _, c := range []struct {
		name  string
		parse func([]byte, bool, int) (*Parsed, Body, *Error)
	}{{"untokenized", ParseBodyUntokenized}, {"tokenized", ParseBody}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if _, _, err := c.parse(body, true, 0); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
