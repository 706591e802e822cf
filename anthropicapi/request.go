// Package anthropicapi serves Anthropic's Messages API (POST /v1/messages)
// in front of an OpenAI chat completions server: it translates a Messages
// request into a chat completions body (ToChat), and the chat server's
// answer, whole or streamed, back into a Message or its stream of events
// (Writer). Agents that speak only Anthropic's API, Claude Code among
// them, can then use a cluster whose engines speak OpenAI's, as vLLM's
// and evolve's do, with the same routing, KV reuse and continuation on
// failure as an OpenAI request gets.
//
// What maps, and how:
//
//   - system (a string or text blocks) becomes the first message, role
//     system; text blocks are joined with newlines.
//   - A message of role system among the messages (Claude Code sends its
//     agent and skill lists so, with the beta mid-conversation-system)
//     becomes a system message in its place.
//   - A user message's text and image blocks become one user message; its
//     tool_result blocks become tool messages before it, in order (an
//     image inside a tool result goes to the user message that follows).
//   - An assistant message's text becomes its content, its tool_use blocks
//     its tool_calls (input as the arguments' JSON); thinking blocks are
//     dropped, as chat templates drop earlier reasoning.
//   - A last message from the assistant is a prefill of the answer: the
//     chat request continues it (continue_final_message, as vLLM names it).
//   - tools (custom tools, with an input_schema) become functions;
//     tool_choice auto, any, tool and none become auto, required, the named
//     function and none; disable_parallel_tool_use sets parallel_tool_calls.
//   - max_tokens, stop_sequences (stop), temperature, top_p, top_k and
//     stream map one to one; a stream always asks for its usage.
//   - output_config.format (a JSON schema) becomes response_format
//     json_schema, vLLM's structured output; vLLM's ignore_eos and
//     min_tokens are passed on.
//   - metadata.user_id is kept (Claude Code names its session in it, as
//     its X-Claude-Code-Session-Id header does: protocol.AgentOf reads
//     both), and nvext (Dynamo's agent hints) is passed on.
//
// The answer's text, reasoning (reasoning_content, as vLLM's reasoning
// parsers write it) and tool calls become text, thinking and tool_use
// blocks; finish reasons stop, length and tool_calls become end_turn (or
// stop_sequence, when the engine names the stop string that matched, as
// vLLM does), max_tokens and tool_use. Usage counts cached prompt tokens
// as cache_read_input_tokens and the rest as input_tokens.
//
// Not served: Anthropic's server tools and its versioned client tools (a
// tool with a type other than custom), documents (PDF), and extended
// thinking's budget (thinking is checked as Anthropic checks it, a budget
// of 1024 tokens or more and below max_tokens, and left to the model's
// chat template). cache_control marks are accepted and need nothing: every
// prefix an engine holds is reused.
package anthropicapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/evolvellm/evolve/openaiapi"
)

// Request is the Messages API request body, as far as it is read.
type Request struct {
	Model         string          `json:"model"`
	MaxTokens     *int            `json:"max_tokens"`
	System        json.RawMessage `json:"system"`
	Messages      []Message       `json:"messages"`
	StopSequences []string        `json:"stop_sequences"`
	Stream        bool            `json:"stream"`
	Temperature   *float64        `json:"temperature"`
	TopP          *float64        `json:"top_p"`
	TopK          *int            `json:"top_k"`
	Tools         []Tool          `json:"tools"`
	ToolChoice    *ToolChoice     `json:"tool_choice"`
	Metadata      *struct {
		UserID string `json:"user_id"`
	} `json:"metadata"`
	// IgnoreEOS and MinTokens are vLLM's extensions, passed on: an
	// answer of max_tokens whatever the model would stop at (benchmarks),
	// and at least min_tokens.
	IgnoreEOS *bool `json:"ignore_eos"`
	MinTokens *int  `json:"min_tokens"`
	// Nvext is Dynamo's request extension (agent hints), passed on.
	Nvext json.RawMessage `json:"nvext"`
	// Thinking is extended thinking: checked as Anthropic checks it, then
	// left to the model's chat template.
	Thinking *struct {
		Type         string `json:"type"`
		BudgetTokens *int   `json:"budget_tokens"`
	} `json:"thinking"`
	// OutputConfig asks for structured output (Claude Code's title
	// generation sends a JSON schema): output_config.format.
	OutputConfig *struct {
		Format *struct {
			Type   string          `json:"type"`
			Schema json.RawMessage `json:"schema"`
		} `json:"format"`
	} `json:"output_config"`
}

