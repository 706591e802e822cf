package anthropicapi

import (
	"net/http/httptest"
	"testing"

	"github.com/evolvellm/evolve/openaiapi"
)

// Whatever a client sends, the translation answers without panicking, and
// a request it accepts becomes a chat request the router and the engines
// accept too.
func FuzzToChat(f *testing.F) {
	f.Add([]byte(codingTurn))
	f.Add([]byte(`{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"Say hi"},{"role":"assistant","content":"Hi"}]}`))
	f.Add([]byte(`{"model":"m","max_tokens":8,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"x"}]}]}`))
	f.Add([]byte(`{"model":"m","max_tokens":8,"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"a","name":"b","input":null}]}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		chat, _, err := ToChat(body)
		if err != nil {
			if err.Status != 400 || err.Message == "" {
				t.Fatalf("refusal %+v", err)
			}
			return
		}
		if _, perr := openaiapi.Parse(chat, true, 0); perr != nil {
			t.Fatalf("accepted %s, but its chat request %s is refused: %v", body, chat, perr)
		}
	})
}

// Whatever an engine streams, the translation writes events without
// panicking.
func FuzzStream(f *testing.F) {
	f.Add([]byte(`data: {"id":"c","choices":[{"index":0,"delta":{"content":"hi","tool_calls":[{"index":0,"id":"x","function":{"name":"f","arguments":"{"}}]}}]}` + "\n\ndata: [DONE]\n\n"))
	f.Add([]byte("data: {\"error\":{\"message\":\"m\"}}\n\ndata: [DONE]\n\n"))
	f.Add([]byte("data: not json\n\n"))
	f.Fuzz(func(t *testing.T, stream []byte) {
		tw := NewWriter(httptest.NewRecorder(), Info{Model: "m", Stream: true}, UsageHeaders{})
		tw.Header().Set("Content-Type", "text/event-stream")
		tw.WriteHeader(200)
		tw.Write(stream)
		tw.Finish()
		whole := NewWriter(httptest.NewRecorder(), Info{Model: "m"}, UsageHeaders{})
		whole.Write(stream)
		whole.Finish()
	})
}
