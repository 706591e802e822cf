// Package responsesapi serves OpenAI's Responses API (POST /v1/responses)
// in front of a chat completions server, as anthropicapi serves
// Anthropic's Messages: a Responses request is translated into a chat
// completions body (ToChat), and the chat server's answer, whole or
// streamed, back into a Response or its stream of events (Writer). The
// Codex CLI, which speaks only this API, then gets the same routing, KV
// reuse and continuation on failure as any chat request.
//
// What maps, and how:
//
//   - instructions become the first message, role system; input is a
//     string (one user message) or items.
//   - A message item of role user, assistant, system or developer becomes
//     a chat message (developer as system); input_text, output_text and
//     refusal parts become its text, input_image parts its images.
//   - function_call items become the tool_calls of an assistant message
//     (consecutive calls, and the assistant's text before them, are one
//     message); function_call_output items become tool messages.
//     custom_tool_call and custom_tool_call_output items (freeform tools,
//     such as Codex's apply_patch) map the same, their input as the one
//     string argument "input".
//   - reasoning items are dropped, as chat templates drop earlier
//     reasoning; their encrypted content cannot be read by an open model.
//   - function tools become chat functions; the tools of a namespace tool
//     become functions named NAMESPACE__NAME, and a call of one comes back
//     with its namespace and bare name; a custom tool becomes a function
//     of one string parameter, "input", whose description carries the
//     tool's grammar. Hosted tools (web_search, file_search,
//     code_interpreter, image_generation, computer use, mcp, tool_search,
//     local_shell) are not served: they are dropped, and the answer's
//     DroppedToolsHeader names them, so that an agent that offers them
//     every turn (Codex offers web_search) still runs.
//   - tool_choice auto, none, required and a named function map to the
//     chat's; parallel_tool_calls, temperature, top_p and stream map one
//     to one; max_output_tokens becomes max_tokens (without it, the
//     answer may fill the context, as the Responses API's may: the router
//     sets max_tokens to what is left); text.format json_schema and
//     json_object become response_format; reasoning.effort becomes
//     reasoning_effort (no summaries are invented).
//   - store is accepted, and nothing is stored: previous_response_id and
//     item_reference items, which need a stored response, are refused
//     with a 400 that says to send the whole conversation (as Codex does,
//     with store false). include is accepted: there is no encrypted
//     reasoning to return.
//   - prompt_cache_key, client_metadata and metadata pass into the chat
//     request's metadata, where the router reads the agent's session (see
//     protocol.AgentOf); nvext passes on.
//
// The answer's text, reasoning and tool calls become message, reasoning
// (reasoning_text content) and function_call (or custom_tool_call) output
// items; finish reason length makes the response incomplete
// (max_output_tokens). Usage gives input_tokens with their cached_tokens,
// output_tokens with their reasoning_tokens, and total_tokens. Errors are
// OpenAI's; in a stream, response.failed.
package responsesapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/evolvellm/evolve/openaiapi"
)

// DroppedToolsHeader, on an answer, names the hosted tools the request
// offered that were dropped (comma-separated types).
const DroppedToolsHeader = "X-Evolve-Dropped-Tools"

// NamespaceSeparator joins a namespace tool's name and one of its tools'
// in the chat function that stands for it.
const NamespaceSeparator = "__"

// Request is the Responses API request body, as far as it is read.
type Request struct {
	Model              string            `json:"model"`
	Input              json.RawMessage   `json:"input"`
	Instructions       *string           `json:"instructions"`
	Tools              []Tool            `json:"tools"`
	ToolChoice         json.RawMessage   `json:"tool_choice"`
	ParallelToolCalls  *bool             `json:"parallel_tool_calls"`
	MaxOutputTokens    *int              `json:"max_output_tokens"`
	Temperature        *float64          `json:"temperature"`
	TopP               *float64          `json:"top_p"`
	Stream             bool              `json:"stream"`
	Store              *bool             `json:"store"`
	PreviousResponseID *string           `json:"previous_response_id"`
	Include            []string          `json:"include"`
	PromptCacheKey     string            `json:"prompt_cache_key"`
	ClientMetadata     map[string]any    `json:"client_metadata"`
	Metadata           map[string]string `json:"metadata"`
	Reasoning          *struct {
		Effort  *string `json:"effort"`
		Summary *string `json:"summary"`
	} `json:"reasoning"`
	Text *struct {
		Format *struct {
			Type   string          `json:"type"`
			Name   string          `json:"name"`
			Schema json.RawMessage `json:"schema"`
			Strict *bool           `json:"strict"`
		} `json:"format"`
	} `json:"text"`
	Nvext json.RawMessage `json:"nvext"`
}

