package workload

import (
	"slices"

	"github.com/zeebo/xxh3"
)

// Content tokens: prompts are made of deterministic pseudo-random token ids
// from the tokenizer's hashed range, so that equal content is equal tokens
// (shared system prompts, repository context) and distinct content is
// distinct. Ids avoid the special, byte and output-word ranges.
const (
	contentLo = 1 << 13
	contentHi = 1 << 17
)

// content appends n tokens of the content named by (stream, key).
func content(dst []uint32, stream string, key uint64, n int) []uint32 {
	dst = room(dst, n)
	x := xxh3.HashStringSeed(stream, key) | 1
	out := dst[len(dst) : len(dst)+n]
	for i := range out {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		out[i] = contentLo + uint32(x%(contentHi-contentLo))
	}
	return dst[:len(dst)+n]
}

// room returns dst with room for n more tokens. A growing context at least
// doubles its array when it moves (append grows large slices by a quarter),
// so an agent's context moves a few times rather than a dozen on its way
// to 160K tokens: each move copies the whole context, and the simulator
// then compares the new prompt with the last token by token instead of
// finding it in the same array.
func room(dst []uint32, n int) []uint32 {
	if cap(dst)-len(dst) >= n {
		return dst
	}
	return slices.Grow(dst, max(n, len(dst)))
}
