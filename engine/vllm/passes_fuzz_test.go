package vllm

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// FuzzDecodeForwardPass feeds arbitrary payloads, as a vLLM of another
// version or a stray publisher on the port could send, to the forward-pass
// decoder: it may refuse one, never panic, and a pass it takes makes a
// record of finite, non-negative figures the planner can fit.
func FuzzDecodeForwardPass(f *testing.F) {
	sched := map[string]any{"num_prefill_requests": 1, "sum_prefill_tokens": 512, "var_prefill_length": 0.0, "sum_prefill_kv_tokens": 1024,
		"num_decode_requests": 8, "sum_decode_kv_tokens": 4096, "var_decode_kv_tokens": 0.0}
	queued := map[string]any{"num_prefill_requests": 2, "sum_prefill_tokens": 64, "var_prefill_length": 0.0,
		"num_decode_requests": 0, "sum_decode_kv_tokens": 0, "var_decode_kv_tokens": 0.0}
	for _, v := range []any{
		map[string]any{"version": 1, "worker_id": "w", "dp_rank": 0, "counter_id": 3, "wall_time": 0.02, "scheduled_requests": sched, "queued_requests": queued},
		[]any{1, "w", 0, 3, "execute", 0.02, sched, queued},
		[]any{1, "w", 0, 3, 0.02, sched, queued},
	} {
		b, err := msgpack.Marshal(v)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0xdd, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, payload []byte) {
		fp, err := DecodeForwardPass(payload)
		if err != nil {
			return
		}
		rec, ok := fp.Record(time.Unix(1000, 0))
		if !ok {
			return
		}
		for name, v := range map[string]float64{"duration": rec.DurationSec, "attended": rec.PrefillAttended} {
			if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
				t.Fatalf("a taken pass has %s %v: %+v", name, v, fp)
			}
		}
		if rec.PrefillTokens < 0 || rec.DecodeSeqs < 0 || rec.Running < 0 || rec.Waiting < 0 {
			t.Fatalf("a taken pass has negative counts: %+v", rec)
		}
	})
}

// FuzzParseMetrics feeds arbitrary text to the /metrics parser, as a
// server that is not quite vLLM could answer: refused or read, never a
// panic, and the load it reads is finite.
func FuzzParseMetrics(f *testing.F) {
	f.Add("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"m\"} 3\nvllm:num_requests_waiting{model_name=\"m\"} 1\n")
	f.Add("vllm:kv_cache_usage_perc 0.5\nvllm:prefix_cache_hits_total 10\nvllm:prompt_tokens_total NaN\n")
	f.Add("vllm:num_requests_running +Inf\n")
	f.Fuzz(func(t *testing.T, text string) {
		_, _ = ParseMetrics(strings.NewReader(text))
	})
}