// Tool is a tool the request offers.
type Tool struct {
	Type        string          `json:"type"`
	Name        string          `json:"name"`
	Description string          `json:"description"`
	Parameters  json.RawMessage `json:"parameters"`
	Strict      *bool           `json:"strict"`
	Tools       []Tool          `json:"tools"`  // a namespace's
	Format      json.RawMessage `json:"format"` // a custom tool's
}

// hostedTools are the tools the Responses API's server runs itself.
var hostedTools = map[string]bool{"web_search": true, "web_search_preview": true, "web_search_preview_2025_03_11": true,
	"file_search": true, "code_interpreter": true, "image_generation": true, "computer_use_preview": true, "computer_use": true,
	"mcp": true, "tool_search": true, "local_shell": true, "shell": true, "apply_patch": true}

// Info is what the answer's translation needs to know of the request.
type Info struct {
	Model  string
	Stream bool
	// Echo is what the response object repeats of the request.
	Echo Echo
	// Tools maps the chat function names that stand for namespaced and
	// custom tools to what the answer calls.
	Tools map[string]ToolName
	// Dropped are the hosted tools the request offered (their types).
	Dropped []string
}

// ToolName is what an answer's call of a chat function names: a function
// (in a namespace, or not), or a custom tool.
type ToolName struct {
	Name, Namespace string
	Custom          bool
}

// Echo is what a Response repeats of its request.
type Echo struct {
	Instructions      *string           `json:"instructions"`
	MaxOutputTokens   *int              `json:"max_output_tokens"`
	ParallelToolCalls bool              `json:"parallel_tool_calls"`
	Temperature       *float64          `json:"temperature"`
	TopP              *float64          `json:"top_p"`
	ToolChoice        json.RawMessage   `json:"tool_choice"`
	Tools             []Tool            `json:"tools"`
	Metadata          map[string]string `json:"metadata"`
	PromptCacheKey    *string           `json:"prompt_cache_key"`
	Reasoning         json.RawMessage   `json:"reasoning"`
	Text              json.RawMessage   `json:"text"`
}

func invalid(param, format string, args ...any) *openaiapi.Error {
	return openaiapi.BadRequest(param, format, args...)
}

// chat message and its parts, as evolve writes them.
type chatMessage struct {
	Role       string         `json:"role"`
	Content    any            `json:"content"` // a string, parts, or nil
	ToolCalls  []chatToolCall `json:"tool_calls,omitempty"`
	ToolCallID string         `json:"tool_call_id,omitempty"`
}

type chatToolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

type part struct {
	Type     string    `json:"type"`
	Text     string    `json:"text,omitempty"`
	ImageURL *imageURL `json:"image_url,omitempty"`
}

type imageURL struct {
	URL    string `json:"url"`
	Detail string `json:"detail,omitempty"`
}

