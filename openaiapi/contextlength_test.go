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
		!strings.Contains(err.Message, "your prompt has") {
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
