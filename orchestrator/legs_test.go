package orchestrator

import (
	"encoding/json"
	"fmt"
	"reflect"
	"testing"

	"github.com/evolvellm/evolve/openaiapi"
)

// The legs keep every member the client sent, byte for byte, and change
// only those asked: a prefill leg of a streamed request with
// max_completion_tokens, and a decode leg carrying the KV parameters.
func TestRelayBodyLegs(t *testing.T) {
	body := []byte(` {"model": "m", "prompt": [1, 2,3], "stream": true, "stream_options": {"include_usage": true},
		"max_completion_tokens": 40, "metadata": {"session": "s1", "branch": "b"}, "temperature": 0.7} `)
	rb, err := openaiapi.ParseObject(body)
	if err != nil {
		t.Fatal(err)
	}
	leg := rb.With(map[string]json.RawMessage{"max_completion_tokens": jsonOne, "stream": jsonFalse, "stream_options": nil, "kv_transfer_params": prefillKV})
	var got, want map[string]any
	if err := json.Unmarshal(leg, &got); err != nil {
		t.Fatalf("prefill leg is not JSON: %v\n%s", err, leg)
	}
	json.Unmarshal([]byte(`{"model": "m", "prompt": [1,2,3], "stream": false, "max_completion_tokens": 1,
		"metadata": {"session": "s1", "branch": "b"}, "temperature": 0.7,
		"kv_transfer_params": {"do_remote_decode": true, "do_remote_prefill": false, "remote_block_ids": null,
		"remote_engine_id": null, "remote_host": null, "remote_port": null}}`), &want)
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("prefill leg\n got %v\nwant %v", got, want)
	}
	p, perr := openaiapi.Parse(leg, false, 0)
	if perr != nil || p.MaxTokens != 1 || p.Req.Stream || !p.KV.DoRemoteDecode || len(p.Tokens) != 3 {
		t.Fatalf("an engine reads the prefill leg as %+v, %v", p, perr)
	}

	dec := rb.With(map[string]json.RawMessage{"kv_transfer_params": json.RawMessage(`{"remote_request_id": "r1"}`)})
	got = nil
	if err := json.Unmarshal(dec, &got); err != nil {
		t.Fatalf("decode leg is not JSON: %v\n%s", err, dec)
	}
	if got["stream"] != true || got["max_completion_tokens"] != 40.0 || got["kv_transfer_params"].(map[string]any)["remote_request_id"] != "r1" || len(got) != 8 {
		t.Fatalf("decode leg %v", got)
	}
	if _, err := openaiapi.ParseObject([]byte(`[1, 2]`)); err == nil {
		t.Fatal("a list is not a request body")
	}
}

// BenchmarkFrontDoorBody is what the router spends on a disaggregated
// request's body before any engine sees it: reading it and keeping its
// members (openaiapi.ParseBody), and writing the prefill and decode legs.
// The prompt is a context given as token ids, as evolve bench's agents
// send theirs: 32K tokens, and 128K (a long coding session).
func BenchmarkFrontDoorBody(b *testing.B) {
	for _, n := range []int{32 << 10, 128 << 10} {
		ids := make([]int, n)
		for i := range ids {
			ids[i] = 1000 + (i*7919)%120000
		}
		body, _ := json.Marshal(map[string]any{"model": "m", "prompt": ids, "max_tokens": 512, "ignore_eos": true, "stream": true,
			"stream_options": map[string]bool{"include_usage": true}})
		kvp := json.RawMessage(`{"do_remote_prefill": true, "remote_request_id": "cmpl-e0-1", "remote_host": "127.0.0.1", "remote_port": 8100}`)
		b.Run(fmt.Sprintf("%dk", n>>10), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				_, rb, err := openaiapi.ParseBody(body, false, 0)
				if err != nil {
					b.Fatal(err)
				}
				rb.With(map[string]json.RawMessage{"max_tokens": jsonOne, "stream": jsonFalse, "stream_options": nil, "kv_transfer_params": prefillKV})
				rb.With(map[string]json.RawMessage{"kv_transfer_params": kvp})
			}
		})
	}
}
