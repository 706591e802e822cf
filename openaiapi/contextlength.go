package openaiapi

import (
	"regexp"
	"strconv"
)

// A request overflows the model's context in one of two ways: its prompt
// alone fills it (ContextTooLong), or its prompt fits but the output it
// asks for (max_tokens) does not fit beside it (OutputTooLong). Both are
// refused in vLLM's words, so that a client that reads vLLM's refusals
// reads evolve's; ParseContextOverflow reads either back into numbers,
// for an API that words them its own way (anthropicapi, responsesapi).

// ContextTooLong is vLLM's refusal of a prompt of n tokens in a context
// of maxModelLen: n >= maxModelLen leaves no room for an answer.
func ContextTooLong(maxModelLen, n int) *Error {
	e := BadRequest("", "This model's maximum context length is %d tokens. However, your request has %d input tokens. "+
		"Please reduce the length of the input messages.", maxModelLen, n)
	e.Code = CodeContextLength
	return e
}

// OutputTooLong is vLLM's refusal of a request whose prompt of prompt
// tokens fits the context of maxModelLen but whose maxTokens do not fit
// beside it.
func OutputTooLong(maxModelLen, prompt, maxTokens int) *Error {
	e := BadRequest("max_tokens", "'max_tokens' or 'max_completion_tokens' is too large: %d. This model's maximum context "+
		"length is %d tokens and your request has %d input tokens (%d > %d - %d).", maxTokens, maxModelLen, prompt,
		maxTokens, maxModelLen, prompt)
	e.Code = CodeContextLength
	return e
}

// ContextOverflow is a refusal for the context's length, in numbers.
type ContextOverflow struct {
	MaxModelLen int
	Prompt      int
	// MaxTokens is the output asked for, when it is what overflowed the
	// context (OutputTooLong); 0 when the prompt alone did.
	MaxTokens int
}

// The wordings ParseContextOverflow reads: ContextTooLong's and
// OutputTooLong's (vLLM's), vLLM's older one, and evolve's engines'
// before they spoke vLLM's.
var (
	promptOverflow = regexp.MustCompile(`maximum context length is (\d+) tokens\. However, your (?:request|prompt) has (\d+) (?:input )?tokens`)
	outputOverflow = regexp.MustCompile(`'max_tokens' or 'max_completion_tokens' is too large: (\d+)\. This model's maximum context length is (\d+) tokens and your request has (\d+) input tokens`)
	olderOverflow  = regexp.MustCompile(`maximum context length is (\d+) tokens\. However, you requested \d+ tokens \((\d+) in the messages, (\d+) in the completion\)`)
	engineOverflow = regexp.MustCompile(`maximum context length is (\d+) tokens, but (\d+) prompt \+ (\d+) output tokens were requested`)
)

// ParseContextOverflow reads a refusal's message for the context's
// length (an engine's, or the router's own) back into its numbers; false
// when msg is no such refusal.
func ParseContextOverflow(msg string) (ContextOverflow, bool) {
	num := func(s string) int { n, _ := strconv.Atoi(s); return n }
	if m := outputOverflow.FindStringSubmatch(msg); m != nil {
		return ContextOverflow{MaxModelLen: num(m[2]), Prompt: num(m[3]), MaxTokens: num(m[1])}, true
	}
	if m := promptOverflow.FindStringSubmatch(msg); m != nil {
		return ContextOverflow{MaxModelLen: num(m[1]), Prompt: num(m[2])}, true
	}
	for _, re := range []*regexp.Regexp{olderOverflow, engineOverflow} {
		if m := re.FindStringSubmatch(msg); m != nil {
			c := ContextOverflow{MaxModelLen: num(m[1]), Prompt: num(m[2]), MaxTokens: num(m[3])}
			if c.Prompt >= c.MaxModelLen {
				c.MaxTokens = 0 // the prompt alone is too long
			}
			return c, true
		}
	}
	return ContextOverflow{}, false
}

// Refusal is the overflow refused in vLLM's words.
func (c ContextOverflow) Refusal() *Error {
	if c.MaxTokens == 0 {
		return ContextTooLong(c.MaxModelLen, c.Prompt)
	}
	return OutputTooLong(c.MaxModelLen, c.Prompt, c.MaxTokens)
}
