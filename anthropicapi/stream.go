package anthropicapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
)

// streamer turns a chat completion's stream chunks into a Message's
// stream events: message_start, then for each block content_block_start,
// its deltas and content_block_stop, then message_delta (stop reason and
// usage) and message_stop once the chat stream ends ([DONE]).
type streamer struct {
	out   io.Writer
	info  Info
	begin Usage // the prompt's usage as known when the answer starts, for message_start

	started  bool
	open     string // the open block's type: text, thinking, tool_use; "" for none
	index    int    // the open block's index
	next     int    // the next block's index
	tool     int    // the open tool_use block's chat tool call index
	toolID   string // and its id
	finish   string
	matched  json.RawMessage
	usage    *chatUsage
	done     bool
	writeErr error
}

func (s *streamer) event(typ string, data json.RawMessage) {
	if s.writeErr != nil {
		return
	}
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
	var c chatAnswer
	if err := json.Unmarshal(b, &c); err != nil {
		s.fail(&Error{Type: "api_error", Message: "the engine's stream cannot be read: " + err.Error()})
		return
	}
	if c.Error != nil {
		typ := "api_error"
		if c.Error.Type == "service_unavailable" {
			typ = "overloaded_error"
		}
		s.fail(&Error{Type: typ, Message: c.Error.Message})
		return
	}
	s.start(c.ID)
	if c.Usage != nil {
		s.usage = c.Usage
	}
	if len(c.Choices) == 0 {
		return
	}
	ch := c.Choices[0]
	d := &ch.Delta
	if r := d.ReasoningText(); r != "" {
		s.block("thinking", obj("type", "thinking", "thinking", ""))
		s.delta(obj("type", "thinking_delta", "thinking", r))
	}
	if d.Content != nil && *d.Content != "" {
		s.block("text", obj("type", "text", "text", ""))
		s.delta(obj("type", "text_delta", "text", *d.Content))
	}
	for _, tc := range d.ToolCalls {
		if s.open != "tool_use" || tc.Index != s.tool || (tc.ID != "" && tc.ID != s.toolID) {
			s.close()
			s.tool, s.toolID = tc.Index, tc.ID
			s.block("tool_use", obj("type", "tool_use", "id", tc.ID, "name", tc.Function.Name, "input", obj()))
		}
		if tc.Function.Arguments != "" {
			s.delta(obj("type", "input_json_delta", "partial_json", tc.Function.Arguments))
		}
	}
	if ch.FinishReason != nil && *ch.FinishReason != "" {
		s.finish, s.matched = *ch.FinishReason, ch.StopReason
	}
}

func (s *streamer) start(chatID string) {
	if s.started {
		return
	}
	s.started = true
	s.event("message_start", obj("type", "message_start", "message", obj("id", messageID(chatID), "type", "message",
		"role", "assistant", "model", s.info.Model, "content", []any{}, "stop_reason", nil, "stop_sequence", nil,
		"usage", s.begin)))
}

// block opens a block of type typ unless one is open.
func (s *streamer) block(typ string, start json.RawMessage) {
	if s.open == typ && typ != "tool_use" {
		return
	}
	s.close()
	s.open, s.index = typ, s.next
	s.next++
	s.event("content_block_start", obj("type", "content_block_start", "index", s.index, "content_block", start))
}

func (s *streamer) delta(d json.RawMessage) {
	s.event("content_block_delta", obj("type", "content_block_delta", "index", s.index, "delta", d))
}

func (s *streamer) close() {
	if s.open == "" {
		return
	}
	if s.open == "thinking" {
		// A thinking block ends with its signature; an open model has none.
		s.delta(obj("type", "signature_delta", "signature", ""))
	}
	s.event("content_block_stop", obj("type", "content_block_stop", "index", s.index))
	s.open = ""
}

// end closes the message once the chat stream has ended.
func (s *streamer) end() {
	s.start("")
	s.close()
	reason, seq := stopReason(s.finish, s.matched, s.info.StopSequences)
	s.event("message_delta", obj("type", "message_delta", "delta", obj("stop_reason", reason, "stop_sequence", seq),
		"usage", usageOf(s.usage)))
	s.event("message_stop", obj("type", "message_stop"))
	s.done = true
}

// fail ends the stream with an error event: what the client has read so
// far stays, and it is told the message will not end.
func (s *streamer) fail(e *Error) {
	s.event("error", obj("type", "error", "error", obj("type", e.Type, "message", e.Message)))
	s.done = true
}
