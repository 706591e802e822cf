package vllm

import (
	"bytes"
	"testing"

	"github.com/evolvellm/evolve/kv"
	"github.com/vmihailenco/msgpack/v5"
)

// FuzzDecodeAndTranslate feeds arbitrary payloads, as a vLLM of another
// version or a stray publisher on the port could send, through the
// decoder and the translator: they may refuse a payload, never panic, and
// the translator's counts stay consistent with the events it emitted.
func FuzzDecodeAndTranslate(f *testing.F) {
	seed := func(v any) {
		b, err := msgpack.Marshal(v)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	toks := []uint32{1, 2, 3, 4, 5, 6, 7, 8}
	seed([]any{1.5, []any{
		[]any{"BlockStored", []any{uint64(1 << 63), int64(-5)}, nil, toks, 4, nil, "GPU"},
		[]any{"BlockStored", []any{uint64(7)}, uint64(1 << 63), toks[:4], 4, nil, "CPU"},
		[]any{"BlockRemoved", []any{uint64(1 << 63)}, "CPU"},
		[]any{"AllBlocksCleared"},
	}, 0})
	seed(map[string]any{"ts": 2.0, "events": []any{
		map[string]any{"type": "BlockStored", "block_hashes": []any{[]byte("h")}, "parent_block_hash": []byte("p"),
			"token_ids": []any{1, 2}, "block_size": 2, "medium": "GPU"},
		map[string]any{"type": "BlockRemoved", "block_hashes": []any{[]byte("h")}},
	}})
	f.Add([]byte{0xdd, 0xff, 0xff, 0xff, 0xff})             // an array that claims 4 G elements
	f.Add([]byte{0x92, 0xc0, 0xdf, 0x7f, 0xff, 0xff, 0xff}) // a map inside that claims 2 G pairs
	f.Add(bytes.Repeat([]byte{0x91}, 1<<20))                // a million arrays, each inside the last
	f.Fuzz(func(t *testing.T, payload []byte) {
		b, _, err := DecodeBatch(payload)
		if err != nil {
			return
		}
		tr := NewTranslator(4)
		var out []kv.Event
		held, seq := 0, uint64(0) // copies the emitted events say the engine holds
		for _, ev := range b.Events {
			out = tr.Apply(ev, out[:0])
			for _, e := range out {
				if seq++; e.Seq != seq {
					t.Fatalf("event numbered %d after %d", e.Seq, seq-1)
				}
				switch e.Kind {
				case kv.AllCleared:
					held = 0
				case kv.BlockStored:
					held++
				case kv.BlockRemoved:
					held--
				}
			}
			if gpu, host := tr.Blocks(); gpu < 0 || host < 0 || gpu+host != held {
				t.Fatalf("translator counts %d GPU + %d host copies, its events %d", gpu, host, held)
			}
		}
		out = tr.Snapshot(out[:0])
		if len(out) != 1+held || out[0].Kind != kv.AllCleared {
			t.Fatalf("snapshot of %d events for %d copies", len(out), held)
		}
	})
}
