package anthropicapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/evolvellm/evolve/openaiapi"
)

// The chat answer, as the translation reads it.
type (
	chatUsage  = openaiapi.ChatUsage
	chatAnswer = openaiapi.ChatAnswer
)

// Usage is a Message's usage.
type Usage struct {
	InputTokens              int `json:"input_tokens"`
	CacheCreationInputTokens int `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int `json:"cache_read_input_tokens"`
	OutputTokens             int `json:"output_tokens"`
}

func usageOf(u *chatUsage) Usage {
	if u == nil {
		return Usage{}
	}
	cached := u.Cached()
	return Usage{InputTokens: u.PromptTokens - cached, OutputTokens: u.CompletionTokens, CacheReadInputTokens: cached}
}

// messageID names the Message after the chat answer it comes from.
func messageID(chatID string) string {
	for _, p := range []string{"chatcmpl-", "cmpl-"} {
		chatID = strings.TrimPrefix(chatID, p)
	}
	if chatID == "" {
		chatID = "evolve"
	}
	return "msg_" + chatID
}

// stopReason maps a chat finish reason (and vLLM's stop_reason) to a
// Message's stop_reason and stop_sequence.
func stopReason(finish string, matched json.RawMessage, stops []string) (string, *string) {
	switch finish {
	case "length":
		return "max_tokens", nil
	case "tool_calls", "function_call":
		return "tool_use", nil
	case "content_filter":
		return "refusal", nil
	}
	var s string
	if json.Unmarshal(matched, &s) == nil && slices.Contains(stops, s) {
		return "stop_sequence", &s
	}
	return "end_turn", nil
}

// toolInput is a tool call's arguments as a tool_use block's input: the
// JSON object the model wrote, or, when it wrote something else, that text
// under "arguments", so that nothing it wrote is lost.
func toolInput(args string) json.RawMessage {
	t := bytes.TrimSpace([]byte(args))
	if len(t) == 0 {
		return json.RawMessage("{}")
	}
	if t[0] == '{' && json.Valid(t) {
		return t
	}
	return obj("arguments", args)
}

// message translates a whole chat completion into a Message.
func message(b []byte, info Info) ([]byte, *Error) {
	var a chatAnswer
	if err := json.Unmarshal(b, &a); err != nil {
		return nil, &Error{Status: 502, Type: "api_error", Message: "the engine's answer cannot be read: " + err.Error()}
	}
	if len(a.Choices) == 0 {
		return nil, &Error{Status: 502, Type: "api_error", Message: "the engine's answer has no choice"}
	}
	c := a.Choices[0]
	content := []json.RawMessage{}
	if r := c.Message.ReasoningText(); r != "" {
		content = append(content, obj("type", "thinking", "thinking", r, "signature", ""))
	}
	if c.Message.Content != nil && *c.Message.Content != "" {
		content = append(content, obj("type", "text", "text", *c.Message.Content))
	}
	for _, tc := range c.Message.ToolCalls {
		content = append(content, obj("type", "tool_use", "id", tc.ID, "name", tc.Function.Name, "input", toolInput(tc.Function.Arguments)))
	}
	finish := ""
	if c.FinishReason != nil {
		finish = *c.FinishReason
	}
	reason, seq := stopReason(finish, c.StopReason, info.StopSequences)
	return obj("id", messageID(a.ID), "type", "message", "role", "assistant", "model", modelOf(a.Model, info),
		"content", content, "stop_reason", reason, "stop_sequence", seq, "usage", usageOf(a.Usage)), nil
}

func modelOf(answered string, info Info) string {
	if info.Model != "" {
		return info.Model
	}
	return answered
}

// errorType is Anthropic's error type for an HTTP status.
func errorType(status int) string {
	switch status {
	case 400, 422:
		return "invalid_request_error"
	case 401:
		return "authentication_error"
	case 403:
		return "permission_error"
	case 404:
		return "not_found_error"
	case 413:
		return "request_too_large"
	case 429:
		return "rate_limit_error"
	case 503, 529:
		return "overloaded_error"
	}
	if status >= 400 && status < 500 {
		return "invalid_request_error"
	}
	return "api_error"
}

// fromChatError reads an error answer (OpenAI's nested shape, or vLLM's
// flat one) as an Error with status, a refusal for the context's length
// in Anthropic's words.
func fromChatError(status int, b []byte) *Error {
	msg := openaiapi.ErrorOf(status, b).Message
	if c, ok := openaiapi.ParseContextOverflow(msg); ok && status == http.StatusBadRequest {
		msg = contextOverflow(c)
	}
	return &Error{Status: status, Type: errorType(status), Message: msg}
}

// contextOverflow is a refusal for the context's length in Anthropic's
// words, which agents parse: Claude Code compacts its conversation on the
// first and retries with fewer max_tokens on the second, reading the
// numbers from them.
func contextOverflow(c openaiapi.ContextOverflow) string {
	if c.MaxTokens == 0 {
		return fmt.Sprintf("prompt is too long: %d tokens > %d maximum", c.Prompt, c.MaxModelLen)
	}
	return fmt.Sprintf("input length and `max_tokens` exceed context limit: %d + %d > %d, "+
		"decrease input length or `max_tokens` and try again", c.Prompt, c.MaxTokens, c.MaxModelLen)
}

// Body is the error's JSON body.
func (e *Error) Body() []byte {
	return obj("type", "error", "error", obj("type", e.Type, "message", e.Message))
}

// Write sends the error as the response.
func (e *Error) Write(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.Status)
	w.Write(append(e.Body(), '\n'))
}

// NewError is an error with status, of the type Anthropic gives that status.
func NewError(status int, message string) *Error {
	return &Error{Status: status, Type: errorType(status), Message: message}
}

// obj is openaiapi.Object: the answers list their members as Anthropic's
// do (type first), for the operator who reads them beside its
// documentation.
var obj = openaiapi.Object