// Message is one turn: role user or assistant, content a string or blocks.
type Message struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// Block is a content block, as far as it is read.
type Block struct {
	Type string `json:"type"`
	Text string `json:"text"`
	// image
	Source *struct {
		Type      string `json:"type"` // base64 or url
		MediaType string `json:"media_type"`
		Data      string `json:"data"`
		URL       string `json:"url"`
	} `json:"source"`
	// tool_use
	ID    string          `json:"id"`
	Name  string          `json:"name"`
	Input json.RawMessage `json:"input"`
	// tool_result
	ToolUseID string          `json:"tool_use_id"`
	Content   json.RawMessage `json:"content"`
}

// Tool is a tool the model may call.
type Tool struct {
	Type        string          `json:"type"`
	Name        string          `json:"name"`
	Description string          `json:"description"`
	InputSchema json.RawMessage `json:"input_schema"`
}

// ToolChoice says whether and which tool the model must call.
type ToolChoice struct {
	Type                   string `json:"type"`
	Name                   string `json:"name"`
	DisableParallelToolUse bool   `json:"disable_parallel_tool_use"`
}

// Info is what the answer's translation needs to know of the request.
type Info struct {
	Model         string
	Stream        bool
	StopSequences []string
}

// Error is an error in Anthropic's shape: Type is one of its error types
// (invalid_request_error, not_found_error, overloaded_error, api_error...).
type Error struct {
	Status  int
	Type    string
	Message string
}

func (e *Error) Error() string { return e.Message }

func invalid(format string, args ...any) *Error {
	return &Error{Status: 400, Type: "invalid_request_error", Message: fmt.Sprintf(format, args...)}
}

// decodeError is the 400 for a body encoding/json could not decode, in
// openaiapi.DecodeErrorText's words: "max_tokens: must be a whole
// number, not a string", where encoding/json names Go's types.
func decodeError(err error) *Error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) && te.Field != "" {
		return invalid("%s", openaiapi.DecodeErrorText(err))
	}
	return invalid("malformed JSON body: %s", openaiapi.DecodeErrorText(err))
}

// MinThinkingBudget is the least thinking.budget_tokens Anthropic's API
// takes.
const MinThinkingBudget = 1024

// checkSampling refuses what Anthropic's API refuses of the sampling
// parameters and of extended thinking, in its words: temperature in
// [0, 1], top_p in (0, 1], at most
// openaiapi.MaxStopStrings stop sequences, and a thinking budget of at
// least MinThinkingBudget tokens and below max_tokens.
func checkSampling(r *Request) *Error {
	if t := r.Temperature; t != nil && (math.IsNaN(*t) || *t < 0 || *t > 1) {
		return invalid("temperature: must be between 0 and 1 (got %g)", *t)
	}
	if p := r.TopP; p != nil && (math.IsNaN(*p) || *p <= 0 || *p > 1) {
		return invalid("top_p: must be greater than 0 and at most 1 (got %g)", *p)
	}
	if n := len(r.StopSequences); n > openaiapi.MaxStopStrings {
		return invalid("stop_sequences: %d given; at most %d are allowed", n, openaiapi.MaxStopStrings)
	}
	th := r.Thinking
	if th == nil {
		return nil
	}
	if b := th.BudgetTokens; b != nil && (*b < MinThinkingBudget || *b >= *r.MaxTokens) {
		if *b < MinThinkingBudget {
			return invalid("thinking.budget_tokens: must be at least %d (got %d)", MinThinkingBudget, *b)
		}
		return invalid("thinking.budget_tokens: must be less than max_tokens (%d >= %d)", *b, *r.MaxTokens)
	}
	if th.Type == "enabled" && th.BudgetTokens == nil {
		return invalid("thinking.budget_tokens: field required when thinking is enabled")
	}
	return nil
}

// chatMessage and its parts are the chat completions message evolve writes.
type chatMessage struct {
	Role       string     `json:"role"`
	Content    any        `json:"content"` // a string, parts, or nil
	ToolCalls  []toolCall `json:"tool_calls,omitempty"`
	ToolCallID string     `json:"tool_call_id,omitempty"`
}

type toolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

type part struct {
	Type     string `json:"type"`
	Text     string `json:"text,omitempty"`
	ImageURL *struct {
		URL string `json:"url"`
	} `json:"image_url,omitempty"`
}

// ToChat checks a Messages request and returns the chat completions body
// that asks the same, and what the answer's translation needs.
func ToChat(body []byte) ([]byte, Info, *Error) {
	var r Request
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, Info{}, decodeError(err)
	}
	if r.Model == "" {
		return nil, Info{}, invalid("model: field required")
	}
	if r.MaxTokens == nil {
		return nil, Info{}, invalid("max_tokens: field required")
	}
	if *r.MaxTokens < 1 {
		return nil, Info{}, invalid("max_tokens: must be at least 1 (got %d)", *r.MaxTokens)
	}
	if len(r.Messages) == 0 {
		return nil, Info{}, invalid("messages: at least one message is required")
	}
	if err := checkSampling(&r); err != nil {
		return nil, Info{}, err
	}
	var msgs []chatMessage
	system, err := systemText(r.System)
	if err != nil {
		return nil, Info{}, err
	}
	if system != "" {
		msgs = append(msgs, chatMessage{Role: "system", Content: system})
	}
	for i, m := range r.Messages {
		var out []chatMessage
		var err *Error
		switch m.Role {
		case "user":
			out, err = userMessages(m.Content)
		case "assistant":
			out, err = assistantMessage(m.Content)
		case "system":
			// A system message mid-conversation (Claude Code's agent and
			// skill lists, beta mid-conversation-system): a system message
			// in its place, as chat templates render one.
			var text string
			if text, err = textBlocks(m.Content); err == nil {
				out = []chatMessage{{Role: "system", Content: text}}
			} else {
				err.Message = "a system message" + err.Message
			}
		default:
			return nil, Info{}, invalid("messages.%d.role: must be user, assistant or system (got %q)", i, m.Role)
		}
		if err != nil {
			err.Message = fmt.Sprintf("messages.%d.content: %s", i, err.Message)
			return nil, Info{}, err
		}
		msgs = append(msgs, out...)
	}
	chat := map[string]any{"model": r.Model, "messages": msgs, "max_tokens": *r.MaxTokens}
	if r.Stream {
		chat["stream"] = true
		chat["stream_options"] = map[string]any{"include_usage": true}
	}
	if len(r.StopSequences) > 0 {
		chat["stop"] = r.StopSequences
	}
	if r.Temperature != nil {
		chat["temperature"] = *r.Temperature
	}
	if r.TopP != nil {
		chat["top_p"] = *r.TopP
	}
	if r.TopK != nil {
		chat["top_k"] = *r.TopK
	}
	if r.IgnoreEOS != nil {
		chat["ignore_eos"] = *r.IgnoreEOS
	}
	if r.MinTokens != nil {
		chat["min_tokens"] = *r.MinTokens
	}
	if last := r.Messages[len(r.Messages)-1]; last.Role == "assistant" {
		chat["continue_final_message"] = true
		chat["add_generation_prompt"] = false
	}
	if oc := r.OutputConfig; oc != nil && oc.Format != nil {
		if oc.Format.Type != "json_schema" || len(oc.Format.Schema) == 0 {
			return nil, Info{}, invalid("output_config.format: want {\"type\": \"json_schema\", \"schema\": {...}} (got type %q)", oc.Format.Type)
		}
		// vLLM's structured output; evolve's simulated engines ignore it.
		chat["response_format"] = map[string]any{"type": "json_schema",
			"json_schema": map[string]any{"name": "output", "schema": oc.Format.Schema}}
	}
	if err := addTools(chat, &r); err != nil {
		return nil, Info{}, err
	}
	if r.Metadata != nil && r.Metadata.UserID != "" {
		// Claude Code names its session in it (protocol.AgentOf reads it).
		chat["metadata"] = map[string]any{"user_id": r.Metadata.UserID}
	}
	if len(r.Nvext) > 0 {
		chat["nvext"] = r.Nvext // Dynamo's agent hints, for the router
	}
	b, jerr := json.Marshal(chat)
	if jerr != nil {
		return nil, Info{}, invalid("encode the chat request: %v", jerr)
	}
	return b, Info{Model: r.Model, Stream: r.Stream, StopSequences: r.StopSequences}, nil
}

