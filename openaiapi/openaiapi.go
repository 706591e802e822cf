// Package openaiapi reads OpenAI-style requests and writes OpenAI-style
// errors, the same way in the engine and in the orchestrator's front door,
// so that a bad request gets the same answer wherever it lands.
package openaiapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/evolvellm/evolve/tokenizer"
)

// MaxBodyBytes caps request bodies (a 256K-token prompt as JSON ids fits).
const MaxBodyBytes = 32 << 20

// Request is the union of the completion and chat completion request
// bodies that evolve reads. Unknown fields are ignored, as OpenAI's servers
// do; sampling parameters have no effect on a simulated engine.
type Request struct {
	Model    string          `json:"model"`
	Prompt   json.RawMessage `json:"prompt"`
	Messages []ChatMessage   `json:"messages"`
	// Tools are the functions a chat request offers the model; the chat
	// template renders them into the prompt.
	Tools json.RawMessage `json:"tools"`
	// ToolChoice says whether the answer must call a tool, and which.
	ToolChoice json.RawMessage `json:"tool_choice"`
	// AddGenerationPrompt (default true) and ContinueFinalMessage shape
	// the chat prompt's end, as vLLM's fields of the same names do.
	AddGenerationPrompt  *bool `json:"add_generation_prompt"`
	ContinueFinalMessage bool  `json:"continue_final_message"`
	MaxTokens            *int  `json:"max_tokens"`
	MaxCompletionTokens  *int  `json:"max_completion_tokens"`
	Stream               bool  `json:"stream"`
	StreamOptions        *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	N                *int            `json:"n"`
	Seed             *int64          `json:"seed"`
	KVTransferParams json.RawMessage `json:"kv_transfer_params"`
	Metadata         map[string]any  `json:"metadata"`
	// Nvext is Dynamo's request extension: its agent hints (and, in its
	// older form, the agent's identity), read by evolve's router.
	Nvext json.RawMessage `json:"nvext"`
	// ResponseFormat asks for structured output (vLLM's): text,
	// json_object or json_schema; only its shape is checked.
	ResponseFormat json.RawMessage `json:"response_format"`
	// EvolveResume continues an answer another engine handed over
	// (protocol.Resume); only evolve's router sends it.
	EvolveResume json.RawMessage `json:"evolve_resume"`
	// IgnoreEOS writes max_tokens tokens whatever the model would stop
	// at, and MinTokens at least that many, as vLLM's fields of the same
	// names (benchmarks send ignore_eos, for outputs of the length asked).
	IgnoreEOS bool `json:"ignore_eos"`
	MinTokens *int `json:"min_tokens"`
	Sampling
}

// ChatMessage is one message of a chat request.
type ChatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
	// ToolCalls are an assistant message's calls of tools; the chat
	// template renders them after its content.
	ToolCalls json.RawMessage `json:"tool_calls"`
}

// KVTransferParams are the fields of vLLM's kv_transfer_params evolve reads;
// the rest of the object is opaque.
type KVTransferParams struct {
	DoRemoteDecode  bool   `json:"do_remote_decode"`
	DoRemotePrefill bool   `json:"do_remote_prefill"`
	RemoteEngineID  string `json:"remote_engine_id"`
	RemoteRequestID string `json:"remote_request_id"`
	RemoteHost      string `json:"remote_host"`
	RemotePort      int    `json:"remote_port"`
}

// Parsed is a request that passed validation, with its prompt tokenized.
type Parsed struct {
	Req       Request
	Chat      bool
	Tokens    []uint32
	MaxTokens int // as asked, or the default
	KV        KVTransferParams
}

