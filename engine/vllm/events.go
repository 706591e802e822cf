package vllm

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/zeebo/xxh3"
)

// EngineHash is a block hash as vLLM reports it, made a 64-bit key: an
// integer hash as is, a bytes hash (newer builds) by its XXH3. vLLM's
// hashes cannot be reproduced outside Python; they only name blocks
// between a BlockStored and its BlockRemoved.
type EngineHash uint64

// EventType names a vLLM KV event.
type EventType string

// The KV events vLLM publishes.
const (
	BlockStored      EventType = "BlockStored"
	BlockRemoved     EventType = "BlockRemoved"
	AllBlocksCleared EventType = "AllBlocksCleared"
)

// Event is one KV event of vLLM's publisher, decoded from either of its
// encodings. Fields an event does not carry are zero.
type Event struct {
	Type        EventType
	BlockHashes []EngineHash
	Parent      EngineHash
	HasParent   bool
	TokenIDs    []uint32
	BlockSize   int
	HasLoRA     bool // lora_id or lora_name set: an adapter's blocks
	HasExtra    bool // extra_keys set (multimodal inputs, cache salt)
	Medium      string
	GroupIdx    int // KV-cache group (hybrid models); 0 when absent
}

// Batch is one published message: the events of one or more engine steps.
type Batch struct {
	Timestamp float64
	Events    []Event
	DPRank    int
}

// eventFields are the field names of each event type, in the order of the
// positional (array) encoding after the tag.
var eventFields = map[EventType][]string{
	BlockStored:      {"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name", "extra_keys", "group_idx"},
	BlockRemoved:     {"block_hashes", "medium", "group_idx"},
	AllBlocksCleared: {"medium"},
}

// DecodeBatch decodes the msgpack payload of one message:
// [timestamp, [event, ...], data_parallel_rank], or the same as a map.
// Events come as positional arrays tagged by their first element or as
// maps tagged by "type"; trailing fields a newer vLLM adds are ignored,
// and so are events of unknown types (they are counted in unknown).
func DecodeBatch(payload []byte) (b Batch, unknown int, err error) {
	if err := checkShape(payload); err != nil {
		return b, 0, fmt.Errorf("decode KV event batch: %w", err)
	}
	dec := msgpack.NewDecoder(bytes.NewReader(payload))
	dec.UseLooseInterfaceDecoding(true)
	var v any
	if err := dec.Decode(&v); err != nil {
		return b, 0, fmt.Errorf("decode KV event batch: %w", err)
	}
	var rawEvents any
	switch x := v.(type) {
	case []any:
		if len(x) < 2 {
			return b, 0, fmt.Errorf("KV event batch has %d fields, want at least 2", len(x))
		}
		b.Timestamp, _ = toFloat(x[0])
		rawEvents = x[1]
		if len(x) > 2 {
			r, _ := toInt(x[2])
			b.DPRank = int(r)
		}
	case map[string]any:
		b.Timestamp, _ = toFloat(x["ts"])
		rawEvents = x["events"]
		r, _ := toInt(x["data_parallel_rank"])
		b.DPRank = int(r)
	default:
		return b, 0, fmt.Errorf("KV event batch is a %T, want an array or a map", v)
	}
	list, ok := rawEvents.([]any)
	if !ok && rawEvents != nil {
		return b, 0, fmt.Errorf("KV event batch's events are a %T, want an array", rawEvents)
	}
	for i, re := range list {
		ev, known, err := decodeEvent(re)
		if err != nil {
			return b, unknown, fmt.Errorf("event %d: %w", i, err)
		}
		if !known {
			unknown++
			continue
		}
		b.Events = append(b.Events, ev)
	}
	return b, unknown, nil
}

