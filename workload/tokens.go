package workload

import (
	"slices"
	"sync"

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

// sharedContent keeps content that many sessions begin with (a system
// prompt, a repository), drawn once and copied after: every coding
// session, sub-agent and compaction starts with 20K shared tokens. It is
// safe for concurrent use (the load generator's agents share a model).
type sharedContent struct {
	mu    sync.Mutex
	byKey map[sharedKey][]uint32
}

type sharedKey struct {
	stream string
	key    uint64
	n      int
}

// append appends what content would; a nil c draws it.
func (c *sharedContent) append(dst []uint32, stream string, key uint64, n int) []uint32 {
	if c == nil {
		return content(dst, stream, key, n)
	}
	k := sharedKey{stream, key, n}
	c.mu.Lock()
	toks, ok := c.byKey[k]
	if !ok {
		if c.byKey == nil {
			c.byKey = map[sharedKey][]uint32{}
		}
		toks = content(nil, stream, key, n)
		c.byKey[k] = toks
	}
	c.mu.Unlock()
	return append(room(dst, n), toks...)
}
