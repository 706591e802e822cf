package orchestrator

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/evolvellm/evolve/protocol"
)

func statsPayload(n int) []byte {
	b := protocol.StatsBatch{Engine: "engine-3"}
	for i := range n {
		b.Passes = append(b.Passes, protocol.PassRecord{Start: time.Now(), DurationSec: 0.0123, PrefillTokens: 8192 + i, PrefillAttended: 1.25e8,
			DecodeSeqs: 200, DecodeContext: 3_000_000, HostLoadBlocks: 7, OffloadBlocks: 9, Waiting: 3, Running: 200, GPUKVUsage: 0.5})
	}
	out, _ := json.Marshal(b)
	return out
}

// The orchestrator decodes only the fields of the engines' pass records
// that the planner uses; they must be the protocol's, by name.
func TestStatsBatchReadsTheProtocolsFields(t *testing.T) {
	var b statsBatch
	if err := json.Unmarshal(statsPayload(2), &b); err != nil {
		t.Fatal(err)
	}
	if b.Engine != "engine-3" || len(b.Passes) != 2 {
		t.Fatalf("%+v", b)
	}
	p := b.Passes[1]
	if p.DurationSec != 0.0123 || p.PrefillTokens != 8193 || p.PrefillAttended != 1.25e8 || p.DecodeSeqs != 200 ||
		p.DecodeContext != 3_000_000 || p.HostLoadBlocks != 7 || p.OffloadBlocks != 9 {
		t.Fatalf("a field was not read: %+v", p)
	}
}

// Decoding a batch of 50 pass records: the whole protocol record against
// the fields the planner uses.
func BenchmarkStatsDecode(b *testing.B) {
	data := statsPayload(50)
	b.Run("protocol.StatsBatch", func(b *testing.B) {
		for b.Loop() {
			var v protocol.StatsBatch
			json.Unmarshal(data, &v)
		}
	})
	b.Run("statsBatch", func(b *testing.B) {
		for b.Loop() {
			var v statsBatch
			json.Unmarshal(data, &v)
		}
	})
}
