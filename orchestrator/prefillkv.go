package orchestrator

import (
	"encoding/json"

	"github.com/evolvellm/evolve/openaiapi"
)

// withPrefillKV adds a prefill leg's "evolve" object to the one in a
// decode leg's answer (or streamed chunk), as its "prefill" member. An
// answer without that object, or one that does not parse, is returned as
// it is.
func withPrefillKV(answer []byte, prefill json.RawMessage) []byte {
	if prefill == nil {
		return answer
	}
	rb, err := openaiapi.ParseObject(answer)
	if err != nil || !rb.Has("evolve") {
		return answer
	}
	ev, err := openaiapi.ParseObject(rb.Members["evolve"])
	if err != nil || ev.Members == nil {
		return answer
	}
	return rb.With(map[string]json.RawMessage{"evolve": ev.With(map[string]json.RawMessage{"prefill": prefill})})
}