// ToChat checks a Responses request and returns the chat completions body
// that asks the same, and what the answer's translation needs.
func ToChat(body []byte) ([]byte, Info, *openaiapi.Error) {
	var r Request
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, Info{}, invalid("", "malformed JSON body: %v", openaiapi.DecodeErrorText(err))
	}
	if r.Model == "" {
		return nil, Info{}, invalid("model", "model: field required")
	}
	if r.PreviousResponseID != nil && *r.PreviousResponseID != "" {
		return nil, Info{}, invalid("previous_response_id", "previous_response_id is not supported: evolve keeps no responses "+
			"(store is not kept); send the whole conversation in input, with store false")
	}
	if r.MaxOutputTokens != nil && *r.MaxOutputTokens < 1 {
		return nil, Info{}, invalid("max_output_tokens", "max_output_tokens must be at least 1 (got %d)", *r.MaxOutputTokens)
	}
	info := Info{Model: r.Model, Stream: r.Stream, Tools: map[string]ToolName{}}
	var msgs []chatMessage
	if r.Instructions != nil && *r.Instructions != "" {
		msgs = append(msgs, chatMessage{Role: "system", Content: *r.Instructions})
	}
	items, err := inputMessages(r.Input)
	if err != nil {
		return nil, Info{}, err
	}
	msgs = append(msgs, items...)
	if len(msgs) == 0 {
		return nil, Info{}, invalid("input", "input: at least one message is required")
	}
	chat := map[string]any{"model": r.Model, "messages": msgs}
	if r.MaxOutputTokens != nil {
		chat["max_tokens"] = *r.MaxOutputTokens
	}
	if r.Stream {
		chat["stream"] = true
		chat["stream_options"] = map[string]any{"include_usage": true}
	}
	if r.Temperature != nil {
		chat["temperature"] = *r.Temperature
	}
	if r.TopP != nil {
		chat["top_p"] = *r.TopP
	}
	if r.Reasoning != nil && r.Reasoning.Effort != nil && *r.Reasoning.Effort != "" {
		chat["reasoning_effort"] = *r.Reasoning.Effort
	}
	if err := textFormat(chat, &r); err != nil {
		return nil, Info{}, err
	}
	if err := addTools(chat, &r, &info); err != nil {
		return nil, Info{}, err
	}
	if md := metadata(&r); len(md) > 0 {
		chat["metadata"] = md
	}
	if len(r.Nvext) > 0 {
		chat["nvext"] = r.Nvext
	}
	b, jerr := json.Marshal(chat)
	if jerr != nil {
		return nil, Info{}, invalid("", "encode the chat request: %v", jerr)
	}
	info.Echo = echo(&r)
	return b, info, nil
}

// metadata is the chat request's metadata: the request's own, its
// client_metadata's strings and its prompt_cache_key, which name the
// agent's session (protocol.AgentOf).
func metadata(r *Request) map[string]any {
	md := map[string]any{}
	for k, v := range r.ClientMetadata {
		if s, ok := v.(string); ok {
			md[k] = s
		}
	}
	for k, v := range r.Metadata {
		md[k] = v
	}
	if r.PromptCacheKey != "" {
		md["prompt_cache_key"] = r.PromptCacheKey
	}
	return md
}

func echo(r *Request) Echo {
	e := Echo{Instructions: r.Instructions, MaxOutputTokens: r.MaxOutputTokens, ParallelToolCalls: r.ParallelToolCalls == nil || *r.ParallelToolCalls,
		Temperature: r.Temperature, TopP: r.TopP, ToolChoice: r.ToolChoice, Tools: r.Tools, Metadata: r.Metadata}
	if e.Tools == nil {
		e.Tools = []Tool{}
	}
	if e.Metadata == nil {
		e.Metadata = map[string]string{}
	}
	if len(e.ToolChoice) == 0 {
		e.ToolChoice = json.RawMessage(`"auto"`)
	}
	if r.PromptCacheKey != "" {
		e.PromptCacheKey = &r.PromptCacheKey
	}
	e.Reasoning = json.RawMessage(`{"effort":null,"summary":null}`)
	if r.Reasoning != nil {
		e.Reasoning, _ = json.Marshal(map[string]any{"effort": r.Reasoning.Effort, "summary": nil})
	}
	e.Text = json.RawMessage(`{"format":{"type":"text"}}`)
	if r.Text != nil && r.Text.Format != nil {
		e.Text, _ = json.Marshal(map[string]any{"format": r.Text.Format})
	}
	return e
}

// textFormat maps text.format to the chat's response_format.
func textFormat(chat map[string]any, r *Request) *openaiapi.Error {
	if r.Text == nil || r.Text.Format == nil {
		return nil
	}
	f := r.Text.Format
	switch f.Type {
	case "", "text":
	case "json_object":
		chat["response_format"] = map[string]any{"type": "json_object"}
	case "json_schema":
		if len(bytes.TrimSpace(f.Schema)) == 0 {
			return invalid("text.format.schema", "text.format.schema: field required for json_schema")
		}
		name := f.Name
		if name == "" {
			name = "output"
		}
		js := map[string]any{"name": name, "schema": f.Schema}
		if f.Strict != nil {
			js["strict"] = *f.Strict
		}
		chat["response_format"] = map[string]any{"type": "json_schema", "json_schema": js}
	default:
		return invalid("text.format.type", "text.format.type must be text, json_object or json_schema (got %q)", f.Type)
	}
	return nil
}

