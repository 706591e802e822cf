package vllm

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/evolvellm/evolve/kv"
	"github.com/vmihailenco/msgpack/v5"
)

func seqTokens(n int, base uint32) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = base + uint32(i)
	}
	return out
}

func mustPack(t *testing.T, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestDecodeBatchPositionalWithTrailingFields(t *testing.T) {
	toks := seqTokens(8, 100)
	payload := mustPack(t, []any{1.5, []any{
		[]any{"BlockStored", []any{uint64(1 << 63), int64(-5)}, nil, toks, 4, nil, "GPU", nil, nil, 0, "a field from the future"},
		[]any{"BlockRemoved", []any{uint64(1 << 63)}, "CPU", 0, 99},
		[]any{"AllBlocksCleared"},
		[]any{"SomethingNew", 1, 2},
	}, 3})
	b, unknown, err := DecodeBatch(payload)
	if err != nil {
		t.Fatal(err)
	}
	if unknown != 1 || len(b.Events) != 3 || b.Timestamp != 1.5 || b.DPRank != 3 {
		t.Fatalf("unknown %d, events %d, ts %v, rank %d", unknown, len(b.Events), b.Timestamp, b.DPRank)
	}
	st := b.Events[0]
	if st.Type != BlockStored || !slices.Equal(st.BlockHashes, []EngineHash{1 << 63, EngineHash(^uint64(4))}) ||
		st.HasParent || !slices.Equal(st.TokenIDs, toks) || st.BlockSize != 4 || st.Medium != "GPU" || st.HasLoRA || st.HasExtra {
		t.Fatalf("stored: %+v", st)
	}
	if rm := b.Events[1]; rm.Type != BlockRemoved || rm.Medium != "CPU" || len(rm.BlockHashes) != 1 {
		t.Fatalf("removed: %+v", rm)
	}
	if b.Events[2].Type != AllBlocksCleared {
		t.Fatalf("cleared: %+v", b.Events[2])
	}
}

func TestDecodeBatchMapsAndBytesHashes(t *testing.T) {
	payload := mustPack(t, map[string]any{"ts": 2.0, "data_parallel_rank": 1, "events": []any{
		map[string]any{"type": "BlockStored", "block_hashes": []any{[]byte("sha-256-ish")}, "parent_block_hash": []byte("p"),
			"token_ids": []any{1, 2}, "block_size": 2, "lora_name": "my-adapter", "medium": "GPU", "new_field": true},
		map[string]any{"type": "BlockRemoved", "block_hashes": []any{[]byte("sha-256-ish")}},
	}})
	b, _, err := DecodeBatch(payload)
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Events) != 2 || !b.Events[0].HasParent || !b.Events[0].HasLoRA || b.Events[1].Medium != "" {
		t.Fatalf("%+v", b.Events)
	}
	if b.Events[0].BlockHashes[0] != b.Events[1].BlockHashes[0] {
		t.Fatal("the same bytes hash must give the same key")
	}
}

func TestDecodeBatchRejectsGarbage(t *testing.T) {
	for name, payload := range map[string][]byte{
		"not msgpack":     {0xc1},
		"a number":        mustPack(t, 7),
		"events not list": mustPack(t, []any{1.0, "x"}),
		"bad token id":    mustPack(t, []any{1.0, []any{[]any{"BlockStored", []any{1}, nil, []any{"x"}, 1}}}),
		"bad hash":        mustPack(t, []any{1.0, []any{[]any{"BlockRemoved", []any{1.5}}}}),
		// msgpack v5.4 allocates what a header declares: these killed the
		// agent (out of memory, then a stack overflow) before checkShape.
		"4 G elements": {0xdd, 0xff, 0xff, 0xff, 0xff},
		"deep nesting": bytes.Repeat([]byte{0x91}, 1<<22),
		"truncated":    mustPack(t, []any{1.0, []any{[]any{"BlockRemoved", []any{1}}}})[:6],
	} {
		t.Run(name, func(t *testing.T) {
			if _, _, err := DecodeBatch(payload); err == nil {
				t.Errorf("%s: decoded", name)
			}
		})
	}
}

