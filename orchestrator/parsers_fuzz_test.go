package orchestrator

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
)

// FuzzRelaySSE relays arbitrary engine streams: the client gets exactly
// the stream's whole lines, in order (never a line cut short, which it
// would join to the next), and a line past maxSSELine ends the relay
// rather than filling the router's memory.
func FuzzRelaySSE(f *testing.F) {
	f.Add([]byte("data: {\"a\":1}\n\ndata: [DONE]\n\n"), 64)
	f.Add([]byte("data: cut sh"), 16)
	f.Add([]byte(": comment\r\ndata: x\r\n\r\n"), 8)
	f.Fuzz(func(t *testing.T, stream []byte, bufSize int) {
		var rec flushRecorder
		rd := bufio.NewReaderSize(bytes.NewReader(stream), 16+bufSize%4096)
		werr, rerr := relaySSE(rd, &rec, rec.flush, func(l []byte) []byte { return l })
		if werr != nil || rerr == nil {
			t.Fatalf("errors %v, %v", werr, rerr)
		}
		want := stream
		if i := bytes.LastIndexByte(stream, '\n'); i >= 0 {
			want = stream[:i+1]
		} else {
			want = nil
		}
		if errors.Is(rerr, io.EOF) && rec.buf.String() != string(want) {
			t.Fatalf("relayed %q of %q", rec.buf.String(), stream)
		}
	})
}

func TestRelaySSERefusesAnEndlessLine(t *testing.T) {
	var rec flushRecorder
	endless := io.MultiReader(strings.NewReader("data: {\"a\":1}\n\ndata: "), &zeros{left: 2 * maxSSELine})
	_, rerr := relaySSE(bufio.NewReader(endless), &rec, rec.flush, func(l []byte) []byte { return l })
	if !errors.Is(rerr, errLineTooLong) || rec.buf.String() != "data: {\"a\":1}\n\n" {
		t.Fatalf("an endless line: %v after %q", rerr, rec.buf.String())
	}
}

type zeros struct{ left int }

func (z *zeros) Read(p []byte) (int, error) {
	if z.left == 0 {
		return 0, io.EOF
	}
	n := min(len(p), z.left)
	for i := range p[:n] {
		p[i] = 'x'
	}
	z.left -= n
	return n, nil
}
