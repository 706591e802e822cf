package orchestrator

import (
	"bufio"
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

// flushRecorder keeps what was written and, at each flush, what the client
// had received by then.
type flushRecorder struct {
	buf     strings.Builder
	flushed []string
}

func (f *flushRecorder) Write(b []byte) (int, error) { return f.buf.Write(b) }
func (f *flushRecorder) flush()                      { f.flushed = append(f.flushed, f.buf.String()) }

func TestRelaySSEFlushesEachEventUnlessTheNextIsHere(t *testing.T) {
	const ev1, ev2, ev3 = "data: {\"a\":1}\n\n", "data: {\"a\":2}\n\n", "data: [DONE]\n\n"

	// Behind: three whole events already buffered go out in one flush.
	var rec flushRecorder
	var lines int
	werr, rerr := relaySSE(bufio.NewReader(strings.NewReader(ev1+ev2+ev3)), &rec, rec.flush, func(l []byte) []byte { lines++; return l })
	if werr != nil || !errors.Is(rerr, io.EOF) || rec.buf.String() != ev1+ev2+ev3 || lines != 6 {
		t.Fatalf("relayed %q (%d lines seen), errors %v %v", rec.buf.String(), lines, werr, rerr)
	}
	if len(rec.flushed) != 1 || rec.flushed[0] != ev1+ev2+ev3 {
		t.Fatalf("flushes %q, want one of the three events", rec.flushed)
	}

	// A stall mid-event: the event before it is flushed before the stall,
	// not held back until the rest arrives.
	pr, pw := io.Pipe()
	rec = flushRecorder{}
	got := make(chan error, 1)
	go func() {
		_, rerr := relaySSE(bufio.NewReader(pr), &rec, rec.flush, func(l []byte) []byte { return l })
		got <- rerr
	}()
	pw.Write([]byte(ev1 + "data: {\"a\""))
	time.Sleep(50 * time.Millisecond) // the rest of the second event is late
	pw.Write([]byte(":2}\n\n" + ev3))
	pw.Close()
	if err := <-got; !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	if len(rec.flushed) < 2 || rec.flushed[0] != ev1 {
		t.Fatalf("flushes %q: the first event waited for the second", rec.flushed)
	}

	// An engine that fails before a byte: nothing is flushed, so that
	// the front door can still retry elsewhere.
	rec = flushRecorder{}
	pr, pw = io.Pipe()
	pw.CloseWithError(errors.New("engine died"))
	if _, rerr := relaySSE(bufio.NewReader(pr), &rec, rec.flush, func(l []byte) []byte { return l }); rerr == nil || len(rec.flushed) != 0 {
		t.Fatalf("error %v, flushes %q", rerr, rec.flushed)
	}
}
