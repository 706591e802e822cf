package orchestrator

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/evolvellm/evolve/kv"
	"github.com/evolvellm/evolve/openaiapi"
	"github.com/evolvellm/evolve/workload"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/zeebo/xxh3"
)

// Recording the fleet's own traffic (Config.RecordDir): one row per
// request, as workload.TraceRecord with its Live fields, in gzipped JSONL
// files that rotate by size. The rows are written off the request path:
// a request hands its row to a bounded queue and goes on; a full queue, a
// slow disk or a failing one drops rows, counted in
// evolve_record_rows_total{outcome}, and never slows or fails a request.
// Several routers of a cluster record into one directory without loss:
// each writes files of its own name, each row names its router, and the
// prompt's block ids are salted with the cluster's salt (a key of the
// event plane's store), so that equal prefixes have equal ids across
// routers and a recording reveals no text.

// recordQueue is how many rows wait for the writer at most.
const recordQueue = 8192

// recordRotate is the size (uncompressed) past which a file is closed
// and the next begun.
const recordRotate = 256 << 20

// recordRetry is how long the writer waits after a failed write before it
// opens a new file.
const recordRetry = 5 * time.Second

// recorder writes a router's rows.
type recorder struct {
	dir    string
	router string
	salt   uint64
	rows   chan recordRow
	start  time.Time
	log    interface{ Warn(string, ...any) }

	written, dropped, failed atomic.Int64

	// last is when each session's last answer ended, for the rows'
	// gap (the agent's tool time); pruned of sessions idle an hour.
	mu   sync.Mutex
	last map[string]time.Time
}

// recordRow is a request's row, its prompt's block ids made (a prompt
// is never held in the queue: a slow disk would hold thousands).
type recordRow struct {
	rec workload.TraceRecord
}

// recordSaltKey is the cluster's salt in the cluster bucket.
const (
	clusterBucket  = "evolve_cluster"
	recordSaltKey  = "record_salt"
	recordSaltSize = 8
)

// recordSalt is the cluster's salt: the one in the event plane's store,
// or a new one put there (the first router to record makes it).
func recordSalt(ctx context.Context, js jetstream.JetStream, replicas int) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	b, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: clusterBucket, Description: "evolve cluster settings", Replicas: replicas})
	if err != nil {
		return 0, fmt.Errorf("open key-value bucket %s: %w", clusterBucket, err)
	}
	var salt [recordSaltSize]byte
	if _, err := rand.Read(salt[:]); err != nil {
		return 0, err
	}
	if _, err := b.Create(ctx, recordSaltKey, salt[:]); err != nil {
		e, gerr := b.Get(ctx, recordSaltKey)
		if gerr != nil || len(e.Value()) != recordSaltSize {
			return 0, fmt.Errorf("the cluster's recording salt: %w", err)
		}
		copy(salt[:], e.Value())
	}
	return binary.LittleEndian.Uint64(salt[:]), nil
}

func newRecorder(dir, router string, salt uint64, log interface{ Warn(string, ...any) }) (*recorder, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("--record %s: %w", dir, err)
	}
	return &recorder{dir: dir, router: router, salt: salt, rows: make(chan recordRow, recordQueue), start: time.Now(),
		log: log, last: map[string]time.Time{}}, nil
}

// add hands a row to the writer, or drops it when the queue is full.
func (rc *recorder) add(row recordRow) {
	if rc == nil {
		return
	}
	select {
	case rc.rows <- row:
	default:
		rc.dropped.Add(1)
	}
}

// gap is the time since the agent's (a session's root agent, or one of
// its sub-agents) last answer ended, and notes this one ending at end;
// nil for its first.
func (rc *recorder) gap(session, agent string, arrival, end time.Time) *float64 {
	if session == "" {
		return nil
	}
	key := session + "\x00" + agent
	rc.mu.Lock()
	defer rc.mu.Unlock()
	prev, ok := rc.last[key]
	if end.After(prev) {
		rc.last[key] = end
	}
	if !ok {
		return nil
	}
	g := max(arrival.Sub(prev).Seconds(), 0)
	return &g
}