// Parse decodes and validates a body for /v1/completions (chat false) or
// /v1/chat/completions, tokenizes the prompt with evolve's tokenizer, and
// applies defaultMaxTokens (0: 16 for completions, as OpenAI; 256 for chat).
//
// A chat request from evolve's router may carry its prompt as token ids in
// PromptTokensMember, in place of its messages: those ids are the prompt.
func Parse(body []byte, chat bool, defaultMaxTokens int) (*Parsed, *Error) {
	if chat {
		o := parseOptions{chat: chat, defaultMaxTokens: defaultMaxTokens}
		if bytes.Contains(body, promptTokensKey) {
			if p, perr, ok := parseGivenTokens(body, o); ok {
				return p, perr
			}
		}
		return parse(body, o)
	}
	// A completion's prompt, token ids most often, is most of its body:
	// ParseBody reads it once, where encoding/json would read it twice
	// and then the prompt again.
	p, _, err := parseBody(body, parseOptions{chat: chat, defaultMaxTokens: defaultMaxTokens})
	return p, err
}

// parseOptions say how parse reads a body.
type parseOptions struct {
	chat             bool
	defaultMaxTokens int
	// prompt, read apart (ParseBody's), replaces the body's; ids, when not
	// nil, are the prompt's token ids, read already (a completion's prompt,
	// or a chat request's PromptTokensMember).
	prompt json.RawMessage
	ids    []uint32
	// leaveText checks a prompt of text or chat messages but does not
	// tokenize it (see ParseBodyUntokenized).
	leaveText bool
	// maxModelLen, when not 0, refuses a text prompt of that many tokens
	// or more before its ids are made (ContextTooLong).
	maxModelLen int
}

// PromptTokensMember is the member of a chat request in which evolve's
// router gives evolve's engines the prompt it rendered and tokenized, in
// place of the messages: an engine then reads ids, where it would read,
// render and tokenize 100K tokens of messages again (several milliseconds
// of the first token's time per 32K tokens, on each of a split request's
// two engines). The router sends it only to engines that say they read it
// (protocol.Registration.PromptTokens); Parse reads it, ParseBody (the
// router's, for clients) does not.
const PromptTokensMember = "evolve_prompt_tokens"

var promptTokensKey = []byte(`"` + PromptTokensMember + `"`)

// parseGivenTokens is Parse for a chat request whose prompt is given in
// PromptTokensMember; false when it is not (the member was only a
// string in the body, or the body is not one parseObject reads).
func parseGivenTokens(body []byte, o parseOptions) (*Parsed, *Error, bool) {
	want := splitOptions{name: PromptTokensMember, limit: tokenizer.VocabSize}
	b, err := parseObject(body, &want)
	if err != nil || !b.Has(PromptTokensMember) || !foldUnique(b.Members) {
		return nil, nil, false
	}
	if want.ids == nil {
		return nil, BadRequest(PromptTokensMember, "%s must be a non-empty list of token ids below %d", PromptTokensMember, tokenizer.VocabSize), true
	}
	o.ids = want.ids
	// The ids stand for the messages.
	p, perr := parse(b.With(map[string]json.RawMessage{PromptTokensMember: nil, "messages": nil}), o)
	return p, perr, true
}

