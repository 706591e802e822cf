package vllm

import (
	"bytes"
	"fmt"
	"math"
	"time"

	"github.com/evolvellm/evolve/protocol"
	"github.com/vmihailenco/msgpack/v5"
)

// ForwardPass is one message of vLLM's forward-pass metrics: what one
// model execution ran and how long it took. vLLM publishes them on a ZMQ
// PUB socket when started with --forward-pass-metrics-port (Dynamo's
// InstrumentedScheduler publishes the same schema for older vLLMs). A
// message whose WallTime is 0 and that scheduled nothing is a heartbeat.
type ForwardPass struct {
	Version  int
	WorkerID string
	DPRank   int
	Counter  int64
	// WallTime is the pass's duration in seconds (vLLM's timing_scope
	// "execute_model_cuda": the model's execution on the GPU timeline).
	WallTime float64
	// Scheduled is what the pass computed; Queued what waited after it.
	Scheduled, Queued PassRequests
}

// PassRequests is a request group of a forward pass, as vLLM sums it.
type PassRequests struct {
	PrefillRequests int
	PrefillTokens   int // tokens computed (scheduled) for prefilling requests
	// PrefillKVTokens is the context those requests had before the pass
	// (prefix-cache hits and earlier chunks), which their new tokens attend.
	PrefillKVTokens int
	DecodeRequests  int
	DecodeKVTokens  int // the decoding requests' context before the pass
}

// forwardPassVersion is the schema version this agent reads.
const forwardPassVersion = 1

// Field names of the schema, in its positional order. vLLM's native
// publisher has timing_scope before wall_time; Dynamo's does not.
var (
	passFields      = []string{"version", "worker_id", "dp_rank", "counter_id", "timing_scope", "wall_time", "scheduled_requests", "queued_requests"}
	passFieldsNoTS  = []string{"version", "worker_id", "dp_rank", "counter_id", "wall_time", "scheduled_requests", "queued_requests"}
	scheduledFields = []string{"num_prefill_requests", "sum_prefill_tokens", "var_prefill_length", "sum_prefill_kv_tokens", "num_decode_requests", "sum_decode_kv_tokens", "var_decode_kv_tokens"}
	queuedFields    = []string{"num_prefill_requests", "sum_prefill_tokens", "var_prefill_length", "num_decode_requests", "sum_decode_kv_tokens", "var_decode_kv_tokens"}
)

// DecodeForwardPass decodes one forward-pass metrics payload (msgpack),
// as a map of field names (msgspec's default) or positionally. Fields a
// newer vLLM adds are ignored; a schema version other than 1 is refused.
func DecodeForwardPass(payload []byte) (ForwardPass, error) {
	var fp ForwardPass
	if err := checkShape(payload); err != nil {
		return fp, fmt.Errorf("decode forward-pass metrics: %w", err)
	}
	dec := msgpack.NewDecoder(bytes.NewReader(payload))
	dec.UseLooseInterfaceDecoding(true)
	var v any
	if err := dec.Decode(&v); err != nil {
		return fp, fmt.Errorf("decode forward-pass metrics: %w", err)
	}
	f, err := named(v, func(x []any) []string {
		// Positional: the native layout names its timing scope (a string)
		// fifth, where Dynamo's has the wall time.
		if len(x) > 4 {
			if _, ok := x[4].(string); ok {
				return passFields
			}
		}
		return passFieldsNoTS
	})
	if err != nil {
		return fp, fmt.Errorf("forward-pass metrics: %w", err)
	}
	version, ok := toInt(f["version"])
	if !ok {
		version = forwardPassVersion // Dynamo's first releases sent none
	}
	if version != forwardPassVersion {
		return fp, fmt.Errorf("forward-pass metrics version %d: this evolve reads version %d", version, forwardPassVersion)
	}
	fp.Version = int(version)
	fp.WorkerID, _ = f["worker_id"].(string)
	n, _ := toInt(f["dp_rank"])
	fp.DPRank = int(n)
	fp.Counter, _ = toInt(f["counter_id"])
	fp.WallTime, _ = toFloat(f["wall_time"])
	if fp.WallTime < 0 || math.IsNaN(fp.WallTime) || math.IsInf(fp.WallTime, 0) {
		return fp, fmt.Errorf("forward-pass metrics: wall_time %g", fp.WallTime)
	}
	if fp.Scheduled, err = passRequests(f["scheduled_requests"], scheduledFields); err != nil {
		return fp, fmt.Errorf("forward-pass metrics scheduled_requests: %w", err)
	}
	if fp.Queued, err = passRequests(f["queued_requests"], queuedFields); err != nil {
		return fp, fmt.Errorf("forward-pass metrics queued_requests: %w", err)
	}
	return fp, nil
}