// stored builds a BlockStored event for blocks of toks.
func stored(hashes []EngineHash, parent *EngineHash, toks []uint32, bs int, medium string) Event {
	ev := Event{Type: BlockStored, BlockHashes: hashes, TokenIDs: toks, BlockSize: bs, Medium: medium}
	if parent != nil {
		ev.Parent, ev.HasParent = *parent, true
	}
	return ev
}

func TestTranslatorNamesBlocksByEvolvesChain(t *testing.T) {
	const bs = 4
	toks := seqTokens(5*bs, 7)
	want := kv.ChainHashes(toks, bs)
	tr := NewTranslator(bs)
	// Two events: the first three blocks, then two more under the third.
	out := tr.Apply(stored([]EngineHash{11, 12, 13}, nil, toks[:3*bs], bs, "GPU"), nil)
	p := EngineHash(13)
	out = tr.Apply(stored([]EngineHash{14, 15}, &p, toks[3*bs:], 0, ""), out) // no block size, no medium: defaults
	if len(out) != 5 {
		t.Fatalf("%d events", len(out))
	}
	for i, e := range out {
		if e.Seq != uint64(i+1) || e.Kind != kv.BlockStored || e.Tier != kv.TierGPU || e.Hash != want[i] || e.Depth != int32(i) {
			t.Fatalf("event %d: %+v (want hash %v)", i, e, want[i])
		}
		if i > 0 && e.Parent != want[i-1] {
			t.Fatalf("event %d parent %v", i, e.Parent)
		}
	}
	// Offloaded to CPU, then dropped from GPU: the host copy remains.
	out = tr.Apply(stored([]EngineHash{11}, nil, toks[:bs], bs, "CPU"), nil)
	out = tr.Apply(Event{Type: BlockRemoved, BlockHashes: []EngineHash{11, 99}, Medium: "GPU"}, out)
	if len(out) != 2 || out[0].Tier != kv.TierHost || out[1].Kind != kv.BlockRemoved || out[1].Tier != kv.TierGPU || out[1].Hash != want[0] {
		t.Fatalf("%+v", out)
	}
	if g, h := tr.Blocks(); g != 4 || h != 1 {
		t.Fatalf("blocks gpu %d host %d", g, h)
	}
	out = tr.Apply(Event{Type: BlockRemoved, BlockHashes: []EngineHash{11}, Medium: "CPU"}, nil)
	if len(out) != 1 || out[0].Tier != kv.TierHost {
		t.Fatalf("%+v", out)
	}
	// Block 11 is forgotten, yet its child 12 still names its chain.
	if g, h := tr.Blocks(); g != 4 || h != 0 {
		t.Fatalf("blocks gpu %d host %d", g, h)
	}
	if tr.LastSeq() != 8 {
		t.Fatalf("last seq %d", tr.LastSeq())
	}
}

func TestTranslatorLeavesOutWhatTheRouterCannotName(t *testing.T) {
	const bs = 2
	toks := seqTokens(4, 1)
	tr := NewTranslator(bs)
	unknownParent := EngineHash(404)
	lora := stored([]EngineHash{1, 2}, nil, toks, bs, "GPU")
	lora.HasLoRA = true
	extra := stored([]EngineHash{3, 4}, nil, toks, bs, "GPU")
	extra.HasExtra = true
	group := stored([]EngineHash{5, 6}, nil, toks, bs, "GPU")
	group.GroupIdx = 1
	var out []kv.Event
	for _, ev := range []Event{lora, extra, group, stored([]EngineHash{7, 8}, nil, toks, bs, "DISK"),
		stored([]EngineHash{9}, nil, toks, bs, "GPU") /* tokens for two blocks */} {
		out = tr.Apply(ev, out)
	}
	out = tr.Apply(stored([]EngineHash{10, 11}, &unknownParent, toks, bs, "GPU"), out)
	if len(out) != 0 || tr.Ignored != 9 || tr.Orphans != 2 {
		t.Fatalf("events %v, ignored %d, orphans %d", out, tr.Ignored, tr.Orphans)
	}
	// Removing what was never stored says nothing.
	if out := tr.Apply(Event{Type: BlockRemoved, BlockHashes: []EngineHash{1, 3, 10}}, nil); len(out) != 0 {
		t.Fatalf("%+v", out)
	}
}