// decodeEvent reads one event in either encoding into named fields.
func decodeEvent(v any) (Event, bool, error) {
	var ev Event
	fields := map[string]any{}
	switch x := v.(type) {
	case []any:
		if len(x) == 0 {
			return ev, false, fmt.Errorf("empty event")
		}
		tag, _ := x[0].(string)
		ev.Type = EventType(tag)
		names, ok := eventFields[ev.Type]
		if !ok {
			return ev, false, nil
		}
		for i, name := range names {
			if i+1 < len(x) {
				fields[name] = x[i+1]
			}
		}
	case map[string]any:
		tag, _ := x["type"].(string)
		ev.Type = EventType(tag)
		if _, ok := eventFields[ev.Type]; !ok {
			return ev, false, nil
		}
		fields = x
	default:
		return ev, false, fmt.Errorf("event is a %T, want an array or a map", v)
	}
	var err error
	if ev.BlockHashes, err = hashes(fields["block_hashes"]); err != nil {
		return ev, true, fmt.Errorf("%s block_hashes: %w", ev.Type, err)
	}
	if p := fields["parent_block_hash"]; p != nil {
		if ev.Parent, err = hashOf(p); err != nil {
			return ev, true, fmt.Errorf("%s parent_block_hash: %w", ev.Type, err)
		}
		ev.HasParent = true
	}
	if t := fields["token_ids"]; t != nil {
		list, ok := t.([]any)
		if !ok {
			return ev, true, fmt.Errorf("%s token_ids is a %T", ev.Type, t)
		}
		ev.TokenIDs = make([]uint32, len(list))
		for i, x := range list {
			n, ok := toInt(x)
			if !ok || n < 0 || n > math.MaxUint32 {
				return ev, true, fmt.Errorf("%s token_ids[%d] = %v", ev.Type, i, x)
			}
			ev.TokenIDs[i] = uint32(n)
		}
	}
	if n, ok := toInt(fields["block_size"]); ok {
		ev.BlockSize = int(n)
	}
	ev.HasLoRA = fields["lora_id"] != nil || fields["lora_name"] != nil
	if x := fields["extra_keys"]; x != nil {
		if list, ok := x.([]any); !ok || anyNonNil(list) {
			ev.HasExtra = true
		}
	}
	ev.Medium, _ = fields["medium"].(string)
	if n, ok := toInt(fields["group_idx"]); ok {
		ev.GroupIdx = int(n)
	}
	return ev, true, nil
}

func anyNonNil(list []any) bool {
	for _, x := range list {
		if x != nil {
			return true
		}
	}
	return false
}

func hashes(v any) ([]EngineHash, error) {
	if v == nil {
		return nil, nil
	}
	list, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("a %T, want an array", v)
	}
	out := make([]EngineHash, len(list))
	for i, x := range list {
		h, err := hashOf(x)
		if err != nil {
			return nil, fmt.Errorf("[%d]: %w", i, err)
		}
		out[i] = h
	}
	return out, nil
}

// hashOf makes a vLLM block hash a key: integers as they are (negative
// ones by their two's complement), bytes and strings by XXH3.
func hashOf(v any) (EngineHash, error) {
	switch x := v.(type) {
	case int64:
		return EngineHash(uint64(x)), nil
	case uint64:
		return EngineHash(x), nil
	case []byte:
		return EngineHash(xxh3.Hash(x)), nil
	case string:
		return EngineHash(xxh3.HashString(x)), nil
	}
	return 0, fmt.Errorf("a %T is not a block hash", v)
}

func toInt(v any) (int64, bool) {
	switch x := v.(type) {
	case int64:
		return x, true
	case uint64:
		if x > math.MaxInt64 {
			return 0, false
		}
		return int64(x), true
	case float64:
		return int64(x), x == math.Trunc(x)
	}
	return 0, false
}

func toFloat(v any) (float64, bool) {
	switch x := v.(type) {
	case float64:
		return x, true
	case float32:
		return float64(x), true
	case int64:
		return float64(x), true
	case uint64:
		return float64(x), true
	}
	return 0, false
}

// seqOf reads the 8-byte big-endian sequence frame of a message; -1 is
// the replay's end marker.
func seqOf(b []byte) (int64, error) {
	if len(b) != 8 {
		return 0, fmt.Errorf("sequence frame has %d bytes, want 8", len(b))
	}
	return int64(binary.BigEndian.Uint64(b)), nil
}
