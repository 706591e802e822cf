package engine

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/evolvellm/evolve/protocol"
	"github.com/evolvellm/evolve/roles"
	"github.com/evolvellm/evolve/tokenizer"
)

// whole posts a chat request and reads its answer's length and finish.
func wholeAnswer(t *testing.T, url, extra string) (completion int, finish, text string) {
	t.Helper()
	body := `{"messages": [{"role": "user", "content": "fix the failing test in the parser"}], "max_tokens": 3000` + extra + `}`
	resp := postRaw(t, url+"/v1/chat/completions", []byte(body), false)
	defer resp.Body.Close()
	var out struct {
		Choices []struct {
			Message      struct{ Content string } `json:"message"`
			FinishReason string                   `json:"finish_reason"`
		} `json:"choices"`
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || len(out.Choices) != 1 {
		t.Fatalf("answer: %v %+v", err, out)
	}
	return out.Usage.CompletionTokens, out.Choices[0].FinishReason, out.Choices[0].Message.Content
}

// A simulated model ends its turn on its own, as a real one does, rather
// than writing to max_tokens: Claude Code asks for 32,000 tokens and
// waited minutes for each answer, then called it an error. The stop is the
// same for the same prompt (and on an engine that goes on with the
// answer); ignore_eos writes max_tokens, as vLLM's benchmarks ask, and
// min_tokens raises the stop.
func TestAnswerEndsOnItsOwn(t *testing.T) {
	_, srv := startEngine(t, "e", roles.Decode, 1000, nil)
	n, finish, text := wholeAnswer(t, srv.URL, "")
	if finish != "stop" || n < answerFloor || n >= 3000 {
		t.Fatalf("an answer of %d tokens ended for %q", n, finish)
	}
	if again, _, _ := wholeAnswer(t, srv.URL, ""); again != n {
		t.Fatalf("the same prompt ended at %d tokens, then at %d", n, again)
	}
	if got, finish, _ := wholeAnswer(t, srv.URL, `, "max_tokens": 40`); got != 40 || finish != "length" {
		t.Fatalf("max_tokens 40 below the natural stop: %d tokens, %q", got, finish)
	}
	if got, finish, _ := wholeAnswer(t, srv.URL, `, "ignore_eos": true`); got != 3000 || finish != "length" {
		t.Fatalf("ignore_eos: %d tokens, %q", got, finish)
	}
	if got, _, _ := wholeAnswer(t, srv.URL, fmt.Sprintf(`, "min_tokens": %d`, n+100)); got != n+100 {
		t.Fatalf("min_tokens %d: %d tokens", n+100, got)
	}

	// An engine that goes on with the answer after its first output ends
	// it at the same token.
	words := strings.Fields(text)
	out := tokenizer.Encode(" " + strings.Join(words[:10], " "))
	res, _ := json.Marshal(protocol.Resume{ID: "chatcmpl-moved", Created: 1, Output: out})
	got, finish, _ := wholeAnswer(t, srv.URL, `, "evolve_resume": `+string(res))
	if finish != "stop" || got != n {
		t.Fatalf("resumed after %d of %d tokens: %d in all, %q", len(out), n, got, finish)
	}
}