// parse is Parse, as o says.
func parse(body []byte, o parseOptions) (*Parsed, *Error) {
	chat, defaultMaxTokens, prompt, ids := o.chat, o.defaultMaxTokens, o.prompt, o.ids
	p := &Parsed{Chat: chat}
	r := &p.Req
	if err := json.Unmarshal(body, r); err != nil {
		return nil, DecodeError(err)
	}
	if prompt != nil {
		r.Prompt = prompt
	}
	var err *Error
	if ids != nil {
		p.Tokens = ids
	} else if chat {
		p.Tokens, err = chatTokens(r, o)
	} else {
		p.Tokens, err = promptTokens(r.Prompt, o)
	}
	if err != nil {
		return nil, err
	}
	if err := r.Sampling.check(chat); err != nil {
		return nil, err
	}
	if chat {
		if err := checkRoles(r.Messages); err != nil {
			return nil, err
		}
		if err := checkTools(r.Tools); err != nil {
			return nil, err
		}
	}
	if err := checkResponseFormat(r.ResponseFormat); err != nil {
		return nil, err
	}
	if r.N != nil && *r.N != 1 {
		return nil, BadRequest("n", "n must be 1 (got %d)", *r.N)
	}
	p.MaxTokens = defaultMaxTokens
	if p.MaxTokens <= 0 {
		p.MaxTokens = 256
		if !chat {
			p.MaxTokens = 16
		}
	}
	if r.MaxCompletionTokens != nil {
		p.MaxTokens = *r.MaxCompletionTokens
	} else if r.MaxTokens != nil {
		p.MaxTokens = *r.MaxTokens
	}
	if p.MaxTokens < 1 {
		return nil, BadRequest("max_tokens", "max_tokens must be at least 1 (got %d)", p.MaxTokens)
	}
	if m := r.MinTokens; m != nil && (*m < 0 || *m > p.MaxTokens) {
		return nil, BadRequest("min_tokens", "min_tokens must be between 0 and max_tokens=%d, got %d", p.MaxTokens, *m)
	}
	if len(r.KVTransferParams) > 0 && string(r.KVTransferParams) != "null" {
		if err := json.Unmarshal(r.KVTransferParams, &p.KV); err != nil {
			return nil, BadRequest("kv_transfer_params", "kv_transfer_params: %s", DecodeErrorText(err))
		}
	}
	if p.KV.DoRemoteDecode && p.KV.DoRemotePrefill {
		return nil, BadRequest("kv_transfer_params", "do_remote_decode and do_remote_prefill cannot both be true")
	}
	return p, nil
}

// Error is an error in OpenAI's shape.
type Error struct {
	Status     int
	Type       string
	Code       string
	Param      string
	Message    string
	RetryAfter int // seconds, for a 503 or a 429
}

func (e *Error) Error() string { return e.Message }

// BadRequest is a 400 invalid_request_error about param.
func BadRequest(param, format string, args ...any) *Error {
	return &Error{Status: 400, Type: "invalid_request_error", Param: param, Message: fmt.Sprintf(format, args...)}
}

// Unavailable is a 503 with a retry hint.
func Unavailable(code, format string, args ...any) *Error {
	return &Error{Status: 503, Type: "service_unavailable", Code: code, Message: fmt.Sprintf(format, args...), RetryAfter: 1}
}

// ErrorBody is the JSON body of an error.
type ErrorBody struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

// Body returns e as an ErrorBody.
func (e *Error) Body() ErrorBody {
	var b ErrorBody
	b.Error.Message, b.Error.Type = e.Message, e.Type
	if e.Param != "" {
		p := e.Param
		b.Error.Param = &p
	}
	if e.Code != "" {
		c := e.Code
		b.Error.Code = &c
	}
	return b
}

// Write sends e as the response.
func (e *Error) Write(w http.ResponseWriter) {
	if e.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(e.RetryAfter))
	}
	WriteJSON(w, e.Status, e.Body())
}

// WriteJSON writes v as a JSON response.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false) // "N > L" reads so in a message
	_ = enc.Encode(v)
}

// promptTokens reads the prompt of a completion request: a string, a list
// of one string, a list of token ids, or a list of one list of token ids.
// The prompt's first bytes say which it is; token ids (an agent's whole
// context, often 100K of them) are read in one pass. Text is left
// untokenized (nil) when o.leaveText says so.
func promptTokens(raw json.RawMessage, o parseOptions) ([]uint32, *Error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, BadRequest("prompt", "prompt is required")
	}
	if ids, ok := scanIDs(raw); ok {
		return ids, nil
	}
	if inner := bytes.TrimLeft(raw[1:], jsonSpace); raw[0] == '[' && len(inner) > 0 && inner[0] == '[' {
		ids := make([]uint32, 0, len(inner)/4+1)
		if n, ok := readIDs(inner, &ids, tokenizer.VocabSize); ok && len(bytes.TrimLeft(inner[n:], jsonSpace)) == 1 {
			return ids, nil
		}
	}
	return decodePrompt(raw, o)
}

