package loadgen

import (
	"encoding/json"
	"testing"
)

// chunkTextAsJSON is what the load generator's whole decode makes of an
// event: the first choice's text, and whether the event is one of those
// tokenText may read (valid JSON without error, evolve or usage).
func chunkTextAsJSON(event []byte) (text string, plain, valid bool) {
	var c struct {
		Choices []struct {
			Text string `json:"text"`
		} `json:"choices"`
		Usage  *json.RawMessage `json:"usage"`
		Error  *json.RawMessage `json:"error"`
		Evolve *json.RawMessage `json:"evolve"`
	}
	if err := json.Unmarshal(event, &c); err != nil {
		return "", false, false
	}
	if len(c.Choices) > 0 {
		text = c.Choices[0].Text
	}
	return text, c.Usage == nil && c.Error == nil && c.Evolve == nil, true
}

// The token events evolve's engines and vLLM write are read without a
// decode, to the text encoding/json reads; the others are left to it.
func TestTokenTextReadsPlainTokenEvents(t *testing.T) {
	for _, tc := range []struct {
		event string
		want  string
		fast  bool
	}{
		{`{"id":"cmpl-engine-1-19","object":"text_completion","created":1796191662,"model":"zai-org/GLM-5","choices":[{"index":0,"text":" lezo","logprobs":null,"finish_reason":null}]}`, " lezo", true},
		{`{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" Hello","logprobs":null,"finish_reason":null,"stop_reason":null}],"usage":null}`, " Hello", true},
		{`{"choices":[{"text":"é"}]}`, "é", true},
		{`{"choices":[{"index":0,"text":""}]}`, "", true},
		// Escapes, usage, evolve's KV story, several choices: decoded.
		{`{"choices":[{"index":0,"text":"a\"b"}]}`, `a"b`, false},
		{`{"choices":[{"index":0,"text":"\u00e9"}]}`, "é", false},
		{`{"choices":[{"index":0,"text":"","finish_reason":"length"}],"usage":{"prompt_tokens":3,"completion_tokens":2}}`, "", false},
		{`{"choices":[{"index":0,"text":"x"}],"evolve":{"gpu_hit_tokens":64}}`, "x", false},
		{`{"choices":[{"index":0,"text":"a"},{"index":1,"text":"b"}]}`, "a", false},
		{`{"choices":[{"logprobs":null,"text":"late"}]}`, "late", false},
		{`{"meta":{"text":"no"},"choices":[{"text":"yes"}]}`, "yes", false},
	} {
		t.Run(tc.event, func(t *testing.T) {
			text, ok := tokenText([]byte(tc.event))
			if ok != tc.fast || (ok && string(text) != tc.want) {
				t.Errorf("%s: tokenText %q, %v; want %q, %v", tc.event, text, ok, tc.want, tc.fast)
			}
			if got, _, valid := chunkTextAsJSON([]byte(tc.event)); !valid || got != tc.want {
				t.Errorf("%s: encoding/json reads %q (valid %v), the case says %q", tc.event, got, valid, tc.want)
			}
		})
	}
}

// Whatever tokenText reads from valid JSON is what encoding/json reads,
// and it reads no event that carries usage, an error or evolve's story.
func FuzzTokenText(f *testing.F) {
	for _, s := range []string{
		`{"id":"cmpl-engine-1-19","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" lezo","logprobs":null,"finish_reason":null}]}`,
		`{"choices":[{"index":0,"text":" Hello","stop_reason":null}],"usage":null}`,
		`{"choices":[{"text":"a"}],"text":"b"}`,
		`{"choices":[{"text":"a"}],"choices":[{"text":"b"}]}`,
		`{"choices":[{"index":0,"text":"x"}],"usage":{"prompt_tokens":1}}`,
		`{"choices":[{"text":"a","text":null}]}`,
		`{"choices":[{"text":"a","text":"b"}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, event []byte) {
		text, ok := tokenText(event)
		if !ok {
			return
		}
		want, plain, valid := chunkTextAsJSON(event)
		if valid && (!plain || string(text) != want) {
			t.Fatalf("%s: tokenText %q; encoding/json %q (plain %v)", event, text, want, plain)
		}
	})
}

// BenchmarkTokenEvent is the load generator's cost per streamed token:
// reading a token event's text, directly (tokenText) and with
// encoding/json (what it did for every event before).
func BenchmarkTokenEvent(b *testing.B) {
	event := []byte(`{"id":"cmpl-engine-1-19","object":"text_completion","created":1796191662,"model":"zai-org/GLM-5","choices":[{"index":0,"text":" lezo","logprobs":null,"finish_reason":null}]}`)
	b.Run("tokenText", func(b *testing.B) {
		for b.Loop() {
			if _, ok := tokenText(event); !ok {
				b.Fatal("not read")
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		for b.Loop() {
			if _, _, ok := chunkTextAsJSON(event); !ok {
				b.Fatal("not read")
			}
		}
	})
}
