package responsesapi

import (
	"net/http/httptest"
	"os"
	"testing"

	"github.com/evolvellm/evolve/openaiapi"
)

// Whatever a client sends, ToChat refuses it with a 400 or returns a chat
// request the chat server takes.
func FuzzToChat(f *testing.F) {
	if b, err := os.ReadFile("testdata/codex-0.171-turn.json"); err == nil {
		f.Add(b)
	}
	f.Add([]byte(`{"model":"m","input":"hi","tools":[{"type":"namespace","name":"ns","tools":[{"type":"function","name":"f"}]},{"type":"custom","name":"c"}],"tool_choice":"required"}`))
	f.Add([]byte(`{"model":"m","input":[{"type":"function_call","call_id":"c","name":"f","namespace":"ns","arguments":""},{"type":"function_call_output","call_id":"c","output":[{"type":"input_image","image_url":"data:x"}]}]}`))
	f.Add([]byte(`{"model":"m","input":[{"role":"developer","content":[{"type":"input_text","text":"x"}]}],"text":{"format":{"type":"json_schema","schema":{}}}}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		chat, _, err := ToChat(body)
		if err != nil {
			if err.Status != 400 {
				t.Fatalf("refused %s with %d", body, err.Status)
			}
			return
		}
		if _, perr := openaiapi.Parse(chat, true, 0); perr != nil {
			t.Fatalf("accepted %s, but its chat request %s is refused: %v", body, chat, perr)
		}
	})
}

// Whatever an engine streams or answers, the translation writes events
// (or a Response) without panicking.
func FuzzStream(f *testing.F) {
	f.Add([]byte(`data: {"id":"c","choices":[{"index":0,"delta":{"content":"hi","reasoning_content":"r","tool_calls":[{"index":0,"id":"x","function":{"name":"f","arguments":"{"}}]}}]}` + "\n\ndata: [DONE]\n\n"))
	f.Add([]byte("data: {\"error\":{\"message\":\"m\"}}\n\ndata: [DONE]\n\n"))
	f.Add([]byte("data: not json\n\n"))
	f.Add([]byte(`{"id":"c","choices":[{"index":0,"message":{"content":"x","tool_calls":[{"id":"a","function":{"name":"c","arguments":"{\"input\":\"p\"}"}}]},"finish_reason":"length"}]}`))
	info := Info{Model: "m", Stream: true, Tools: map[string]ToolName{"c": {Name: "c", Custom: true}, "ns__f": {Name: "f", Namespace: "ns"}}}
	f.Fuzz(func(t *testing.T, stream []byte) {
		tw := NewWriter(httptest.NewRecorder(), info)
		tw.Header().Set("Content-Type", "text/event-stream")
		tw.WriteHeader(200)
		tw.Write(stream)
		tw.Finish()
		whole := NewWriter(httptest.NewRecorder(), Info{Model: "m", Tools: info.Tools})
		whole.Write(stream)
		whole.Finish()
	})
}
