package responsesapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/evolvellm/evolve/openaiapi"
)

// streamer turns a chat completion's stream chunks into a Response's
// stream of events, as the Responses API orders them:
//
//	response.created, response.in_progress
//	per output item: response.output_item.added, then
//	  a message:   content_part.added, output_text.delta..., output_text.done, content_part.done
//	  reasoning:   reasoning_text.delta..., reasoning_text.done
//	  a call:      function_call_arguments.delta..., function_call_arguments.done
//	               (a custom tool's: custom_tool_call_input.done)
//	  response.output_item.done
//	response.completed (or response.incomplete), with every item and the usage
//
// An error chunk ends the stream with response.failed. Every event carries
// its sequence_number.
type streamer struct {
	out  io.Writer
	info Info
	r    *response
	seq  int

	started bool
	open    *openItem // the item being streamed
	output  []json.RawMessage
	finish  string
	usage   *openaiapi.ChatUsage
	done    bool
	calls   int

	writeErr error
}

// openItem is the output item being streamed.
type openItem struct {
	kind      string // message, reasoning, call
	id        string
	index     int // output_index
	text      strings.Builder
	callID    string
	name      string // the chat function's
	chatIndex int    // a call's index in the chat stream
}

func (s *streamer) event(typ string, kv ...any) {
	if s.writeErr != nil {
		return
	}
	data := obj(append([]any{"type", typ, "sequence_number", s.seq}, kv...)...)
	s.seq++
	_, s.writeErr = fmt.Fprintf(s.out, "event: %s\ndata: %s\n\n", typ, data)
}

// data takes one chunk (a data line's payload).
func (s *streamer) data(b []byte) {
	if s.done {
		return
	}
	if bytes.Equal(bytes.TrimSpace(b), []byte("[DONE]")) {
		s.end()
		return
	}
	var c openaiapi.ChatAnswer
	if err := json.Unmarshal(b, &c); err != nil {
		s.fail("server_error", "the engine's stream cannot be read: "+err.Error())
		return
	}
	if c.Error != nil {
		code := c.Error.Code
		if code == "" || c.Error.Type == "service_unavailable" {
			code = "server_error"
		}
		s.fail(code, c.Error.Message)
		return
	}
	s.start(c.ID, c.Created)
	if c.Usage != nil {
		s.usage = c.Usage
	}
	if len(c.Choices) == 0 {
		return
	}
	ch := c.Choices[0]
	d := &ch.Delta
	if t := d.ReasoningText(); t != "" {
		s.item("reasoning", -1)
		s.open.text.WriteString(t)
		s.event("response.reasoning_text.delta", "item_id", s.open.id, "output_index", s.open.index, "content_index", 0, "delta", t)
	}
	if d.Content != nil && *d.Content != "" {
		s.item("message", -1)
		s.open.text.WriteString(*d.Content)
		s.event("response.output_text.delta", "item_id", s.open.id, "output_index", s.open.index, "content_index", 0,
			"delta", *d.Content, "logprobs", []any{})
	}
	for _, tc := range d.ToolCalls {
		if s.open == nil || s.open.kind != "call" || tc.Index != s.open.chatIndex || (tc.ID != "" && tc.ID != s.open.callID) {
			s.item("call", tc.Index)
			s.open.callID, s.open.name = tc.ID, tc.Function.Name
			s.event("response.output_item.added", "output_index", s.open.index,
				"item", callItem(s.open.id, "in_progress", tc.ID, tc.Function.Name, "", s.info.Tools))
		}
		if tc.Function.Arguments != "" {
			s.open.text.WriteString(tc.Function.Arguments)
			if !s.custom() { // a custom tool's input is known only whole
				s.event("response.function_call_arguments.delta", "item_id", s.open.id, "output_index", s.open.index,
					"delta", tc.Function.Arguments)
			}
		}
	}
	if ch.FinishReason != nil && *ch.FinishReason != "" {
		s.finish = *ch.FinishReason
	}
}

func (s *streamer) custom() bool { return s.info.Tools[s.open.name].Custom }

func (s *streamer) start(chatID string, created int64) {
	if s.started {
		return
	}
	s.started = true
	if created == 0 {
		created = time.Now().Unix()
	}
	s.r = &response{id: responseID(chatID), created: created, info: s.info}
	first := s.r.object("in_progress", nil, nil, nil, nil)
	s.event("response.created", "response", first)
	s.event("response.in_progress", "response", first)
}

// item opens an item of kind unless one is open (a call: unless that
// call is); chatIndex is a call's index in the chat stream.
func (s *streamer) item(kind string, chatIndex int) {
	if s.open != nil && s.open.kind == kind && kind != "call" {
		return
	}
	s.close()
	it := &openItem{kind: kind, index: len(s.output), chatIndex: chatIndex}
	suffix := s.r.id[len("resp_"):]
	switch kind {
	case "message":
		it.id = "msg_" + suffix + "_" + itoa(it.index)
		s.open = it
		s.event("response.output_item.added", "output_index", it.index, "item", messageItem(it.id, "in_progress", ""))
		s.event("response.content_part.added", "item_id", it.id, "output_index", it.index, "content_index", 0, "part", textPart(""))
	case "reasoning":
		it.id = "rs_" + suffix + "_" + itoa(it.index)
		s.open = it
		s.event("response.output_item.added", "output_index", it.index, "item", reasoningItem(it.id, "", false))
	case "call":
		it.id = callItemID(s.r.id, s.calls)
		s.calls++
		s.open = it // its added event needs the call's name: data sends it
	}
}

// close ends the open item.
func (s *streamer) close() {
	it := s.open
	if it == nil {
		return
	}
	s.open = nil
	text := it.text.String()
	var done json.RawMessage
	switch it.kind {
	case "message":
		s.event("response.output_text.done", "item_id", it.id, "output_index", it.index, "content_index", 0, "text", text, "logprobs", []any{})
		s.event("response.content_part.done", "item_id", it.id, "output_index", it.index, "content_index", 0, "part", textPart(text))
		done = messageItem(it.id, "completed", text)
	case "reasoning":
		s.event("response.reasoning_text.done", "item_id", it.id, "output_index", it.index, "content_index", 0, "text", text)
		done = reasoningItem(it.id, text, true)
	case "call":
		if strings.TrimSpace(text) == "" {
			text = "{}"
		}
		done = callItem(it.id, "completed", it.callID, it.name, text, s.info.Tools)
		if s.info.Tools[it.name].Custom {
			var ci struct {
				Input string `json:"input"`
			}
			json.Unmarshal(done, &ci)
			s.event("response.custom_tool_call_input.done", "item_id", it.id, "output_index", it.index, "input", ci.Input)
		} else {
			s.event("response.function_call_arguments.done", "item_id", it.id, "output_index", it.index, "arguments", text)
		}
	}
	s.output = append(s.output, done)
	s.event("response.output_item.done", "output_index", it.index, "item", done)
}

// end closes the response once the chat stream has ended.
func (s *streamer) end() {
	s.start("", 0)
	s.close()
	status, incomplete := ending(s.finish)
	final := s.r.object(status, s.output, usageOf(s.usage), incomplete, nil)
	if status == "incomplete" {
		s.event("response.incomplete", "response", final)
	} else {
		s.event("response.completed", "response", final)
	}
	s.done = true
}

// fail ends the stream with response.failed: what the client has read so
// far stays, and it is told the response will not end.
func (s *streamer) fail(code, message string) {
	s.start("", 0)
	s.close()
	s.event("response.failed", "response", s.r.object("failed", s.output, usageOf(s.usage), nil, obj("code", code, "message", message)))
	s.done = true
}