// run writes rows until ctx ends, then what is queued.
func (rc *recorder) run(ctx context.Context) {
	var f *recordFile
	var failedAt time.Time
	write := func(row recordRow) {
		if f == nil {
			if time.Since(failedAt) < recordRetry {
				rc.dropped.Add(1)
				return
			}
			var err error
			if f, err = rc.open(); err != nil {
				rc.fail(err)
				failedAt, f = time.Now(), nil
				rc.dropped.Add(1)
				return
			}
		}
		if err := f.write(rc.finish(row)); err != nil {
			rc.lose(f, err)
			failedAt, f = time.Now(), nil
			rc.dropped.Add(1)
			return
		}
		if f.size >= recordRotate {
			if err := f.close(); err != nil {
				rc.lose(f, err)
			} else {
				rc.written.Add(f.take())
			}
			f = nil
		}
	}
	flush := time.NewTicker(time.Second)
	defer flush.Stop()
	prune := time.NewTicker(time.Minute)
	defer prune.Stop()
	for {
		select {
		case row := <-rc.rows:
			write(row)
		case now := <-prune.C:
			rc.mu.Lock()
			for k, t := range rc.last {
				if now.Sub(t) > time.Hour {
					delete(rc.last, k)
				}
			}
			rc.mu.Unlock()
		case <-flush.C:
			if f != nil {
				if err := f.flush(); err != nil {
					rc.lose(f, err)
					failedAt, f = time.Now(), nil
				} else {
					rc.written.Add(f.take())
				}
			}
		case <-ctx.Done():
			for {
				select {
				case row := <-rc.rows:
					write(row)
					continue
				default:
				}
				break
			}
			if f != nil {
				if err := f.close(); err != nil {
					rc.lose(f, err)
				} else {
					rc.written.Add(f.take())
				}
			}
			return
		}
	}
}

// lose counts the rows of f not yet on disk as dropped, after err, and
// closes f.
func (rc *recorder) lose(f *recordFile, err error) {
	rc.fail(err)
	f.close()
	if f.rows == f.pending {
		os.Remove(f.path) // nothing of it was kept
	}
	rc.dropped.Add(f.take())
}

func (rc *recorder) fail(err error) {
	if rc.failed.Add(1) == 1 || rc.failed.Load()%1000 == 0 {
		rc.log.Warn("recording: rows are dropped while the recording cannot be written; requests are served as before", "dir", rc.dir, "err", err)
	}
}

// blockIDs are a prompt's 512-token blocks as salted ids.
func (rc *recorder) blockIDs(tokens []uint32) []int64 {
	chain := workload.TraceChain(tokens)
	ids := make([]int64, len(chain))
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], rc.salt)
	for i, h := range chain {
		binary.LittleEndian.PutUint64(b[8:], uint64(h))
		ids[i] = int64(xxh3.Hash(b[:]) >> 1)
	}
	return ids
}

// finish puts a row on the recording's clock.
func (rc *recorder) finish(row recordRow) workload.TraceRecord {
	rec := row.rec
	rec.Timestamp = max(row.rec.UnixMS-float64(rc.start.UnixMilli()), 0)
	return rec
}

// recordFile is one file of the recording.
type recordFile struct {
	path string
	f    *os.File
	zw   *gzip.Writer
	bw   *bufio.Writer
	size int64
	// pending is the rows written since the last flush that succeeded:
	// written once flushed, dropped if the flush fails; rows all of them.
	pending, rows int64
}

// take is the rows pending, now counted.
func (f *recordFile) take() int64 {
	n := f.pending
	f.pending = 0
	return n
}

func (rc *recorder) open() (*recordFile, error) {
	name := fmt.Sprintf("evolve-%s-%s.jsonl.gz", rc.router, time.Now().UTC().Format("20060102T150405.000000"))
	path := filepath.Join(rc.dir, name)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, err
	}
	zw := gzip.NewWriter(f)
	return &recordFile{path: path, f: f, zw: zw, bw: bufio.NewWriterSize(zw, 64<<10)}, nil
}

func (f *recordFile) write(rec workload.TraceRecord) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	n, err := f.bw.Write(append(b, '\n'))
	f.size += int64(n)
	if err == nil {
		f.pending++
		f.rows++
	}
	return err
}

func (f *recordFile) flush() error {
	if err := f.bw.Flush(); err != nil {
		return err
	}
	return f.zw.Flush()
}

