package engine

import (
	"fmt"
	"testing"

	"github.com/evolvellm/evolve/engine/stepmodel"
	"github.com/evolvellm/evolve/openaiapi"
)

// The engine refuses a request over the model's context in vLLM's words,
// which the router reads back into each API's own (openaiapi's
// ParseContextOverflow): a prompt that fills the context, and max tokens
// that do not fit beside a prompt that does.
func TestContextOverflowInVLLMsWords(t *testing.T) {
	for _, c := range []struct {
		err  error
		want openaiapi.ContextOverflow
	}{
		{&stepmodel.ContextOverflow{MaxModelLen: 1000, Prompt: 900, MaxTokens: 200}, openaiapi.ContextOverflow{MaxModelLen: 1000, Prompt: 900, MaxTokens: 200}},
		{&stepmodel.ContextOverflow{MaxModelLen: 1000, Prompt: 1200, MaxTokens: 16}, openaiapi.ContextOverflow{MaxModelLen: 1000, Prompt: 1200}},
		{fmt.Errorf("submit: %w", &stepmodel.ContextOverflow{MaxModelLen: 8, Prompt: 4, MaxTokens: 5}), openaiapi.ContextOverflow{MaxModelLen: 8, Prompt: 4, MaxTokens: 5}},
	} {
		e := submitError(c.err, true)
		got, ok := openaiapi.ParseContextOverflow(e.Message)
		if e.Status != 400 || e.Code != openaiapi.CodeContextLength || !ok || got != c.want || e.Message != c.want.Refusal().Message {
			t.Errorf("%v: refused %d %q %q, read as %+v", c.err, e.Status, e.Code, e.Message, got)
		}
	}
}