// decodePrompt reads a prompt (trimmed, not null) with encoding/json alone,
// trying each shape a completion prompt may have in turn.
func decodePrompt(raw json.RawMessage, o parseOptions) ([]uint32, *Error) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		if s == "" {
			return nil, BadRequest("prompt", "prompt is empty")
		}
		return o.encode(s)
	}
	var ss []string
	if json.Unmarshal(raw, &ss) == nil {
		if len(ss) != 1 || ss[0] == "" {
			return nil, BadRequest("prompt", "a list prompt must hold exactly one non-empty string (batched prompts are not supported)")
		}
		return o.encode(ss[0])
	}
	var ids []int64
	if json.Unmarshal(raw, &ids) == nil {
		return checkIDs(ids)
	}
	var idss [][]int64
	if json.Unmarshal(raw, &idss) == nil {
		if len(idss) != 1 {
			return nil, BadRequest("prompt", "a list of token lists must hold exactly one list (batched prompts are not supported)")
		}
		return checkIDs(idss[0])
	}
	return nil, BadRequest("prompt", "prompt must be a string or a list of token ids")
}

// encode tokenizes text, unless o.leaveText says not to. A text that may
// be o.maxModelLen tokens or more (each token is a byte at least) is
// counted first: a prompt too long is refused without its ids, and one
// that is not gets its ids without the appends' copies.
func (o parseOptions) encode(text string) ([]uint32, *Error) {
	if o.leaveText {
		return nil, nil
	}
	if o.maxModelLen <= 0 || len(text) < o.maxModelLen {
		return tokenizer.Encode(text), nil
	}
	n := tokenizer.Count(text)
	if n >= o.maxModelLen {
		return nil, ContextTooLong(o.maxModelLen, n)
	}
	return tokenizer.AppendEncode(make([]uint32, 0, n), text), nil
}

// CodeContextLength is the code of a context overflow (ContextTooLong,
// OutputTooLong), OpenAI's.
const CodeContextLength = "context_length_exceeded"

const jsonSpace = " \t\r\n"

// maxScanDigits bounds the numbers scanIDs reads itself; longer ones
// (never a token id: the vocabulary is far smaller) go to encoding/json,
// which says what is wrong with them.
const maxScanDigits = 9

// scanIDs reads a JSON list of token ids at the start of b (valid JSON, as
// a json.RawMessage is) in one pass, without reflection. ok is false for
// anything else (a string, a nested list, a negative or fractional number,
// an id outside the vocabulary) and for an empty list: the caller then
// decodes with encoding/json, which gives the same ids and the errors
// that say what is wrong. b may continue after the list.
func scanIDs(b []byte) (ids []uint32, ok bool) {
	if len(b) == 0 || b[0] != '[' {
		return nil, false
	}
	// An id and its comma take about as many bytes as a uint32.
	ids = make([]uint32, 0, len(b)/4+1)
	if _, ok := readIDs(b, &ids, tokenizer.VocabSize); !ok {
		return nil, false
	}
	return ids, true
}

// readIDs reads the list scanIDs reads, of ids below limit, appending them
// to *ids (nil: it only checks them), and returns the list's length in
// bytes. What it accepts is valid JSON.
func readIDs(b []byte, ids *[]uint32, limit uint64) (int, bool) {
	if len(b) == 0 || b[0] != '[' {
		return 0, false
	}
	var out []uint32
	if ids != nil {
		out = *ids
	}
	for i := skipSpace(b, 1); i < len(b); {
		start := i
		var v uint64
		for ; i < len(b); i++ {
			d := b[i] - '0'
			if d > 9 {
				break
			}
			v = v*10 + uint64(d)
		}
		if n := i - start; n == 0 || n > maxScanDigits || (b[start] == '0' && n > 1) || v >= limit {
			return 0, false
		}
		if ids != nil {
			out = append(out, uint32(v))
		}
		if i < len(b) && b[i] != ',' && b[i] != ']' {
			i = skipSpace(b, i)
		}
		if i >= len(b) {
			return 0, false
		}
		switch b[i] {
		case ']':
			if ids != nil {
				*ids = out
			}
			return i + 1, true
		case ',':
			if i++; i < len(b) && (b[i] < '0' || b[i] > '9') {
				i = skipSpace(b, i)
			}
		default:
			return 0, false
		}
	}
	return 0, false
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\r' || b[i] == '\n') {
		i++
	}
	return i
}

