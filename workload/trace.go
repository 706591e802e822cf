package workload

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/evolvellm/evolve/kv"
)

// TraceBlockSize is the size of the blocks that a trace's hash ids name: 512
// tokens, as in the Mooncake traces.
const TraceBlockSize = 512

// TraceRecord is one request of a trace, one JSON object per line. It is
// the Mooncake format (timestamp in milliseconds, input and output lengths,
// one hash id per 512-token block of the prompt, the last one possibly
// partial; equal ids mean equal prefixes up to that block), extended with
// the agent's session and branch when known. Mooncake's own files, and
// the traces evolve records, read the same way.
type TraceRecord struct {
	Timestamp    float64 `json:"timestamp"` // ms from the start
	InputLength  int     `json:"input_length"`
	OutputLength int     `json:"output_length"`
	HashIDs      []int64 `json:"hash_ids"`
	Session      string  `json:"session,omitempty"`
	Branch       string  `json:"branch,omitempty"`
	Parent       string  `json:"parent,omitempty"`
	Rewrite      bool    `json:"rewrite,omitempty"`
	// Live is what a router's recording adds (evolve orchestrator
	// --record): absent from Mooncake's traces and the simulator's.
	*Live
}

// RecordingVersion is the version of the rows a router records.
const RecordingVersion = 1

// Live is what a router recorded of a request it served, beside what a
// trace has of every request. Times are seconds from its arrival; the
// hash ids are the prompt's blocks salted per cluster, so that a
// recording reveals no text (and equal ids still mean equal prefixes,
// across every router of the cluster).
type Live struct {
	Version   int     `json:"v"`
	UnixMS    float64 `json:"unix_ms"` // arrival, milliseconds since 1970: rows of several routers merge by it
	Router    string  `json:"router"`
	RequestID string  `json:"request_id"`
	API       string  `json:"api"`     // chat, completions, messages, responses
	Outcome   string  `json:"outcome"` // ok, or as evolve_router_requests_total counts it
	QueueSec  float64 `json:"queue_s"` // in the router's queue, before routing
	TTFTSec   float64 `json:"ttft_s,omitempty"`
	E2ESec    float64 `json:"e2e_s"`
	// Where the prompt's KV came from, in tokens: GPU, host, a peer's
	// host pool (fetched), or computed.
	CachedGPU   int    `json:"cached_gpu"`
	CachedHost  int    `json:"cached_host"`
	CachedPeer  int    `json:"cached_peer"`
	Computed    int    `json:"computed"`
	PrefillNode string `json:"prefill_node,omitempty"`
	DecodeNode  string `json:"decode_node,omitempty"`
	Agent       string `json:"agent,omitempty"` // the sub-agent, in the session's tree
	Finish      string `json:"finish_reason,omitempty"`
	ToolCalls   int    `json:"tool_calls,omitempty"`
	// GapSec is the time since the same session's previous answer ended
	// (the agent's tool time); absent for a session's first request.
	GapSec *float64 `json:"gap_s,omitempty"`
}

// Replayable reports whether the record is a request to replay: one a
// router answered, or one of a trace without live fields.
func (r *TraceRecord) Replayable() bool { return r.Live == nil || r.Outcome == "ok" }

// ReadTrace reads a JSONL trace; an error names the line. Records come back
// sorted by timestamp; a recording's requests that were not answered
// (Replayable) are left out.
func ReadTrace(r io.Reader) ([]TraceRecord, error) { return readTrace(r, false) }

// ReadTraceAll is ReadTrace keeping every record, those not answered too.
func ReadTraceAll(r io.Reader) ([]TraceRecord, error) { return readTrace(r, true) }

func readTrace(r io.Reader, all bool) ([]TraceRecord, error) {
	var out []TraceRecord
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 64<<20) // grows as long lines need, up to 64 MB
	line := 0
	for sc.Scan() {
		line++
		text := strings.TrimSpace(sc.Text())
		if text == "" {
			continue
		}
		var rec TraceRecord
		dec := json.NewDecoder(strings.NewReader(text))
		if err := dec.Decode(&rec); err != nil {
			return nil, fmt.Errorf("trace line %d: %w", line, err)
		}
		if !all && !rec.Replayable() {
			continue // refused or failed: recorded, not replayed
		}
		if err := rec.validate(); err != nil {
			return nil, fmt.Errorf("trace line %d: %w", line, err)
		}
		out = append(out, rec)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read trace: %w", err)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Timestamp < out[j].Timestamp })
	return out, nil
}

