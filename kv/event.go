package kv

import "fmt"

// Tier is where a copy of a block lives on a node.
type Tier uint8

// The tiers of a node's KV cache.
const (
	TierGPU  Tier = iota // device memory (HBM): usable by the next forward pass
	TierHost             // host memory: must be loaded to GPU before use
)

// String returns "gpu" or "host".
func (t Tier) String() string {
	switch t {
	case TierGPU:
		return "gpu"
	case TierHost:
		return "host"
	}
	return fmt.Sprintf("tier(%d)", uint8(t))
}

// ParseTier reads "gpu" or "host".
func ParseTier(s string) (Tier, error) {
	switch s {
	case "gpu", "GPU":
		return TierGPU, nil
	case "host", "cpu", "CPU":
		return TierHost, nil
	}
	return 0, fmt.Errorf("unknown KV tier %q (want gpu or host)", s)
}

// MarshalText writes the tier's name.
func (t Tier) MarshalText() ([]byte, error) { return []byte(t.String()), nil }

// UnmarshalText reads a tier's name.
func (t *Tier) UnmarshalText(b []byte) error {
	v, err := ParseTier(string(b))
	if err != nil {
		return err
	}
	*t = v
	return nil
}

// EventKind says what happened to a block copy.
type EventKind uint8

// Kinds of KV events.
const (
	BlockStored  EventKind = iota + 1 // a copy now exists in Tier
	BlockRemoved                      // the copy in Tier is gone
	AllCleared                        // every copy on the node is gone (all tiers)
)

// String returns the vLLM-style name of the kind.
func (k EventKind) String() string {
	switch k {
	case BlockStored:
		return "BlockStored"
	case BlockRemoved:
		return "BlockRemoved"
	case AllCleared:
		return "AllBlocksCleared"
	}
	return fmt.Sprintf("EventKind(%d)", uint8(k))
}

// MarshalText writes the kind's name.
func (k EventKind) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// UnmarshalText reads a kind's name.
func (k *EventKind) UnmarshalText(b []byte) error {
	switch string(b) {
	case "BlockStored":
		*k = BlockStored
	case "BlockRemoved":
		*k = BlockRemoved
	case "AllBlocksCleared":
		*k = AllCleared
	default:
		return fmt.Errorf("unknown KV event kind %q", b)
	}
	return nil
}

// Event is one change to the KV blocks of one node. Engines number their
// events from 1 without gaps (Seq), so that a consumer can detect a loss.
type Event struct {
	Seq    uint64    `json:"seq"`
	Kind   EventKind `json:"kind"`
	Tier   Tier      `json:"tier"`
	Hash   BlockHash `json:"hash,omitempty"`
	Parent BlockHash `json:"parent,omitempty"` // hash of the previous block; 0 for the first
	Depth  int32     `json:"depth,omitempty"`  // 0-based position of the block in its sequence
}
