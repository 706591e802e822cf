package workload

import (
	"bytes"
	"os"
	"testing"
)

// A trace is a file from outside (Mooncake's, a production log, a
// recording): whatever it holds, ReadTrace returns records that replay, or
// an error, never a panic; and a record it returns yields exactly its
// input_length prompt tokens, the same for equal leading hash ids.
func FuzzReadTrace(f *testing.F) {
	if head, err := os.ReadFile("testdata/mooncake_conversation_head.jsonl"); err == nil {
		f.Add(head[:min(len(head), 600)])
	}
	f.Add([]byte(`{"timestamp": 5, "input_length": 600, "output_length": 3, "hash_ids": [1, 2], "session": "s", "branch": "b"}` + "\n"))
	f.Add([]byte(`{"timestamp": 1e300, "input_length": 1, "output_length": 1, "hash_ids": [0]}`))
	f.Add([]byte(`{"timestamp": 0, "input_length": 2000000000, "output_length": 1, "hash_ids": [1]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		recs, err := ReadTrace(bytes.NewReader(data))
		if err != nil {
			return
		}
		for i := range recs {
			r := &recs[i]
			if i > 0 && r.Timestamp < recs[i-1].Timestamp {
				t.Fatalf("records out of order: %v after %v", r.Timestamp, recs[i-1].Timestamp)
			}
			if r.At(1) < 0 || r.At(1e-9) < 0 {
				t.Fatalf("record %d arrives before the start: %v", i, r.At(1))
			}
			if r.InputLength > 1<<16 {
				continue // a real prompt's size: too slow to fuzz, not a different path
			}
			if got := len(r.Tokens()); got != r.InputLength {
				t.Fatalf("record %d: %d tokens for input_length %d", i, got, r.InputLength)
			}
		}
	})
}