// TraceSpan is when the last of recs (sorted, as ReadTrace returns them)
// arrives, replayed playback times faster than recorded.
func TraceSpan(recs []TraceRecord, playback float64) time.Duration {
	if len(recs) == 0 || playback <= 0 {
		return 0
	}
	return recs[len(recs)-1].At(playback)
}

// MaxTraceTimestamp bounds a record's timestamp: 10^11 ms, about three
// years, far past any recorded run and far inside time.Duration's range.
const MaxTraceTimestamp = 1e11

// At is when r arrives after the trace's start, replayed playback times
// faster than recorded (see TraceDuration).
func (r *TraceRecord) At(playback float64) time.Duration {
	return TraceDuration(r.Timestamp / playback)
}

// TraceDuration is ms milliseconds as a duration; past time.Duration's
// range (about 292 years, a replay slowed that far) it is the range's end.
func TraceDuration(ms float64) time.Duration {
	ns := ms * float64(time.Millisecond)
	if !(ns < math.MaxInt64) {
		return math.MaxInt64
	}
	return time.Duration(ns)
}

func (r *TraceRecord) validate() error {
	switch {
	case r.InputLength < 1:
		return fmt.Errorf("input_length %d: want at least 1", r.InputLength)
	case r.OutputLength < 1:
		return fmt.Errorf("output_length %d: want at least 1", r.OutputLength)
	case r.Timestamp < 0:
		return fmt.Errorf("timestamp %v is negative", r.Timestamp)
	case r.Timestamp > MaxTraceTimestamp:
		return fmt.Errorf("timestamp %v ms is past %g ms (about three years): timestamps are milliseconds from the trace's start", r.Timestamp, float64(MaxTraceTimestamp))
	case len(r.HashIDs) != (r.InputLength+TraceBlockSize-1)/TraceBlockSize:
		return fmt.Errorf("%d hash_ids for %d input tokens: want one per %d-token block", len(r.HashIDs), r.InputLength, TraceBlockSize)
	}
	return nil
}

// Tokens returns the prompt of a record: each hash id stands for a
// deterministic block of 512 tokens, so records with equal leading ids
// share that prefix token for token.
func (r *TraceRecord) Tokens() []uint32 {
	out := make([]uint32, 0, len(r.HashIDs)*TraceBlockSize)
	for _, id := range r.HashIDs {
		out = content(out, "trace/block", uint64(id), TraceBlockSize)
	}
	return out[:r.InputLength]
}

// TraceWriter records calls as trace lines, naming each distinct 512-token
// prompt block (by its chained hash, so equal ids mean equal prefixes) with
// a small id.
type TraceWriter struct {
	w   *bufio.Writer
	ids map[kv.BlockHash]int64
}

// NewTraceWriter writes a trace to w; call Flush at the end.
func NewTraceWriter(w io.Writer) *TraceWriter {
	return &TraceWriter{w: bufio.NewWriter(w), ids: map[kv.BlockHash]int64{}}
}

// TraceChain is a prompt's chain of 512-token blocks, as a trace names
// them: its full blocks, and its last one, possibly partial.
func TraceChain(tokens []uint32) []kv.BlockHash {
	chain := kv.ChainHashes(tokens, TraceBlockSize)
	if rest := len(tokens) % TraceBlockSize; rest > 0 {
		var parent kv.BlockHash
		if len(chain) > 0 {
			parent = chain[len(chain)-1]
		}
		chain = append(chain, kv.NextHash(parent, len(chain) > 0, tokens[len(tokens)-rest:]))
	}
	return chain
}

// Write records one call sent at ms milliseconds into the run.
func (t *TraceWriter) Write(ms float64, call Call) error {
	chain := TraceChain(call.Tokens)
	rec := TraceRecord{Timestamp: ms, InputLength: len(call.Tokens), OutputLength: call.MaxTokens,
		Session: call.Session, Branch: call.Branch, Parent: call.Parent, Rewrite: call.Rewrite, HashIDs: make([]int64, len(chain))}
	for i, h := range chain {
		id, ok := t.ids[h]
		if !ok {
			id = int64(len(t.ids))
			t.ids[h] = id
		}
		rec.HashIDs[i] = id
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	t.w.Write(b)
	return t.w.WriteByte('\n')
}

// Flush writes what is buffered.
func (t *TraceWriter) Flush() error { return t.w.Flush() }
