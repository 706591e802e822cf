package openaiapi

import (
	"encoding/json"
	"fmt"
	"math"
)

// Sampling is the sampling parameters of a request, as far as they are
// checked: a simulated engine ignores them, but a request vLLM would refuse
// is refused here too, with vLLM's 400, so that a client learns of its
// mistake on evolve's engines as on vLLM's.
type Sampling struct {
	Temperature       *float64        `json:"temperature"`
	TopP              *float64        `json:"top_p"`
	TopK              *int64          `json:"top_k"`
	MinP              *float64        `json:"min_p"`
	PresencePenalty   *float64        `json:"presence_penalty"`
	FrequencyPenalty  *float64        `json:"frequency_penalty"`
	RepetitionPenalty *float64        `json:"repetition_penalty"`
	Logprobs          json.RawMessage `json:"logprobs"`
	TopLogprobs       *int64          `json:"top_logprobs"`
	Stop              json.RawMessage `json:"stop"`
}

// MaxStopStrings is the most stop strings a request may give. OpenAI's
// API takes 4; vLLM sets no limit, and clients written for vLLM send
// more (lm-evaluation-harness's stop lists): 16 serves them, and refuses
// a list that only makes every engine step test it (each string is
// matched against the output at every token).
const MaxStopStrings = 16

// MaxLogprobs is the most log probabilities a request may ask for per
// token (vLLM's default --max-logprobs).
const MaxLogprobs = 20

// chatRoles are the roles a chat message may have (OpenAI's, and vLLM's
// for its chat templates).
var chatRoles = map[string]bool{"system": true, "developer": true, "user": true, "assistant": true, "tool": true, "function": true}

// check refuses parameters out of their range, in vLLM's words.
func (s *Sampling) check(chat bool) *Error {
	between := func(name string, v *float64, lo, hi float64, loOpen bool, what string) *Error {
		if v == nil {
			return nil
		}
		if math.IsNaN(*v) || *v < lo || *v > hi || (loOpen && *v == lo) {
			return BadRequest(name, "%s must be %s, got %g", name, what, *v)
		}
		return nil
	}
	for _, e := range []*Error{
		between("temperature", s.Temperature, 0, 2, false, "in [0, 2]"),
		between("top_p", s.TopP, 0, 1, true, "in (0, 1]"),
		between("min_p", s.MinP, 0, 1, false, "in [0, 1]"),
		between("presence_penalty", s.PresencePenalty, -2, 2, false, "in [-2, 2]"),
		between("frequency_penalty", s.FrequencyPenalty, -2, 2, false, "in [-2, 2]"),
		between("repetition_penalty", s.RepetitionPenalty, 0, math.MaxFloat64, true, "greater than zero"),
	} {
		if e != nil {
			return e
		}
	}
	if s.TopK != nil && *s.TopK < -1 {
		return BadRequest("top_k", "top_k must be -1 or 0 (disable), or at least 1, got %d", *s.TopK)
	}
	if err := s.checkLogprobs(chat); err != nil {
		return err
	}
	if len(s.Stop) > 0 && string(s.Stop) != "null" {
		var one string
		var many []string
		if json.Unmarshal(s.Stop, &one) != nil && json.Unmarshal(s.Stop, &many) != nil {
			return BadRequest("stop", "stop must be a string or a list of strings")
		}
		if len(many) > MaxStopStrings {
			return BadRequest("stop", "stop holds %d strings; at most %d are allowed", len(many), MaxStopStrings)
		}
	}
	return nil
}

// checkLogprobs: a completion's logprobs is a count, a chat's a boolean
// with top_logprobs the count; either at most MaxLogprobs.
func (s *Sampling) checkLogprobs(chat bool) *Error {
	tooMany := func(name string, n int64) *Error {
		if n < 0 {
			return BadRequest(name, "%s must be non-negative, got %d", name, n)
		}
		if n > MaxLogprobs {
			return BadRequest(name, "requested %d logprobs, which is more than the %d allowed", n, MaxLogprobs)
		}
		return nil
	}
	if len(s.Logprobs) > 0 && string(s.Logprobs) != "null" {
		if chat {
			var b bool
			if json.Unmarshal(s.Logprobs, &b) != nil {
				return BadRequest("logprobs", "logprobs must be a boolean in a chat request (top_logprobs gives the count)")
			}
		} else {
			var n int64
			if json.Unmarshal(s.Logprobs, &n) != nil {
				return BadRequest("logprobs", "logprobs must be an integer")
			}
			if err := tooMany("logprobs", n); err != nil {
				return err
			}
		}
	}
	if s.TopLogprobs != nil {
		return tooMany("top_logprobs", *s.TopLogprobs)
	}
	return nil
}

// checkRoles refuses a chat message of a role no chat template knows.
func checkRoles(msgs []ChatMessage) *Error {
	for i, m := range msgs {
		if m.Role != "" && !chatRoles[m.Role] {
			return BadRequest(fmt.Sprintf("messages[%d].role", i),
				"messages[%d].role %q: want system, developer, user, assistant or tool", i, m.Role)
		}
	}
	return nil
}