// blocks reads content given as a string (one text block) or as blocks.
func blocks(raw json.RawMessage) ([]Block, *Error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, invalid("content is required")
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, invalid("%s", openaiapi.DecodeErrorText(err))
		}
		return []Block{{Type: "text", Text: s}}, nil
	}
	var bs []Block
	if err := json.Unmarshal(raw, &bs); err != nil {
		return nil, invalid("must be a string or a list of content blocks: %s", openaiapi.DecodeErrorText(err))
	}
	return bs, nil
}

func systemText(raw json.RawMessage) (string, *Error) {
	text, err := textBlocks(raw)
	if err != nil {
		err.Message = "system" + err.Message
	}
	return text, err
}

// textBlocks is the text of content that may hold only text blocks (a
// system prompt), joined with newlines; an error's message starts where
// its name would end (": ...", ".2: ...").
func textBlocks(raw json.RawMessage) (string, *Error) {
	if t := bytes.TrimSpace(raw); len(t) == 0 || string(t) == "null" {
		return "", nil
	}
	bs, err := blocks(raw)
	if err != nil {
		err.Message = ": " + err.Message
		return "", err
	}
	texts := make([]string, 0, len(bs))
	for i, b := range bs {
		if b.Type != "text" {
			return "", invalid(".%d: only text blocks are allowed (got %q)", i, b.Type)
		}
		texts = append(texts, b.Text)
	}
	return strings.Join(texts, "\n"), nil
}

// imagePart is an image block as a chat image_url part.
func imagePart(b Block) (part, *Error) {
	if b.Source == nil {
		return part{}, invalid("an image block needs a source")
	}
	p := part{Type: "image_url", ImageURL: &struct {
		URL string `json:"url"`
	}{}}
	switch b.Source.Type {
	case "base64":
		if b.Source.MediaType == "" || b.Source.Data == "" {
			return part{}, invalid("a base64 image source needs media_type and data")
		}
		p.ImageURL.URL = "data:" + b.Source.MediaType + ";base64," + b.Source.Data
	case "url":
		if b.Source.URL == "" {
			return part{}, invalid("a url image source needs a url")
		}
		p.ImageURL.URL = b.Source.URL
	default:
		return part{}, invalid("image source type %q is not supported (base64 or url)", b.Source.Type)
	}
	return p, nil
}

// userMessages translates a user turn: its tool results first, as tool
// messages, then what the user wrote.
func userMessages(raw json.RawMessage) ([]chatMessage, *Error) {
	bs, err := blocks(raw)
	if err != nil {
		return nil, err
	}
	var out []chatMessage
	var parts []part
	for i, b := range bs {
		switch b.Type {
		case "text":
			parts = append(parts, part{Type: "text", Text: b.Text})
		case "image":
			p, err := imagePart(b)
			if err != nil {
				err.Message = fmt.Sprintf("%d: %s", i, err.Message)
				return nil, err
			}
			parts = append(parts, p)
		case "tool_result":
			if b.ToolUseID == "" {
				return nil, invalid("%d.tool_use_id: field required", i)
			}
			text, images, err := toolResult(b.Content)
			if err != nil {
				err.Message = fmt.Sprintf("%d.content: %s", i, err.Message)
				return nil, err
			}
			out = append(out, chatMessage{Role: "tool", ToolCallID: b.ToolUseID, Content: text})
			parts = append(parts, images...)
		case "document":
			return nil, invalid("%d: document blocks are not supported", i)
		default:
			return nil, invalid("%d: block type %q is not allowed in a user message", i, b.Type)
		}
	}
	if len(parts) > 0 {
		out = append(out, chatMessage{Role: "user", Content: partsContent(parts)})
	}
	if len(out) == 0 {
		return nil, invalid("a user message needs at least one block")
	}
	return out, nil
}

// partsContent is a plain string when every part is text, as most chat
// templates expect; parts otherwise.
func partsContent(parts []part) any {
	var sb strings.Builder
	for _, p := range parts {
		if p.Type != "text" {
			return parts
		}
		sb.WriteString(p.Text)
	}
	return sb.String()
}