func (f *recordFile) close() error {
	err := f.bw.Flush()
	if cerr := f.zw.Close(); err == nil {
		err = cerr
	}
	if cerr := f.f.Close(); err == nil {
		err = cerr
	}
	return err
}

// requestTrace is what serving a request learns for its recorded row; it
// rides in the request's context (countRequest gives it the outcome).
type requestTrace struct {
	outcome  string
	routedAt time.Time // out of the router's queue
	hits     hitSplit  // where the first placement found the prompt's KV
	last     *attempt  // the last attempt: its nodes, tokens and answer
}

// hitSplit is where a prompt's KV comes from, in tokens.
type hitSplit struct{ gpu, host, peer, computed int }

type requestTraceKey struct{}

// traceOf is r's trace, or nil when nothing records.
func traceOf(r *http.Request) *requestTrace {
	t, _ := r.Context().Value(requestTraceKey{}).(*requestTrace)
	return t
}

// tracing gives r a trace when the router records.
func (o *Orchestrator) tracing(r *http.Request) *http.Request {
	if o.rec == nil {
		return r
	}
	return r.WithContext(context.WithValue(r.Context(), requestTraceKey{}, &requestTrace{}))
}

// recordRequest hands the row of a request served (or refused after it
// was tokenized) to the recorder.
func (o *Orchestrator) recordRequest(r *http.Request, p *openaiapi.Parsed, turn kv.Turn, arrival time.Time) {
	t := traceOf(r)
	if t == nil || o.rec == nil {
		return
	}
	end := time.Now()
	out := 0
	live := &workload.Live{Version: workload.RecordingVersion, UnixMS: float64(arrival.UnixNano()) / 1e6, Router: o.rec.router,
		API: apiOf(r.URL.Path), Outcome: t.outcome, E2ESec: end.Sub(arrival).Seconds(),
		CachedGPU: t.hits.gpu, CachedHost: t.hits.host, CachedPeer: t.hits.peer, Computed: t.hits.computed,
		Agent: turn.Agent}
	if api, ok := r.Context().Value(apiKey{}).(string); ok {
		live.API = api // served as a chat completion, asked in another API
	}
	live.RequestID = r.Header.Get("X-Request-Id")
	if !t.routedAt.IsZero() {
		live.QueueSec = t.routedAt.Sub(arrival).Seconds()
	}
	if a := t.last; a != nil {
		live.RequestID = a.reqID
		live.PrefillNode, live.DecodeNode = a.dec.Prefill, a.decode
		if !a.firstAt.IsZero() {
			live.TTFTSec = a.firstAt.Sub(arrival).Seconds()
		}
		out = a.outTokens
		live.Finish, live.ToolCalls = a.finish, a.toolCalls
	}
	if live.Outcome == "ok" {
		live.GapSec = o.rec.gap(turn.Session, turn.Agent, arrival, end)
	}
	// The block ids are made here, the answer sent: tens of microseconds
	// for a 128K-token prompt, where a queue of prompts could hold
	// gigabytes while a disk is slow.
	rec := workload.TraceRecord{InputLength: len(p.Tokens), OutputLength: max(out, 1), Session: turn.Session,
		Branch: turn.Branch, Parent: turn.Parent, Live: live, HashIDs: o.rec.blockIDs(p.Tokens)}
	o.rec.add(recordRow{rec: rec})
}

type apiKey struct{}

// withAPI marks r, served as a chat completion, as asked in api.
func withAPI(r *http.Request, api string) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), apiKey{}, api))
}

// noteFinish reads an answer's (or a streamed chunk's) finish reason and
// the tool calls it begins, for the recording; only when something
// records, and only for what can carry them.
func (a *attempt) noteFinish(b []byte) {
	if a.o.rec == nil || (!bytes.Contains(b, []byte(`"finish_reason":"`)) && !bytes.Contains(b, []byte(`"tool_calls":[`))) {
		return
	}
	var c openaiapi.ChatAnswer
	if json.Unmarshal(b, &c) != nil || len(c.Choices) == 0 {
		return
	}
	ch := c.Choices[0]
	if ch.FinishReason != nil && *ch.FinishReason != "" {
		a.finish = *ch.FinishReason
	}
	for _, tc := range append(ch.Message.ToolCalls, ch.Delta.ToolCalls...) {
		if tc.ID != "" { // a call's first delta names it
			a.toolCalls++
		}
	}
}
