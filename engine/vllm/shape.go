package vllm

import (
	"encoding/binary"
	"fmt"
)

// maxNesting bounds how deep a KV event payload nests arrays and maps;
// vLLM's go three deep (batch, events, an event's hashes or tokens).
const maxNesting = 32

// checkShape walks the first MessagePack value of payload without
// decoding it and refuses one that would make a decoder allocate far more
// than the payload holds. msgpack v5.4 sizes a []any from the length an
// array's header declares (vmihailenco/msgpack#401): five bytes claiming
// 4 G elements would kill the agent with a fatal out-of-memory error, and
// deep nesting would exhaust its stack. Every element takes at least one
// byte, so a length larger than the bytes left is a lie; with that and a
// nesting bound, decoding allocates in proportion to the payload.
func checkShape(payload []byte) error {
	pos := 0
	pending := make([]uint64, 1, 8) // values still to read, per open container
	pending[0] = 1
	need := func(n uint64) error {
		if n > uint64(len(payload)-pos) {
			return fmt.Errorf("malformed MessagePack: %d bytes wanted at offset %d, %d left", n, pos, len(payload)-pos)
		}
		return nil
	}
	// size reads a big-endian length of w bytes after the type byte.
	size := func(w int) (uint64, error) {
		if err := need(uint64(w)); err != nil {
			return 0, err
		}
		var n uint64
		switch w {
		case 1:
			n = uint64(payload[pos])
		case 2:
			n = uint64(binary.BigEndian.Uint16(payload[pos:]))
		case 4:
			n = uint64(binary.BigEndian.Uint32(payload[pos:]))
		}
		pos += w
		return n, nil
	}
	for len(pending) > 0 {
		top := len(pending) - 1
		if pending[top] == 0 {
			pending = pending[:top]
			continue
		}
		pending[top]--
		if err := need(1); err != nil {
			return err
		}
		c := payload[pos]
		pos++
		var skip, items uint64 // bytes of data to skip, or elements to read
		container := false
		var err error
		switch {
		case c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3: // fixints, nil, booleans
		case c <= 0x8f: // fixmap
			items, container = 2*uint64(c&0x0f), true
		case c <= 0x9f: // fixarray
			items, container = uint64(c&0x0f), true
		case c <= 0xbf: // fixstr
			skip = uint64(c & 0x1f)
		case c == 0xc4 || c == 0xd9: // bin8, str8
			skip, err = size(1)
		case c == 0xc5 || c == 0xda: // bin16, str16
			skip, err = size(2)
		case c == 0xc6 || c == 0xdb: // bin32, str32
			skip, err = size(4)
		case c == 0xc7, c == 0xc8, c == 0xc9: // ext8, ext16, ext32: length, type, data
			skip, err = size(1 << (c - 0xc7))
			skip++
		case c == 0xca, c == 0xce, c == 0xd2: // float32, uint32, int32
			skip = 4
		case c == 0xcb, c == 0xcf, c == 0xd3: // float64, uint64, int64
			skip = 8
		case c == 0xcc, c == 0xd0: // uint8, int8
			skip = 1
		case c == 0xcd, c == 0xd1: // uint16, int16
			skip = 2
		case c >= 0xd4 && c <= 0xd8: // fixext 1..16: type, data
			skip = 1 + 1<<(c-0xd4)
		case c == 0xdc: // array16
			items, err = size(2)
			container = true
		case c == 0xdd: // array32
			items, err = size(4)
			container = true
		case c == 0xde: // map16
			items, err = size(2)
			items, container = 2*items, true
		case c == 0xdf: // map32
			items, err = size(4)
			items, container = 2*items, true
		default: // 0xc1, never used
			return fmt.Errorf("malformed MessagePack: type byte 0x%02x at offset %d", c, pos-1)
		}
		if err != nil {
			return err
		}
		if !container {
			if err := need(skip); err != nil {
				return err
			}
			pos += int(skip)
			continue
		}
		if items > uint64(len(payload)-pos) {
			return fmt.Errorf("malformed MessagePack: a container at offset %d declares %d elements in %d bytes", pos-1, items, len(payload)-pos)
		}
		if len(pending) > maxNesting {
			return fmt.Errorf("malformed MessagePack: nested more than %d deep", maxNesting)
		}
		pending = append(pending, items)
	}
	return nil
}
