package routing

import (
	"math/rand/v2"
	"time"

	"github.com/evolvellm/evolve/kv"
	"github.com/evolvellm/evolve/roles"
)

// Dynamo is NVIDIA Dynamo's KV-aware router (lib/kv-router, release line 1.x)
// as docs/baselines.md describes it, with the same
// bookkeeping and no knowledge Dynamo lacks. Per worker w and request with
// prompt length ISL and n full blocks:
//
//	credit_w         = device_overlap_w + 0.75 * host_overlap_w
//	prefill_blocks_w = (active_prefill_tokens_w + ISL - credit_w*bs) / bs
//	decode_blocks_w  = active_blocks_w + (n - depth_w)
//	cost_w           = prefill_blocks_w + decode_blocks_w, argmin, ties at random
//
// device_overlap_w counts the leading blocks w has on GPU and host_overlap_w
// the blocks past them in its host tier (KVBM), from the engines' KV events;
// a host hit is worth host_cache_hit_weight 0.75 of a device hit
// (lib/kv-router/src/scheduling/config.rs, default_host_cache_hit_weight;
// applied in scheduling/selector/default.rs, worker_logit). depth_w is how
// far the chain matches blocks already in flight on w: with
// router_assume_kv_reuse (default true) active blocks are de-duplicated by
// hash. With both prefill and decode workers it routes disaggregated: the
// prefill stage by the prefill term alone, the decode stage by in-flight
// blocks summed per request (the decode override sets assume_kv_reuse
// false and overlap credit 0: sequences/prompt_registry.rs,
// potential_decode_blocks), and every request is prefilled remotely.
//
// Router queue (scheduling/queue.rs): when every worker that prefills has
// active prefill tokens above router_queue_threshold (default 16.0) times
// its max_num_batched_tokens, new requests wait at the router, first come
// first served, until one drops below (Busy).
type Dynamo struct {
	workers map[string]*dynWorker
	reqs    map[string]*dynRequest
	rng     *rand.Rand
}

type dynWorker struct {
	activeBlocks        map[kv.BlockHash]int // prompt blocks of in-flight requests, ref-counted
	activePrefillTokens float64
	decodeBlocks        int // disaggregated decode stage: blocks of in-flight requests, counted in full
}

type dynRequest struct {
	prefill, decode string
	chain           []kv.BlockHash
	prefillTokens   float64
	decodeBlocks    int
	prefillDone     bool
}

// NewDynamo returns the dynamo policy; ties are broken by a generator with
// a fixed seed, so runs repeat.
func NewDynamo() *Dynamo { return NewDynamoSeeded(1) }

// NewDynamoSeeded returns the dynamo policy with its tie-break seed.
func NewDynamoSeeded(seed uint64) *Dynamo {
	return &Dynamo{workers: map[string]*dynWorker{}, reqs: map[string]*dynRequest{}, rng: rand.New(rand.NewPCG(seed, seed^0x5bd1e995))}
}

// Name is "dynamo".
func (*Dynamo) Name() string { return "dynamo" }

func (d *Dynamo) worker(id string) *dynWorker {
	w := d.workers[id]
	if w == nil {
		w = &dynWorker{activeBlocks: map[kv.BlockHash]int{}}
		d.workers[id] = w
	}
	return w
}

// DynamoHostCacheHitWeight is what a block in a worker's host tier is
// worth against one on its GPU (host_cache_hit_weight).
const DynamoHostCacheHitWeight = 0.75

// DynamoQueueThreshold is router_queue_threshold: the router queues when
// every prefilling worker has more active prefill tokens than this many
// times its max_num_batched_tokens.
const DynamoQueueThreshold = 16.0

// costs of one worker for request r; overlap is the leading blocks it
// holds, GPU or host, which its prefill will not compute.
func (d *Dynamo) costs(n *Node, r *Request, bs int) (prefillBlocks, decodeBlocks float64, overlap int) {
	w := d.worker(n.ID)
	credit := 0.0
	if r.Match != nil {
		m := r.Match.For(n.Dir)
		overlap = m.Local
		credit = float64(m.GPU) + DynamoHostCacheHitWeight*float64(m.Local-m.GPU)
	}
	prefillBlocks = (w.activePrefillTokens + float64(r.Tokens) - credit*float64(bs)) / float64(bs)
	depth := 0
	for depth < len(r.Chain) && w.activeBlocks[r.Chain[depth]] > 0 {
		depth++
	}
	decodeBlocks = float64(len(w.activeBlocks) + len(r.Chain) - depth)
	return prefillBlocks, decodeBlocks, overlap
}