// toolResult reads a tool_result's content: its text, and its images.
func toolResult(raw json.RawMessage) (string, []part, *Error) {
	if t := bytes.TrimSpace(raw); len(t) == 0 || string(t) == "null" {
		return "", nil, nil
	}
	bs, err := blocks(raw)
	if err != nil {
		return "", nil, err
	}
	var text strings.Builder
	var images []part
	for i, b := range bs {
		switch b.Type {
		case "text":
			text.WriteString(b.Text)
		case "image":
			p, err := imagePart(b)
			if err != nil {
				err.Message = fmt.Sprintf("%d: %s", i, err.Message)
				return "", nil, err
			}
			images = append(images, p)
		default:
			return "", nil, invalid("%d: block type %q is not allowed in a tool result", i, b.Type)
		}
	}
	return text.String(), images, nil
}

// assistantMessage translates an assistant turn.
func assistantMessage(raw json.RawMessage) ([]chatMessage, *Error) {
	bs, err := blocks(raw)
	if err != nil {
		return nil, err
	}
	m := chatMessage{Role: "assistant"}
	var text strings.Builder
	for i, b := range bs {
		switch b.Type {
		case "text":
			text.WriteString(b.Text)
		case "tool_use":
			if b.ID == "" || b.Name == "" {
				return nil, invalid("%d: a tool_use block needs an id and a name", i)
			}
			input := bytes.TrimSpace(b.Input)
			if len(input) == 0 || string(input) == "null" {
				input = []byte("{}")
			}
			var tc toolCall
			tc.ID, tc.Type = b.ID, "function"
			tc.Function.Name, tc.Function.Arguments = b.Name, string(input)
			m.ToolCalls = append(m.ToolCalls, tc)
		case "thinking", "redacted_thinking":
			// Earlier reasoning: chat templates leave it out.
		default:
			return nil, invalid("%d: block type %q is not allowed in an assistant message", i, b.Type)
		}
	}
	if text.Len() > 0 || len(m.ToolCalls) == 0 {
		m.Content = text.String()
	}
	return []chatMessage{m}, nil
}

// addTools translates tools and tool_choice.
func addTools(chat map[string]any, r *Request) *Error {
	if len(r.Tools) > 0 {
		fns := make([]map[string]any, 0, len(r.Tools))
		for i, t := range r.Tools {
			if t.Type != "" && t.Type != "custom" {
				return invalid("tools.%d: tool type %q is not supported: define the tool with a name, a description and an input_schema", i, t.Type)
			}
			if t.Name == "" {
				return invalid("tools.%d.name: field required", i)
			}
			schema := bytes.TrimSpace(t.InputSchema)
			if len(schema) == 0 || schema[0] != '{' {
				return invalid("tools.%d.input_schema: must be a JSON schema object", i)
			}
			fn := map[string]any{"name": t.Name, "parameters": json.RawMessage(schema)}
			if t.Description != "" {
				fn["description"] = t.Description
			}
			fns = append(fns, map[string]any{"type": "function", "function": fn})
		}
		chat["tools"] = fns
	}
	c := r.ToolChoice
	if c == nil {
		return nil
	}
	switch c.Type {
	case "auto":
		chat["tool_choice"] = "auto"
	case "any":
		chat["tool_choice"] = "required"
	case "none":
		chat["tool_choice"] = "none"
	case "tool":
		if c.Name == "" {
			return invalid("tool_choice.name: field required when type is tool")
		}
		chat["tool_choice"] = map[string]any{"type": "function", "function": map[string]any{"name": c.Name}}
	default:
		return invalid("tool_choice.type: must be auto, any, tool or none (got %q)", c.Type)
	}
	if c.DisableParallelToolUse && c.Type != "none" {
		chat["parallel_tool_calls"] = false
	}
	if c.Type != "none" && len(r.Tools) == 0 {
		return invalid("tool_choice: requires tools")
	}
	return nil
}

// CountTokensChat returns the chat completions body whose prompt is the
// one a count_tokens request (a Messages request without max_tokens)
// would send.
func CountTokensChat(body []byte) ([]byte, *Error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, decodeError(err)
	}
	if m == nil {
		return nil, invalid("the body must be a JSON object")
	}
	m["max_tokens"], m["stream"] = json.RawMessage("1"), json.RawMessage("false")
	b, _ := json.Marshal(m)
	chat, _, err := ToChat(b)
	return chat, err
}
