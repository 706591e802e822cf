package engine

import (
	"github.com/evolvellm/evolve/protocol"
)

// usageJSON is OpenAI's usage object.
type usageJSON struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

type completionChoice struct {
	Index        int     `json:"index"`
	Text         string  `json:"text"`
	Logprobs     any     `json:"logprobs"`
	FinishReason *string `json:"finish_reason"`
}

type chatDelta struct {
	Role      string         `json:"role,omitempty"`
	Content   *string        `json:"content"` // null in a tool call's message
	ToolCalls []toolCallJSON `json:"tool_calls,omitempty"`
}

// text is a delta or message with content s.
func text(s string) *chatDelta { return &chatDelta{Content: &s} }

type chatChoice struct {
	Index        int        `json:"index"`
	Message      *chatDelta `json:"message,omitempty"`
	Delta        *chatDelta `json:"delta,omitempty"`
	Logprobs     any        `json:"logprobs"`
	FinishReason *string    `json:"finish_reason"`
}

// apiResponse is a completion, chat completion, or one chunk of either.
type apiResponse struct {
	ID               string               `json:"id"`
	Object           string               `json:"object"`
	Created          int64                `json:"created"`
	Model            string               `json:"model"`
	Choices          any                  `json:"choices"`
	Usage            *usageJSON           `json:"usage,omitempty"`
	KVTransferParams map[string]any       `json:"kv_transfer_params,omitempty"`
	Evolve           *protocol.ResponseKV `json:"evolve,omitempty"`
}
