package kv

import (
	"encoding/binary"

	"github.com/zeebo/xxh3"
)

// BlockHash identifies a full block of tokens together with everything before
// it: two blocks have the same hash only if their whole prefixes are equal.
type BlockHash uint64

// DefaultBlockSize is the number of tokens in a KV block unless configured
// otherwise. It matches vLLM's default.
const DefaultBlockSize = 16

// HashSeed is the fixed XXH3 seed of every block hash in evolve ("evolve" in
// ASCII). Changing it invalidates every hash recorded in traces and events.
const HashSeed uint64 = 0x65766f6c7665

// maxStackBlock is the largest block size hashed without a heap allocation.
const maxStackBlock = 256

// NextHash returns the hash of the block holding tokens, given the hash of the
// block before it. For the first block of a sequence pass hasParent false.
//
// The hash is XXH3-64 with seed HashSeed over the parent hash (8 bytes,
// little endian, absent for the first block) followed by each token id
// (4 bytes, little endian). The chaining makes each hash cover its prefix.
func NextHash(parent BlockHash, hasParent bool, tokens []uint32) BlockHash {
	var stack [8 + 4*maxStackBlock]byte
	h, _ := nextHash(stack[:0], parent, hasParent, tokens)
	return h
}

// nextHash is NextHash writing the hashed bytes into buf, grown if it is
// too small; it returns the buffer for the next block, so that a chain is
// hashed without a buffer per block.
func nextHash(buf []byte, parent BlockHash, hasParent bool, tokens []uint32) (BlockHash, []byte) {
	buf = buf[:0]
	if hasParent {
		buf = binary.LittleEndian.AppendUint64(buf, uint64(parent))
	}
	for _, t := range tokens {
		buf = binary.LittleEndian.AppendUint32(buf, t)
	}
	return BlockHash(xxh3.HashSeed(buf, HashSeed)), buf
}

// ChainHashes cuts tokens into blocks of blockSize and returns the chained hash
// of every full block, in order. A trailing partial block is not hashed: it
// cannot be shared until it is full. blockSize must be positive.
func ChainHashes(tokens []uint32, blockSize int) []BlockHash {
	return AppendChainHashes(nil, tokens, blockSize)
}

// AppendChainHashes is ChainHashes appending to dst, for callers that reuse a
// buffer.
func AppendChainHashes(dst []BlockHash, tokens []uint32, blockSize int) []BlockHash {
	if blockSize <= 0 {
		panic("kv: block size must be positive")
	}
	n := len(tokens) / blockSize
	var stack [8 + 4*maxStackBlock]byte
	buf := stack[:0]
	var parent BlockHash
	for i := 0; i < n; i++ {
		var h BlockHash
		h, buf = nextHash(buf, parent, i > 0, tokens[i*blockSize:(i+1)*blockSize])
		dst = append(dst, h)
		parent = h
	}
	return dst
}

// ExtendChain appends to chain the hashes of the full blocks of tokens that
// chain does not cover yet. chain must be ChainHashes of a prefix of tokens
// (len(chain) full blocks); the work done is proportional to the new blocks.
func ExtendChain(chain []BlockHash, tokens []uint32, blockSize int) []BlockHash {
	n := len(tokens) / blockSize
	var stack [8 + 4*maxStackBlock]byte
	buf := stack[:0]
	for i := len(chain); i < n; i++ {
		var parent, h BlockHash
		if i > 0 {
			parent = chain[i-1]
		}
		h, buf = nextHash(buf, parent, i > 0, tokens[i*blockSize:(i+1)*blockSize])
		chain = append(chain, h)
	}
	return chain
}
