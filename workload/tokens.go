package workload

import (
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
	x := xxh3.HashStringSeed(stream, key) | 1
	for i := 0; i < n; i++ {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		dst = append(dst, contentLo+uint32(x%(contentHi-contentLo)))
	}
	return dst
}
