package routing

import "github.com/evolvellm/evolve/kv"

// Load is what one routed request adds to its nodes' bookkeeping in a
// stateful policy, in the policy's own terms, so that router replicas
// can share it (Shared).
type Load struct {
	Prefill string `json:"prefill"`
	Decode  string `json:"decode"`
	// PrefillSec: evolve's seconds of prefill queued on Prefill.
	PrefillSec float64 `json:"prefill_s,omitempty"`
	// PrefillTokens, DecodeBlocks and Chain: Dynamo's active prefill
	// tokens on Prefill, blocks on Decode (disaggregated), and the
	// prompt's blocks active on Prefill (aggregated, DecodeBlocks 0).
	PrefillTokens float64        `json:"prefill_tokens,omitempty"`
	DecodeBlocks  int            `json:"decode_blocks,omitempty"`
	Chain         []kv.BlockHash `json:"chain,omitempty"`
}

// Shared is a stateful policy whose bookkeeping router replicas share,
// as Dynamo's router replicas share their active sequences: Load says
// what a request this router routed added, AddLoad takes a request
// another router routed; FirstToken and Finished then take its id as
// they take their own. Ids must be unique across routers.
type Shared interface {
	Load(id string) (Load, bool)
	AddLoad(id string, l Load)
}

// Load is what request id added to Dynamo's bookkeeping.
func (d *Dynamo) Load(id string) (Load, bool) {
	req := d.reqs[id]
	if req == nil {
		return Load{}, false
	}
	l := Load{Prefill: req.prefill, Decode: req.decode, PrefillTokens: req.prefillTokens, DecodeBlocks: req.decodeBlocks}
	if req.decodeBlocks == 0 {
		l.Chain = req.chain
	}
	return l, true
}

// AddLoad takes a request another router placed.
func (d *Dynamo) AddLoad(id string, l Load) {
	d.admit(id, &dynRequest{prefill: l.Prefill, decode: l.Decode, chain: l.Chain, prefillTokens: l.PrefillTokens,
		decodeBlocks: l.DecodeBlocks}, l.DecodeBlocks == 0)
}

// Load is what request id added to evolve's bookkeeping.
func (e *Evolve) Load(id string) (Load, bool) {
	req, ok := e.reqs[id]
	if !ok {
		return Load{}, false
	}
	return Load{Prefill: req.prefill, Decode: req.decode, PrefillSec: req.prefillSec}, true
}

// AddLoad takes a request another router placed.
func (e *Evolve) AddLoad(id string, l Load) {
	e.admit(id, evolveReq{prefill: l.Prefill, decode: l.Decode, prefillSec: l.PrefillSec})
}
