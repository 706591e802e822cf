package vllm

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/evolvellm/evolve/kv"
)

// Translator turns vLLM's KV events into evolve's: each block is renamed
// to evolve's chained hash over its token ids (kv.NextHash), which the
// router computes from the same ids, and the events are numbered from 1
// without gaps as the engine protocol wants. It remembers every block vLLM
// holds, by vLLM's hash, so that a BlockRemoved (which carries no tokens)
// can be named, and so that the whole state can be published again
// (Snapshot) when the orchestrator asks for a resync.
//
// Blocks evolve's router cannot name are left out and counted: those of a
// LoRA adapter or with extra keys (multimodal inputs, cache salts) hash
// differently in vLLM than their token ids say, those of a KV-cache group
// other than the first repeat the first's, and a block whose parent was
// never seen (events lost before the adapter started) has no chain. A
// parent of 0 that no block has is read as none: servers that speak
// vLLM's protocol name a first block's parent so (llm-d-inference-sim),
// where vLLM writes null.
type Translator struct {
	blockSize int
	blocks    map[EngineHash]block
	copies    [2]int // copies per tier, kept as blocks change
	seq       uint64

	// Ignored counts blocks left out on purpose (adapters, extra keys,
	// other groups, media other than GPU and CPU, token ids that do not
	// fill the blocks); Orphans counts blocks whose parent was unknown.
	// LastLeftOut says why the last block was left out.
	Ignored, Orphans int64
	LastLeftOut      string
}

// leaveOut counts n blocks left out of the directory, and why.
func (t *Translator) leaveOut(n int, orphan bool, why string) {
	if orphan {
		t.Orphans += int64(n)
	} else {
		t.Ignored += int64(n)
	}
	t.LastLeftOut = why
}

// block is what the translator knows of one block vLLM holds.
type block struct {
	ours   kv.BlockHash
	parent kv.BlockHash // evolve's hash of the block before; 0 for a first block
	depth  int32
	tiers  uint8 // bit 1<<kv.Tier per tier holding a copy
}

// NewTranslator returns a translator for an engine whose KV blocks hold
// blockSize tokens (used when an event does not say).
func NewTranslator(blockSize int) *Translator {
	return &Translator{blockSize: blockSize, blocks: map[EngineHash]block{}}
}

// tierOf maps vLLM's medium to a tier: "GPU" (or none, before vLLM named
// media) is the device, "CPU" the host-memory offload tier.
func tierOf(medium string) (kv.Tier, bool) {
	switch medium {
	case "", "GPU", "gpu", "cuda", "CUDA":
		return kv.TierGPU, true
	case "CPU", "cpu":
		return kv.TierHost, true
	}
	return 0, false
}

func (t *Translator) emit(out []kv.Event, e kv.Event) []kv.Event {
	t.seq++
	e.Seq = t.seq
	return append(out, e)
}

// LastSeq is the sequence number of the last event emitted.
func (t *Translator) LastSeq() uint64 { return t.seq }

// Blocks returns how many blocks have a copy on GPU and in host memory.
func (t *Translator) Blocks() (gpu, host int) { return t.copies[kv.TierGPU], t.copies[kv.TierHost] }

// Apply translates one vLLM event, appending evolve's events to out.
func (t *Translator) Apply(ev Event, out []kv.Event) []kv.Event {
	switch ev.Type {
	case BlockStored:
		return t.stored(ev, out)
	case BlockRemoved:
		tier, ok := tierOf(ev.Medium)
		if !ok || ev.GroupIdx != 0 {
			return out
		}
		for _, h := range ev.BlockHashes {
			out = t.remove(h, tier, out) // nothing for blocks left out when stored, or gone
		}
		return out
	case AllBlocksCleared:
		if tier, ok := tierOf(ev.Medium); ok && ev.Medium != "" && tier != kv.TierGPU {
			return t.clearTier(tier, out) // one offload tier was cleared
		}
		if ev.Medium != "" {
			if _, ok := tierOf(ev.Medium); !ok {
				return out // a tier evolve does not track
			}
		}
		return t.Clear(out)
	}
	return out
}

