package workload

import (
	"bytes"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestReadMooncakeTrace(t *testing.T) {
	f, err := os.Open("testdata/mooncake_conversation_head.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	recs, err := ReadTrace(f)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 300 {
		t.Fatalf("%d records", len(recs))
	}
	a, b := recs[0], recs[1] // both start with hash id 0, then differ
	ta, tb := a.Tokens(), b.Tokens()
	if len(ta) != a.InputLength || len(tb) != b.InputLength {
		t.Fatal("token count differs from input_length")
	}
	if a.HashIDs[0] != b.HashIDs[0] || a.HashIDs[1] == b.HashIDs[1] {
		t.Fatalf("sample changed: %v %v", a.HashIDs[:2], b.HashIDs[:2])
	}
	if !slices.Equal(ta[:512], tb[:512]) || slices.Equal(ta[512:1024], tb[512:1024]) {
		t.Fatal("equal hash ids must give equal blocks, different ones different blocks")
	}
	for i := 1; i < len(recs); i++ {
		if recs[i].Timestamp < recs[i-1].Timestamp {
			t.Fatal("records not in time order")
		}
	}
}

func TestReadTraceRejectsBadLines(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1]}`, "line 1: 1 hash_ids for 600"},
		{"\n{\"timestamp\": 0, \"input_length\": 0, \"output_length\": 5, \"hash_ids\": []}", "line 2: input_length 0"},
		{`{"timestamp": -3, "input_length": 10, "output_length": 5, "hash_ids": [1]}`, "negative"},
		{`{"timestamp": 0, "input_length": 10`, "line 1:"},
		// A timestamp past time.Duration's range arrived at a negative
		// time, and evolve sim panicked on it.
		{`{"timestamp": 1e300, "input_length": 10, "output_length": 5, "hash_ids": [1]}`, "line 1: timestamp 1e+300 ms is past"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			_, err := ReadTrace(strings.NewReader(tc.in))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%q: error %v, want %q", tc.in, err, tc.want)
			}
		})
	}
	// Slowed past time.Duration's range, a record arrives at its end.
	rec := TraceRecord{Timestamp: MaxTraceTimestamp}
	if at := rec.At(1e-9); at != math.MaxInt64 {
		t.Errorf("at %v, want the end of time.Duration", at)
	}
	if at := rec.At(2); at != MaxTraceTimestamp/2*time.Millisecond {
		t.Errorf("at %v, want %v", at, MaxTraceTimestamp/2*time.Millisecond)
	}
}

// A recorded workload keeps its prefix structure: equal leading ids exactly
// where the prompts share whole 512-token blocks.
func TestRecordedTraceKeepsPrefixes(t *testing.T) {
	m := NewCoding(4)
	r := rand.New(rand.NewPCG(21, 22))
	var buf bytes.Buffer
	tw := NewTraceWriter(&buf)
	var calls []Call
	for seq := 0; seq < 3; seq++ {
		s := m.NewSession(r, seq, seq, 0)
		l := s.Lanes[0]
		for i := 0; i < 6; i++ {
			c, ok := l.Next()
			if !ok {
				break
			}
			c.Tokens = slices.Clone(c.Tokens)
			calls = append(calls, c)
			if err := tw.Write(float64(len(calls))*100, c); err != nil {
				t.Fatal(err)
			}
			l.Answer(fakeAnswer(c))
		}
	}
	tw.Flush()
	recs, err := ReadTrace(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != len(calls) {
		t.Fatalf("%d records for %d calls", len(recs), len(calls))
	}
	for i := range recs {
		for j := range recs {
			common := 0
			for common < len(calls[i].Tokens) && common < len(calls[j].Tokens) && calls[i].Tokens[common] == calls[j].Tokens[common] {
				common++
			}
			ids := 0
			for ids < len(recs[i].HashIDs) && ids < len(recs[j].HashIDs) && recs[i].HashIDs[ids] == recs[j].HashIDs[ids] {
				ids++
			}
			full := common / TraceBlockSize
			if i == j {
				full = len(recs[i].HashIDs)
			}
			if ids != full {
				t.Fatalf("calls %d and %d share %d tokens (%d full blocks) but %d leading ids", i, j, common, full, ids)
			}
		}
	}
	if recs[1].Session != calls[1].Session || recs[1].Branch != calls[1].Branch || recs[1].Parent != calls[1].Parent || recs[1].OutputLength != calls[1].MaxTokens {
		t.Fatalf("record fields: %+v", recs[1])
	}
}