// argmin returns the index of the least cost, ties at random.
func (d *Dynamo) argmin(costs []float64) int {
	best, ties := 0, 1
	for i := 1; i < len(costs); i++ {
		switch {
		case costs[i] < costs[best]:
			best, ties = i, 1
		case costs[i] == costs[best]:
			ties++
			if d.rng.IntN(ties) == 0 {
				best = i
			}
		}
	}
	return best
}

// Route picks workers by Dynamo's cost and records the request.
func (d *Dynamo) Route(_ time.Time, r *Request, v *View) (Decision, error) {
	ps, ds := serving(v, roles.Prefill), serving(v, roles.Decode)
	bs := v.BlockSize
	if len(ps) == 0 || len(ds) == 0 { // aggregated: every worker does both
		all := append(ps, ds...)
		if len(all) == 0 {
			return Decision{}, ErrNoNode
		}
		costs := make([]float64, len(all))
		overlaps := make([]int, len(all))
		for i, n := range all {
			p, dec, ov := d.costs(n, r, bs)
			costs[i], overlaps[i] = p+dec, ov
		}
		i := d.argmin(costs)
		n := all[i]
		req := &dynRequest{prefill: n.ID, decode: n.ID, chain: r.Chain,
			prefillTokens: float64(r.Tokens - overlaps[i]*bs)}
		d.admit(r.ID, req, true)
		return Decision{Prefill: n.ID, Decode: n.ID, Reason: "dynamo: least prefill+decode blocks"}, nil
	}
	pc := make([]float64, len(ps))
	overlaps := make([]int, len(ps))
	for i, n := range ps {
		p, _, ov := d.costs(n, r, bs)
		pc[i], overlaps[i] = p, ov
	}
	pi := d.argmin(pc)
	dc := make([]float64, len(ds))
	for i, n := range ds {
		dc[i] = float64(d.worker(n.ID).decodeBlocks + len(r.Chain))
	}
	di := d.argmin(dc)
	req := &dynRequest{prefill: ps[pi].ID, decode: ds[di].ID, chain: r.Chain,
		prefillTokens: float64(r.Tokens - overlaps[pi]*bs), decodeBlocks: len(r.Chain)}
	d.admit(r.ID, req, false)
	return Decision{Prefill: ps[pi].ID, Decode: ds[di].ID, Disaggregated: true, Reason: "dynamo: disaggregated, prefill by queued prefill, decode by in-flight blocks"}, nil
}

// Busy reports whether Dynamo's router would queue a new request now:
// every serving worker that prefills (the prefill pool when there is one,
// else every worker) has active prefill tokens above DynamoQueueThreshold
// times its max_num_batched_tokens. A worker whose budget is unknown is
// never counted busy.
func (d *Dynamo) Busy(v *View) bool {
	pool, ds := serving(v, roles.Prefill), serving(v, roles.Decode)
	if len(pool) == 0 || len(ds) == 0 { // aggregated: every worker prefills
		pool = append(pool, ds...)
	}
	if len(pool) == 0 {
		return false
	}
	for _, n := range pool {
		if n.MaxBatchedTokens <= 0 || d.worker(n.ID).activePrefillTokens <= DynamoQueueThreshold*float64(n.MaxBatchedTokens) {
			return false
		}
	}
	return true
}

func (d *Dynamo) admit(id string, req *dynRequest, aggregated bool) {
	if old := d.reqs[id]; old != nil { // a retry: forget the earlier attempt
		d.Finished(time.Time{}, id)
	}
	d.reqs[id] = req
	pw := d.worker(req.prefill)
	pw.activePrefillTokens += req.prefillTokens
	if aggregated {
		for _, h := range req.chain {
			pw.activeBlocks[h]++
		}
	} else {
		d.worker(req.decode).decodeBlocks += req.decodeBlocks
	}
}

// FirstToken removes the request's prefill tokens from its prefill worker.
func (d *Dynamo) FirstToken(_ time.Time, id string) {
	req := d.reqs[id]
	if req == nil || req.prefillDone {
		return
	}
	req.prefillDone = true
	d.worker(req.prefill).activePrefillTokens -= req.prefillTokens
}

// Finished removes the request's blocks.
func (d *Dynamo) Finished(now time.Time, id string) {
	req := d.reqs[id]
	if req == nil {
		return
	}
	d.FirstToken(now, id)
	if req.decodeBlocks > 0 {
		d.worker(req.decode).decodeBlocks -= req.decodeBlocks
	} else {
		w := d.worker(req.prefill)
		for _, h := range req.chain {
			if w.activeBlocks[h]--; w.activeBlocks[h] <= 0 {
				delete(w.activeBlocks, h)
			}
		}
	}
	delete(d.reqs, id)
}
