package openaiapi

import (
	"encoding/json"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/evolvellm/evolve/tokenizer"
)

// A prompt of text over the model's context is refused, with its exact
// length as vLLM gives it, before its ids are made: a 4 MB prompt costs
// about its own size again, where its ids and a second reading of the
// body cost six times it.
func TestPromptOverTheContextIsRefusedBeforeItsIDs(t *testing.T) {
	text := strings.Repeat("lorem ipsum dolor sit amet, ", 4<<20/28)
	n := len(tokenizer.Encode(text))
	body, _ := json.Marshal(map[string]any{"prompt": text, "max_tokens": 4})
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, _, err := ParseBodyWith(body, BodyOptions{MaxModelLen: 1000})
	runtime.ReadMemStats(&after)
	if err == nil || err.Status != 400 || err.Code != CodeContextLength || err.Message != ContextTooLong(1000, n).Message {
		t.Fatalf("a prompt of %d tokens in a context of 1000: %+v", n, err)
	}
	if cost := float64(after.TotalAlloc-before.TotalAlloc) / float64(len(body)); cost > 2 {
		t.Fatalf("refusing a prompt over the context allocated %.1fx its body", cost)
	}

	chat, _ := json.Marshal(map[string]any{"messages": []map[string]string{{"role": "system", "content": "be brief"}, {"role": "user", "content": text}}})
	if _, _, err := ParseBodyWith(chat, BodyOptions{Chat: true, MaxModelLen: 1000}); err == nil || err.Code != CodeContextLength ||
		!strings.Contains(err.Message, "your request has") {
		t.Fatalf("chat messages over the context: %+v", err)
	}
}

// A prompt that fits, counted first because its bytes could have made too
// many tokens, gets the ids it gets without a limit; one of exactly the
// context's length is refused.
func TestPromptNearTheContextGetsItsIDs(t *testing.T) {
	text := strings.Repeat("the cat sat on the mat. ", 40)
	ids := tokenizer.Encode(text)
	for _, chat := range []bool{false, true} {
		var body []byte
		if chat {
			body, _ = json.Marshal(map[string]any{"messages": []map[string]string{{"role": "user", "content": text}}})
		} else {
			body, _ = json.Marshal(map[string]any{"prompt": text})
		}
		free, _, err := ParseBodyWith(body, BodyOptions{Chat: chat})
		if err != nil {
			t.Fatal(err)
		}
		if !chat && !slices.Equal(free.Tokens, ids) {
			t.Fatal("the completion prompt's ids are not the tokenizer's")
		}
		fits, _, err := ParseBodyWith(body, BodyOptions{Chat: chat, MaxModelLen: len(free.Tokens) + 1})
		if err != nil || !slices.Equal(fits.Tokens, free.Tokens) {
			t.Fatalf("chat %v: a prompt one token short of the context: %v", chat, err)
		}
		if _, _, err := ParseBodyWith(body, BodyOptions{Chat: chat, MaxModelLen: len(free.Tokens)}); err == nil || err.Code != CodeContextLength {
			t.Fatalf("chat %v: a prompt as long as the context: %v", chat, err)
		}
	}
}

// Each refusal for the context's length reads back into the numbers it
// was made of, in vLLM's wordings old and new and in evolve's engines'
// older one, so that an API with words of its own can say the same.
func TestContextOverflowReadsBack(t *testing.T) {
	for _, c := range []struct {
		msg  string
		want ContextOverflow
	}{
		{ContextTooLong(262144, 270000).Message, ContextOverflow{MaxModelLen: 262144, Prompt: 270000}},
		{OutputTooLong(262144, 228097, 64000).Message, ContextOverflow{MaxModelLen: 262144, Prompt: 228097, MaxTokens: 64000}},
		{"This model's maximum context length is 4096 tokens. However, you requested 5000 tokens (4000 in the messages, 1000 in the completion). Please reduce the length of the messages or completion.",
			ContextOverflow{MaxModelLen: 4096, Prompt: 4000, MaxTokens: 1000}},
		{"request exceeds the model's context: maximum context length is 262144 tokens, but 228097 prompt + 64000 output tokens were requested",
			ContextOverflow{MaxModelLen: 262144, Prompt: 228097, MaxTokens: 64000}},
		{"request exceeds the model's context: maximum context length is 1000 tokens, but 1200 prompt + 16 output tokens were requested",
			ContextOverflow{MaxModelLen: 1000, Prompt: 1200}},
	} {
		got, ok := ParseContextOverflow(c.msg)
		if !ok || got != c.want {
			t.Errorf("%q: read %+v (%v), want %+v", c.msg, got, ok, c.want)
		}
		if ok && got.Refusal().Code != CodeContextLength {
			t.Errorf("%q: its refusal has code %q", c.msg, got.Refusal().Code)
		}
	}
	if _, ok := ParseContextOverflow("max_tokens must be at least 1"); ok {
		t.Error("a refusal of another kind read as a context overflow")
	}
}