func TestTranslatorClearAndSnapshot(t *testing.T) {
	const bs = 2
	toks := seqTokens(6, 50)
	want := kv.ChainHashes(toks, bs)
	tr := NewTranslator(bs)
	tr.Apply(stored([]EngineHash{1, 2, 3}, nil, toks, bs, "GPU"), nil)
	tr.Apply(stored([]EngineHash{1}, nil, toks[:bs], bs, "CPU"), nil)
	snap := tr.Snapshot(nil)
	if len(snap) != 5 || snap[0].Kind != kv.AllCleared {
		t.Fatalf("%+v", snap)
	}
	for i := 2; i < len(snap); i++ {
		if snap[i].Depth < snap[i-1].Depth {
			t.Fatalf("child before parent: %+v", snap)
		}
	}
	if snap[1].Hash != want[0] || snap[2].Hash != want[0] || snap[2].Tier != kv.TierHost || snap[4].Hash != want[2] {
		t.Fatalf("%+v", snap)
	}
	// A CPU tier cleared leaves the GPU copies.
	out := tr.Apply(Event{Type: AllBlocksCleared, Medium: "CPU"}, nil)
	if len(out) != 1 || out[0].Kind != kv.BlockRemoved || out[0].Tier != kv.TierHost {
		t.Fatalf("%+v", out)
	}
	out = tr.Apply(Event{Type: AllBlocksCleared}, nil)
	if len(out) != 1 || out[0].Kind != kv.AllCleared {
		t.Fatalf("%+v", out)
	}
	if g, h := tr.Blocks(); g+h != 0 {
		t.Fatal("cleared translator still holds blocks")
	}
}

// llm-d-inference-sim, in its default format, names a first block's
// parent 0 where vLLM writes null: the block, and every block chained
// after it, were dropped as orphans, and the node showed no cached block.
// A parent of 0 that no block has is none; an unknown parent other than 0
// is still an orphan, and says so.
func TestTranslatorReadsParentZeroAsNone(t *testing.T) {
	const bs = 4
	toks := seqTokens(3*bs, 9)
	want := kv.ChainHashes(toks, bs)
	tr := NewTranslator(bs)
	zero := EngineHash(0)
	out := tr.Apply(stored([]EngineHash{21, 22}, &zero, toks[:2*bs], bs, "GPU"), nil)
	p := EngineHash(22)
	out = tr.Apply(stored([]EngineHash{23}, &p, toks[2*bs:], bs, "GPU"), out)
	if len(out) != 3 || tr.Orphans != 0 {
		t.Fatalf("%d events, %d orphans", len(out), tr.Orphans)
	}
	for i, e := range out {
		if e.Hash != want[i] || e.Depth != int32(i) {
			t.Fatalf("event %d: %+v, want hash %v", i, e, want[i])
		}
	}
	lost := EngineHash(77)
	if out := tr.Apply(stored([]EngineHash{24}, &lost, toks[:bs], bs, "GPU"), nil); len(out) != 0 || tr.Orphans != 1 ||
		!strings.Contains(tr.LastLeftOut, "parent block 77 was never stored") {
		t.Fatalf("an unknown parent: %v, %d orphans, %q", out, tr.Orphans, tr.LastLeftOut)
	}
}