// item is an input item, as far as it is read.
type item struct {
	Type      string          `json:"type"`
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	CallID    string          `json:"call_id"`
	Name      string          `json:"name"`
	Namespace string          `json:"namespace"`
	Arguments string          `json:"arguments"`
	Input     string          `json:"input"`
	Output    json.RawMessage `json:"output"`
}

// contentPart is a part of a message item's content, or of a tool call's
// output.
type contentPart struct {
	Type     string          `json:"type"`
	Text     string          `json:"text"`
	Refusal  string          `json:"refusal"`
	ImageURL json.RawMessage `json:"image_url"` // a string (the Responses API's), or an object
	Detail   string          `json:"detail"`
	FileID   string          `json:"file_id"`
}

// inputMessages translates the input: a string, or items.
func inputMessages(raw json.RawMessage) ([]chatMessage, *openaiapi.Error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, invalid("input", "input: field required")
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, invalid("input", "input: %v", openaiapi.DecodeErrorText(err))
		}
		return []chatMessage{{Role: "user", Content: s}}, nil
	}
	var items []item
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, invalid("input", "input must be a string or a list of items: %v", openaiapi.DecodeErrorText(err))
	}
	var out []chatMessage
	// assistant is the assistant message that calls are added to, while
	// the items are the same turn's.
	assistant := -1
	call := func(id, name, args string) {
		if assistant < 0 {
			out = append(out, chatMessage{Role: "assistant"})
			assistant = len(out) - 1
		}
		var tc chatToolCall
		tc.ID, tc.Type = id, "function"
		tc.Function.Name, tc.Function.Arguments = name, args
		out[assistant].ToolCalls = append(out[assistant].ToolCalls, tc)
	}
	for i, it := range items {
		switch it.Type {
		case "message", "":
			m, err := message(it)
			if err != nil {
				err.Message = fmt.Sprintf("input.%d: %s", i, err.Message)
				err.Param = fmt.Sprintf("input.%d", i)
				return nil, err
			}
			out = append(out, m)
			assistant = -1
			if m.Role == "assistant" {
				assistant = len(out) - 1
			}
		case "function_call", "custom_tool_call":
			if it.CallID == "" || it.Name == "" {
				return nil, invalid(fmt.Sprintf("input.%d", i), "input.%d: a %s needs a call_id and a name", i, it.Type)
			}
			name, args := it.Name, it.Arguments
			if it.Namespace != "" {
				name = it.Namespace + NamespaceSeparator + it.Name
			}
			if it.Type == "custom_tool_call" {
				b, _ := json.Marshal(map[string]string{"input": it.Input})
				args = string(b)
			}
			if strings.TrimSpace(args) == "" {
				args = "{}"
			}
			call(it.CallID, name, args)
		case "function_call_output", "custom_tool_call_output":
			if it.CallID == "" {
				return nil, invalid(fmt.Sprintf("input.%d", i), "input.%d: a %s needs a call_id", i, it.Type)
			}
			text, images, err := toolOutput(it.Output)
			if err != nil {
				err.Message = fmt.Sprintf("input.%d.output: %s", i, err.Message)
				return nil, err
			}
			out = append(out, chatMessage{Role: "tool", ToolCallID: it.CallID, Content: text})
			if len(images) > 0 { // images a tool returned: the user shows them
				out = append(out, chatMessage{Role: "user", Content: images})
			}
			assistant = -1
		case "reasoning", "web_search_call", "file_search_call", "image_generation_call", "code_interpreter_call",
			"tool_search_call", "tool_search_output", "compaction", "compaction_summary":
			// Reasoning and the records of hosted tools: nothing an open
			// model can read back.
		case "item_reference":
			return nil, invalid(fmt.Sprintf("input.%d", i), "input.%d: item_reference is not supported: evolve keeps no items; send the item itself", i)
		default:
			return nil, invalid(fmt.Sprintf("input.%d.type", i), "input.%d: item type %q is not supported", i, it.Type)
		}
	}
	return out, nil
}

