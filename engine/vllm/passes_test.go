package vllm

import (
	"math"
	"strings"
	"testing"
	"time"
)

// The three encodings a forward pass comes in read alike: msgspec's map
// (with a field this evolve does not know), vLLM's positional layout with
// its timing scope, and Dynamo's without.
func TestForwardPassEncodings(t *testing.T) {
	scheduled := map[string]any{"num_prefill_requests": 2, "sum_prefill_tokens": 3000, "var_prefill_length": 12.5,
		"sum_prefill_kv_tokens": 8000, "num_decode_requests": 30, "sum_decode_kv_tokens": 240000, "var_decode_kv_tokens": 1.0}
	scheduledList := []any{2, 3000, 12.5, 8000, 30, 240000, 1.0}
	queuedList := []any{4, 50000, 0.0, 1, 9000, 0.0}
	want := ForwardPass{Version: 1, WorkerID: "w-1", DPRank: 0, Counter: 17, WallTime: 0.042,
		Scheduled: PassRequests{PrefillRequests: 2, PrefillTokens: 3000, PrefillKVTokens: 8000, DecodeRequests: 30, DecodeKVTokens: 240000},
		Queued:    PassRequests{PrefillRequests: 4, PrefillTokens: 50000, DecodeRequests: 1, DecodeKVTokens: 9000}}
	for name, v := range map[string]any{
		"map": map[string]any{"version": 1, "worker_id": "w-1", "dp_rank": 0, "counter_id": 17, "timing_scope": "execute_model_cuda",
			"wall_time": 0.042, "scheduled_requests": scheduled, "later": []any{1, 2},
			"queued_requests": map[string]any{"num_prefill_requests": 4, "sum_prefill_tokens": 50000, "var_prefill_length": 0.0,
				"num_decode_requests": 1, "sum_decode_kv_tokens": 9000, "var_decode_kv_tokens": 0.0}},
		"vllm positional":   []any{1, "w-1", 0, 17, "execute_model_cuda", 0.042, scheduledList, queuedList},
		"dynamo positional": []any{1, "w-1", 0, 17, 0.042, scheduledList, queuedList},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := DecodeForwardPass(mustPack(t, v))
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if got != want {
				t.Fatalf("%s: got %+v\nwant %+v", name, got, want)
			}
		})
	}
}

// What a forward pass cannot be is refused with what was wrong, and
// heartbeats are no passes.
func TestForwardPassRefusals(t *testing.T) {
	for name, tc := range map[string]struct {
		payload []byte
		want    string
	}{
		"version 2":       {mustPack(t, map[string]any{"version": 2, "wall_time": 0.01}), "version 2"},
		"negative time":   {mustPack(t, map[string]any{"version": 1, "wall_time": -1.0}), "wall_time -1"},
		"no number":       {mustPack(t, map[string]any{"version": 1, "wall_time": math.NaN()}), "wall_time NaN"},
		"a string":        {mustPack(t, "pass"), "want a map or an array"},
		"negative tokens": {mustPack(t, map[string]any{"version": 1, "wall_time": 0.01, "scheduled_requests": map[string]any{"sum_prefill_tokens": -5}}), "sum_prefill_tokens = -5"},
		"token as text":   {mustPack(t, map[string]any{"version": 1, "wall_time": 0.01, "queued_requests": map[string]any{"num_decode_requests": "3"}}), "queued_requests"},
		"truncated":       {mustPack(t, map[string]any{"version": 1, "wall_time": 0.01})[:5], "decode forward-pass metrics"},
		"lying length":    {[]byte{0xdd, 0xff, 0xff, 0xff, 0xff}, "malformed"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := DecodeForwardPass(tc.payload)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%s: error %v, want one saying %q", name, err, tc.want)
			}
		})
	}
	idle, err := DecodeForwardPass(mustPack(t, map[string]any{"version": 1, "worker_id": "w", "wall_time": 0.0,
		"scheduled_requests": map[string]any{}, "queued_requests": map[string]any{}}))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := idle.Record(time.Now()); ok || !idle.Heartbeat() {
		t.Fatalf("a heartbeat made a pass record: %+v", idle)
	}
}

// A pass becomes the planner's record: a lone prefill's attended context
// is exact, several prefills count as alike, and a decode reads its
// context plus its new token.
func TestForwardPassRecord(t *testing.T) {
	end := time.Date(2026, 12, 5, 1, 0, 0, 0, time.UTC)
	one := ForwardPass{Version: 1, WallTime: 0.25, Scheduled: PassRequests{PrefillRequests: 1, PrefillTokens: 1000,
		PrefillKVTokens: 9000, DecodeRequests: 3, DecodeKVTokens: 600}, Queued: PassRequests{PrefillRequests: 2, DecodeRequests: 1}}
	rec, ok := one.Record(end)
	if !ok {
		t.Fatal("a pass made no record")
	}
	if rec.DurationSec != 0.25 || !rec.Start.Equal(end.Add(-250*time.Millisecond)) || rec.PrefillTokens != 1000 ||
		rec.PrefillAttended != 1000*(9000+500) || rec.DecodeSeqs != 3 || rec.DecodeContext != 603 || rec.Running != 4 || rec.Waiting != 3 {
		t.Fatalf("record %+v", rec)
	}
	two := one
	two.Scheduled = PassRequests{PrefillRequests: 2, PrefillTokens: 2000, PrefillKVTokens: 18000}
	rec, _ = two.Record(end)
	if rec.PrefillAttended != 2*1000*(9000+500) {
		t.Fatalf("two alike prefills attend %v pairs, want %v", rec.PrefillAttended, 2*1000*(9000+500))
	}
}