// named reads a map, or an array whose field names order gives, as a map.
func named(v any, order func([]any) []string) (map[string]any, error) {
	switch x := v.(type) {
	case map[string]any:
		return x, nil
	case []any:
		names := order(x)
		f := make(map[string]any, len(names))
		for i, name := range names {
			if i < len(x) {
				f[name] = x[i]
			}
		}
		return f, nil
	}
	return nil, fmt.Errorf("a %T, want a map or an array", v)
}

func passRequests(v any, fields []string) (PassRequests, error) {
	var r PassRequests
	if v == nil {
		return r, nil
	}
	f, err := named(v, func([]any) []string { return fields })
	if err != nil {
		return r, err
	}
	count := func(name string) (int, error) {
		x := f[name]
		if x == nil {
			return 0, nil
		}
		n, ok := toInt(x)
		if !ok || n < 0 || n > 1<<40 {
			return 0, fmt.Errorf("%s = %v", name, x)
		}
		return int(n), nil
	}
	for _, c := range []struct {
		name string
		to   *int
	}{{"num_prefill_requests", &r.PrefillRequests}, {"sum_prefill_tokens", &r.PrefillTokens},
		{"sum_prefill_kv_tokens", &r.PrefillKVTokens}, {"num_decode_requests", &r.DecodeRequests},
		{"sum_decode_kv_tokens", &r.DecodeKVTokens}} {
		if *c.to, err = count(c.name); err != nil {
			return r, err
		}
	}
	return r, nil
}

// Heartbeat says whether the message reports no pass: vLLM sends one a
// second while idle, and one when it goes idle.
func (fp ForwardPass) Heartbeat() bool {
	s := fp.Scheduled
	return fp.WallTime == 0 || s.PrefillTokens == 0 && s.DecodeRequests == 0
}

// Record turns a pass that ended at end into evolve's pass record, for the
// planner's cost models; ok is false for a heartbeat.
//
// vLLM sums its prefilling requests, where the planner wants the context
// each new token attends: a chunk of n new tokens after c cached ones
// attends n*(c+n/2). For one request (a long prompt fills a pass alone)
// that is exact; for k requests it is taken as k equal requests, which is
// exact when they are alike. A decoding request's context after the pass
// is its context before plus its new token.
func (fp ForwardPass) Record(end time.Time) (protocol.PassRecord, bool) {
	if fp.Heartbeat() {
		return protocol.PassRecord{}, false
	}
	s, q := fp.Scheduled, fp.Queued
	rec := protocol.PassRecord{
		Start: end.Add(-time.Duration(fp.WallTime * float64(time.Second))), DurationSec: fp.WallTime,
		PrefillTokens: s.PrefillTokens, DecodeSeqs: s.DecodeRequests, DecodeContext: s.DecodeKVTokens + s.DecodeRequests,
		Running: s.PrefillRequests + s.DecodeRequests, Waiting: q.PrefillRequests + q.DecodeRequests,
	}
	if s.PrefillTokens > 0 {
		k := float64(max(s.PrefillRequests, 1))
		n, c := float64(s.PrefillTokens)/k, float64(s.PrefillKVTokens)/k
		rec.PrefillAttended = k * n * (c + n/2)
	}
	return rec, true
}