// message translates a message item.
func message(it item) (chatMessage, *openaiapi.Error) {
	role := it.Role
	switch role {
	case "user", "assistant", "system":
	case "developer":
		role = "system" // chat templates know system; developer is OpenAI's newer name for it
	default:
		return chatMessage{}, invalid("", "role must be user, assistant, system or developer (got %q)", it.Role)
	}
	raw := bytes.TrimSpace(it.Content)
	if len(raw) > 0 && raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return chatMessage{}, invalid("", "content: %v", openaiapi.DecodeErrorText(err))
		}
		return chatMessage{Role: role, Content: s}, nil
	}
	var ps []contentPart
	if err := json.Unmarshal(raw, &ps); err != nil {
		return chatMessage{}, invalid("", "content must be a string or a list of parts: %v", openaiapi.DecodeErrorText(err))
	}
	parts, err := chatParts(ps)
	if err != nil {
		return chatMessage{}, err
	}
	return chatMessage{Role: role, Content: partsContent(parts)}, nil
}

// chatParts translates content parts.
func chatParts(ps []contentPart) ([]part, *openaiapi.Error) {
	var out []part
	for i, p := range ps {
		switch p.Type {
		case "input_text", "output_text", "text", "summary_text", "reasoning_text":
			out = append(out, part{Type: "text", Text: p.Text})
		case "refusal":
			out = append(out, part{Type: "text", Text: p.Refusal})
		case "input_image":
			url := ""
			if s := bytes.TrimSpace(p.ImageURL); len(s) > 0 && s[0] == '"' {
				json.Unmarshal(s, &url)
			} else if len(s) > 0 && s[0] == '{' {
				var o struct {
					URL string `json:"url"`
				}
				json.Unmarshal(s, &o)
				url = o.URL
			}
			if url == "" {
				if p.FileID != "" {
					return nil, invalid("", "content.%d: an image by file_id is not supported (evolve keeps no files): give its image_url", i)
				}
				return nil, invalid("", "content.%d: an input_image needs an image_url", i)
			}
			detail := p.Detail
			if detail != "low" && detail != "high" && detail != "auto" {
				detail = ""
			}
			out = append(out, part{Type: "image_url", ImageURL: &imageURL{URL: url, Detail: detail}})
		case "input_file":
			return nil, invalid("", "content.%d: input_file parts are not supported", i)
		default:
			return nil, invalid("", "content.%d: part type %q is not supported", i, p.Type)
		}
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

// toolOutput reads a tool call's output: a string, or parts (its text,
// and its images).
func toolOutput(raw json.RawMessage) (string, []part, *openaiapi.Error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil, nil
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", nil, invalid("", "%v", openaiapi.DecodeErrorText(err))
		}
		return s, nil, nil
	}
	var ps []contentPart
	if err := json.Unmarshal(raw, &ps); err != nil {
		return "", nil, invalid("", "must be a string or a list of parts: %v", openaiapi.DecodeErrorText(err))
	}
	parts, err := chatParts(ps)
	if err != nil {
		return "", nil, err
	}
	var text strings.Builder
	var images []part
	for _, p := range parts {
		if p.Type == "text" {
			text.WriteString(p.Text)
		} else {
			images = append(images, p)
		}
	}
	return text.String(), images, nil
}