func checkIDs(ids []int64) ([]uint32, *Error) {
	if len(ids) == 0 {
		return nil, BadRequest("prompt", "prompt is empty")
	}
	out := make([]uint32, len(ids))
	for i, id := range ids {
		if id < 0 || id >= tokenizer.VocabSize {
			return nil, BadRequest("prompt", "token id %d at position %d is outside the vocabulary [0, %d)", id, i, tokenizer.VocabSize)
		}
		out[i] = uint32(id)
	}
	return out, nil
}

// chatTokens renders chat messages with the tokenizer's chat template.
// Tools, when given, come first, as a system message of their JSON (chat
// templates put them in the system prompt), and an assistant message's
// tool calls follow its content as their JSON: an agent's tool
// definitions and calls take their place in the prompt and its KV.
func chatTokens(r *Request, o parseOptions) ([]uint32, *Error) {
	leaveText := o.leaveText
	msgs, tools := r.Messages, r.Tools
	if len(msgs) == 0 {
		return nil, BadRequest("messages", "messages is required and must not be empty")
	}
	chatOpts := tokenizer.ChatOptions{ContinueFinal: r.ContinueFinalMessage,
		NoGenerationPrompt: r.AddGenerationPrompt != nil && !*r.AddGenerationPrompt}
	if r.ContinueFinalMessage {
		if r.AddGenerationPrompt != nil && *r.AddGenerationPrompt {
			return nil, BadRequest("continue_final_message", "continue_final_message and add_generation_prompt cannot both be true")
		}
		if msgs[len(msgs)-1].Role != "assistant" {
			return nil, BadRequest("continue_final_message", "continue_final_message needs a last message from the assistant")
		}
	}
	out := make([]tokenizer.Message, 0, len(msgs)+1)
	if t := compactJSON(tools); t != "" && !leaveText {
		out = append(out, tokenizer.Message{Role: "system", Content: t})
	}
	for i, m := range msgs {
		if m.Role == "" {
			return nil, BadRequest(fmt.Sprintf("messages[%d].role", i), "messages[%d] has no role", i)
		}
		text, err := messageText(m.Content)
		if err != nil {
			return nil, BadRequest(fmt.Sprintf("messages[%d].content", i), "messages[%d]: %v", i, err)
		}
		if !leaveText {
			out = append(out, tokenizer.Message{Role: m.Role, Content: text + compactJSON(m.ToolCalls)})
		}
	}
	if leaveText {
		return nil, nil
	}
	if o.maxModelLen > 0 && chatBytes(out) >= o.maxModelLen {
		if n := tokenizer.CountChat(out, chatOpts); n >= o.maxModelLen {
			return nil, ContextTooLong(o.maxModelLen, n)
		}
	}
	return tokenizer.EncodeChatWith(out, chatOpts), nil
}

// chatBytes bounds the tokens msgs render to from above: a token per
// byte of content, and two for each message's role and end, and one for
// the generation prompt.
func chatBytes(msgs []tokenizer.Message) int {
	n := 1
	for _, m := range msgs {
		n += 2 + len(m.Content)
	}
	return n
}

// compactJSON is raw without insignificant space, or "" for nothing, null
// or an empty list.
func compactJSON(raw json.RawMessage) string {
	var b bytes.Buffer
	if json.Compact(&b, raw) != nil || b.String() == "null" || b.String() == "[]" {
		return ""
	}
	return b.String()
}

// messageText reads content given as a string or as a list of parts, of
// which the text parts count.
func messageText(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	if s, ok := unquote(raw); ok {
		return s, nil
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