func (t *Translator) stored(ev Event, out []kv.Event) []kv.Event {
	n := len(ev.BlockHashes)
	tier, ok := tierOf(ev.Medium)
	switch {
	case !ok:
		t.leaveOut(n, false, fmt.Sprintf("medium %q is neither GPU nor CPU", ev.Medium))
		return out
	case ev.HasLoRA:
		t.leaveOut(n, false, "a LoRA adapter's blocks hash apart from their token ids")
		return out
	case ev.HasExtra:
		t.leaveOut(n, false, "blocks with extra keys (media, cache salts) hash apart from their token ids")
		return out
	case ev.GroupIdx != 0:
		t.leaveOut(n, false, "a KV-cache group other than the first repeats the first's blocks")
		return out
	}
	bs := ev.BlockSize
	if bs <= 0 {
		bs = t.blockSize
	}
	if bs <= 0 || len(ev.TokenIDs) != bs*n {
		t.leaveOut(n, false, fmt.Sprintf("%d token ids do not fill %d blocks of %d", len(ev.TokenIDs), n, bs))
		return out
	}
	var parent kv.BlockHash
	depth := int32(0)
	hasParent := false
	if ev.HasParent {
		p, ok := t.blocks[ev.Parent]
		switch {
		case ok:
			parent, depth, hasParent = p.ours, p.depth+1, true
		case ev.Parent == 0:
			// A first block, as servers that write 0 for null say.
		default:
			t.leaveOut(n, true, fmt.Sprintf("parent block %d was never stored: events lost before the agent subscribed, or a server that names a first block's parent otherwise than null or 0", ev.Parent))
			return out
		}
	}
	for i, h := range ev.BlockHashes {
		b, known := t.blocks[h]
		if !known {
			b = block{ours: kv.NextHash(parent, hasParent, ev.TokenIDs[i*bs:(i+1)*bs]), parent: parent, depth: depth}
		}
		if b.tiers&(1<<tier) == 0 {
			b.tiers |= 1 << tier
			t.blocks[h] = b
			t.copies[tier]++
			out = t.emit(out, kv.Event{Kind: kv.BlockStored, Tier: tier, Hash: b.ours, Parent: b.parent, Depth: b.depth})
		}
		parent, depth, hasParent = b.ours, b.depth+1, true
	}
	return out
}

// Clear forgets every block and emits AllCleared.
func (t *Translator) Clear(out []kv.Event) []kv.Event {
	clear(t.blocks)
	t.copies = [2]int{}
	return t.emit(out, kv.Event{Kind: kv.AllCleared})
}

func (t *Translator) clearTier(tier kv.Tier, out []kv.Event) []kv.Event {
	for h := range t.blocks {
		out = t.remove(h, tier, out)
	}
	return out
}

// remove drops the copy in tier of the block vLLM calls h, if there is
// one, and forgets the block once it has no copy left.
func (t *Translator) remove(h EngineHash, tier kv.Tier, out []kv.Event) []kv.Event {
	b, ok := t.blocks[h]
	if !ok || b.tiers&(1<<tier) == 0 {
		return out
	}
	out = t.emit(out, kv.Event{Kind: kv.BlockRemoved, Tier: tier, Hash: b.ours, Parent: b.parent, Depth: b.depth})
	b.tiers &^= 1 << tier
	t.copies[tier]--
	if b.tiers == 0 {
		delete(t.blocks, h)
	} else {
		t.blocks[h] = b
	}
	return out
}

// Snapshot emits AllCleared and then a BlockStored for every copy vLLM
// holds, parents before children: what a consumer that lost events needs
// to rebuild this engine's part of the directory.
func (t *Translator) Snapshot(out []kv.Event) []kv.Event {
	out = t.emit(out, kv.Event{Kind: kv.AllCleared})
	all := make([]block, 0, len(t.blocks))
	for _, b := range t.blocks {
		all = append(all, b)
	}
	slices.SortFunc(all, func(a, b block) int {
		if a.depth != b.depth {
			return int(a.depth - b.depth)
		}
		return cmp.Compare(a.ours, b.ours) // any fixed order
	})
	for _, b := range all {
		for _, tier := range []kv.Tier{kv.TierGPU, kv.TierHost} {
			if b.tiers&(1<<tier) != 0 {
				out = t.emit(out, kv.Event{Kind: kv.BlockStored, Tier: tier, Hash: b.ours, Parent: b.parent, Depth: b.depth})
			}
		}
	}
	return out
}