// addTools translates tools and tool_choice.
func addTools(chat map[string]any, r *Request, info *Info) *openaiapi.Error {
	var fns []map[string]any
	dropped := map[string]bool{}
	add := func(i int, name, namespace string, t Tool) *openaiapi.Error {
		if name == "" {
			return invalid(fmt.Sprintf("tools.%d.name", i), "tools.%d.name: field required", i)
		}
		params := bytes.TrimSpace(t.Parameters)
		desc := t.Description
		chatName := name
		if namespace != "" {
			chatName = namespace + NamespaceSeparator + name
			info.Tools[chatName] = ToolName{Name: name, Namespace: namespace}
		}
		if t.Type == "custom" {
			// A freeform tool: its input is one string, in its grammar.
			info.Tools[chatName] = ToolName{Name: name, Namespace: namespace, Custom: true}
			inputDesc := "The tool's input, as free text."
			if len(t.Format) > 0 && string(t.Format) != "null" {
				inputDesc = "The tool's input, as free text in this format: " + string(t.Format)
			}
			params, _ = json.Marshal(map[string]any{"type": "object", "required": []string{"input"},
				"properties": map[string]any{"input": map[string]any{"type": "string", "description": inputDesc}}})
		}
		if len(params) == 0 || string(params) == "null" {
			params = []byte(`{"type":"object","properties":{}}`)
		}
		if params[0] != '{' {
			return invalid(fmt.Sprintf("tools.%d.parameters", i), "tools.%d.parameters: must be a JSON schema object", i)
		}
		fn := map[string]any{"name": chatName, "parameters": json.RawMessage(params)}
		if desc != "" {
			fn["description"] = desc
		}
		if t.Strict != nil {
			fn["strict"] = *t.Strict
		}
		fns = append(fns, map[string]any{"type": "function", "function": fn})
		return nil
	}
	for i, t := range r.Tools {
		switch {
		case t.Type == "function" || t.Type == "custom":
			if err := add(i, t.Name, "", t); err != nil {
				return err
			}
		case t.Type == "namespace":
			if t.Name == "" {
				return invalid(fmt.Sprintf("tools.%d.name", i), "tools.%d.name: a namespace needs a name", i)
			}
			for _, sub := range t.Tools {
				if sub.Type != "function" && sub.Type != "custom" && sub.Type != "" {
					dropped[sub.Type] = true
					continue
				}
				if sub.Type == "" {
					sub.Type = "function"
				}
				if err := add(i, sub.Name, t.Name, sub); err != nil {
					return err
				}
			}
		case hostedTools[t.Type]:
			dropped[t.Type] = true
		default:
			return invalid(fmt.Sprintf("tools.%d.type", i), "tools.%d: tool type %q is not supported: define the tool as a function", i, t.Type)
		}
	}
	for t := range dropped {
		info.Dropped = append(info.Dropped, t)
	}
	sort.Strings(info.Dropped)
	if len(fns) > 0 {
		chat["tools"] = fns
	}
	if r.ParallelToolCalls != nil && len(fns) > 0 {
		chat["parallel_tool_calls"] = *r.ParallelToolCalls
	}
	return toolChoice(chat, r.ToolChoice, len(fns) > 0, info)
}

// toolChoice translates tool_choice.
func toolChoice(chat map[string]any, raw json.RawMessage, tools bool, info *Info) *openaiapi.Error {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		switch s {
		case "auto", "none":
			if tools {
				chat["tool_choice"] = s
			}
		case "required":
			if !tools {
				return invalid("tool_choice", "tool_choice required needs tools")
			}
			chat["tool_choice"] = s
		default:
			return invalid("tool_choice", "tool_choice must be auto, none, required or a tool (got %q)", s)
		}
		return nil
	}
	var c struct {
		Type      string `json:"type"`
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
		Mode      string `json:"mode"`
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		return invalid("tool_choice", "tool_choice must be a string or an object: %v", openaiapi.DecodeErrorText(err))
	}
	switch c.Type {
	case "function", "custom":
		if c.Name == "" {
			return invalid("tool_choice.name", "tool_choice.name: field required")
		}
		name := c.Name
		if c.Namespace != "" {
			name = c.Namespace + NamespaceSeparator + c.Name
		}
		chat["tool_choice"] = map[string]any{"type": "function", "function": map[string]any{"name": name}}
	case "allowed_tools":
		if tools {
			chat["tool_choice"] = "auto"
			if c.Mode == "required" {
				chat["tool_choice"] = "required"
			}
		}
	default:
		if hostedTools[c.Type] {
			return invalid("tool_choice", "tool_choice %q is a hosted tool, which evolve does not serve", c.Type)
		}
		return invalid("tool_choice.type", "tool_choice.type %q is not supported", c.Type)
	}
	return nil
}
