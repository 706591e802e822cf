package engine

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/evolvellm/evolve/protocol"
	"github.com/evolvellm/evolve/tokenizer"
)

// apiRequest is the union of the completion and chat completion request
// bodies that the engine reads. Unknown fields are ignored, as OpenAI's
// servers do; sampling parameters have no effect on a simulated engine.
type apiRequest struct {
	Model               string          `json:"model"`
	Prompt              json.RawMessage `json:"prompt"`
	Messages            []chatMessage   `json:"messages"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Stream              bool            `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	N                *int            `json:"n"`
	Seed             *int64          `json:"seed"`
	KVTransferParams json.RawMessage `json:"kv_transfer_params"`
}

type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// kvTransferParams are the fields of vLLM's kv_transfer_params the engine
// reads; the rest of the object is opaque.
type kvTransferParams struct {
	DoRemoteDecode  bool   `json:"do_remote_decode"`
	DoRemotePrefill bool   `json:"do_remote_prefill"`
	RemoteEngineID  string `json:"remote_engine_id"`
	RemoteRequestID string `json:"remote_request_id"`
	RemoteHost      string `json:"remote_host"`
	RemotePort      int    `json:"remote_port"`
}

// apiError is an error in OpenAI's shape.
type apiError struct {
	Status     int
	Type       string
	Code       string
	Param      string
	Message    string
	RetryAfter int // seconds; 503 only
}

func (e *apiError) Error() string { return e.Message }

func badRequest(param, format string, args ...any) *apiError {
	return &apiError{Status: 400, Type: "invalid_request_error", Param: param, Message: fmt.Sprintf(format, args...)}
}

// promptTokens reads the prompt of a completion request: a string, a list
// of one string, a list of token ids, or a list of one list of token ids.
func promptTokens(raw json.RawMessage) ([]uint32, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, badRequest("prompt", "prompt is required")
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		if s == "" {
			return nil, badRequest("prompt", "prompt is empty")
		}
		return tokenizer.Encode(s), nil
	}
	var ss []string
	if json.Unmarshal(raw, &ss) == nil {
		if len(ss) != 1 || ss[0] == "" {
			return nil, badRequest("prompt", "a list prompt must hold exactly one non-empty string (batched prompts are not supported)")
		}
		return tokenizer.Encode(ss[0]), nil
	}
	var ids []int64
	if json.Unmarshal(raw, &ids) == nil {
		return checkIDs(ids)
	}
	var idss [][]int64
	if json.Unmarshal(raw, &idss) == nil {
		if len(idss) != 1 {
			return nil, badRequest("prompt", "a list of token lists must hold exactly one list (batched prompts are not supported)")
		}
		return checkIDs(idss[0])
	}
	return nil, badRequest("prompt", "prompt must be a string or a list of token ids")
}

func checkIDs(ids []int64) ([]uint32, error) {
	if len(ids) == 0 {
		return nil, badRequest("prompt", "prompt is empty")
	}
	out := make([]uint32, len(ids))
	for i, id := range ids {
		if id < 0 || id >= tokenizer.VocabSize {
			return nil, badRequest("prompt", "token id %d at position %d is outside the vocabulary [0, %d)", id, i, tokenizer.VocabSize)
		}
		out[i] = uint32(id)
	}
	return out, nil
}

// chatTokens renders chat messages with the tokenizer's chat template.
func chatTokens(msgs []chatMessage) ([]uint32, error) {
	if len(msgs) == 0 {
		return nil, badRequest("messages", "messages is required and must not be empty")
	}
	out := make([]tokenizer.Message, len(msgs))
	for i, m := range msgs {
		if m.Role == "" {
			return nil, badRequest(fmt.Sprintf("messages[%d].role", i), "messages[%d] has no role", i)
		}
		text, err := messageText(m.Content)
		if err != nil {
			return nil, badRequest(fmt.Sprintf("messages[%d].content", i), "messages[%d]: %v", i, err)
		}
		out[i] = tokenizer.Message{Role: m.Role, Content: text}
	}
	return tokenizer.EncodeChat(out), nil
}

// messageText reads content given as a string or as a list of parts, of
// which the text parts count.
func messageText(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", errors.New("content must be a string or a list of parts")
	}
	var b strings.Builder
	for _, p := range parts {
		if p.Type == "text" {
			b.WriteString(p.Text)
		}
	}
	return b.String(), nil
}

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
	Role    string `json:"role,omitempty"`
	Content string `json:"content"`
}

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

type errorBody struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}
