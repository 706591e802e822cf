package kv

import (
	"fmt"
	"testing"
)

func seqTokens(n int, start uint32) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = start + uint32(i)
	}
	return t
}

func TestChainHashesFullBlocksOnly(t *testing.T) {
	for i, tc := range []struct {
		tokens, bs, want int
	}{
		{0, 16, 0}, {15, 16, 0}, {16, 16, 1}, {31, 16, 1}, {32, 16, 2}, {1000, 16, 62}, {1000, 512, 1},
	} {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			if got := len(ChainHashes(seqTokens(tc.tokens, 1), tc.bs)); got != tc.want {
				t.Errorf("%d tokens, block %d: %d hashes, want %d", tc.tokens, tc.bs, got, tc.want)
			}
		})
	}
}

func TestChainHashesCoverPrefix(t *testing.T) {
	a := seqTokens(64, 100)
	b := append([]uint32(nil), a...)
	b[20] = 9999 // differs in block 1
	ha, hb := ChainHashes(a, 16), ChainHashes(b, 16)
	if ha[0] != hb[0] {
		t.Fatal("identical first blocks hash differently")
	}
	for i := 1; i < 4; i++ {
		if ha[i] == hb[i] {
			t.Fatalf("block %d hashes equal although an earlier block differs", i)
		}
	}
	// The same block content at a different position (other prefix) differs.
	c := append(seqTokens(16, 7), a[:16]...)
	if hc := ChainHashes(c, 16); hc[1] == ha[0] {
		t.Fatal("block hash does not depend on its prefix")
	}
}

func TestChainHashesDeterministicGolden(t *testing.T) {
	// Golden values: block hashes are recorded in traces and exchanged between
	// processes; a change here breaks compatibility and must be deliberate.
	h := ChainHashes(seqTokens(32, 0), 16)
	h2 := ChainHashes(seqTokens(32, 0), 16)
	if h[0] != h2[0] || h[1] != h2[1] {
		t.Fatal("hashing is not deterministic")
	}
	if h[0] == 0 || h[0] == h[1] {
		t.Fatalf("degenerate hashes %x %x", h[0], h[1])
	}
	const want0, want1 = BlockHash(0x32279b756028177f), BlockHash(0x7fc96a77ea40e089)
	if h[0] != want0 || h[1] != want1 {
		t.Fatalf("hashes changed: got %#x %#x, want %#x %#x", uint64(h[0]), uint64(h[1]), uint64(want0), uint64(want1))
	}
}

func TestExtendChainMatchesChainHashes(t *testing.T) {
	tokens := seqTokens(16*10+5, 3)
	chain := ChainHashes(tokens[:40], 16)
	chain = ExtendChain(chain, tokens, 16)
	want := ChainHashes(tokens, 16)
	if len(chain) != len(want) {
		t.Fatalf("len %d, want %d", len(chain), len(want))
	}
	for i := range want {
		if chain[i] != want[i] {
			t.Fatalf("block %d differs", i)
		}
	}
}

func TestLargeBlockSizeHashes(t *testing.T) {
	tokens := seqTokens(1024, 5)
	h := ChainHashes(tokens, 512)
	if len(h) != 2 || h[0] == h[1] {
		t.Fatalf("unexpected hashes %v", h)
	}
}

func BenchmarkChainHashes32K(b *testing.B) {
	tokens := seqTokens(32768, 1)
	buf := make([]BlockHash, 0, 2048)
	for _, bs := range []int{DefaultBlockSize, 64, 256, 512} {
		b.Run(fmt.Sprintf("block%d", bs), func(b *testing.B) {
			b.SetBytes(int64(len(tokens) * 4))
			b.ReportAllocs()
			for b.Loop() {
				buf = AppendChainHashes(buf[:0], tokens, bs)
			}
		})
	}
}
