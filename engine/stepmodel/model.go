package stepmodel

import (
	"errors"
	"fmt"
	"math/bits"
	"sort"
	"time"

	"github.com/evolvellm/evolve/kv"
	"github.com/evolvellm/evolve/roles"
	"github.com/zeebo/xxh3"
)

// Errors returned by Submit.
var (
	ErrDraining  = errors.New("engine is draining")
	ErrWrongRole = errors.New("engine's role does not take this request")
	ErrTooLong   = errors.New("request exceeds the model's context")
	ErrInvalid   = errors.New("invalid request")
	ErrDuplicate = errors.New("request id already in flight")
)

// ContextOverflow is Submit's refusal of a request whose prompt and
// max tokens do not fit the model's context together; it is ErrTooLong.
type ContextOverflow struct {
	MaxModelLen, Prompt, MaxTokens int
}

func (e *ContextOverflow) Error() string {
	return fmt.Sprintf("%v: maximum context length is %d tokens, but %d prompt + %d output tokens were requested",
		ErrTooLong, e.MaxModelLen, e.Prompt, e.MaxTokens)
}

// Is makes a ContextOverflow ErrTooLong.
func (e *ContextOverflow) Is(target error) bool { return target == ErrTooLong }

// Config sets the scheduler; zero fields take the profile's value, then
// vLLM's default.
type Config struct {
	MaxNumSeqs          int           // default 256
	MaxNumBatchedTokens int           // default 8192
	GPUBlocks           int           // default: profile
	HostBlocks          int           // default: profile (4x GPU unless set)
	HoldTimeout         time.Duration // how long a remote-decode prefill keeps its KV for the peer; default 480 s (vLLM's)
	// WriteThrough copies every block to the host tier as soon as it is
	// stored on GPU, as Dynamo's KVBM does, instead of on eviction.
	WriteThrough bool
	NewPolicy    func(*BlockTable) EvictionPolicy // default NewLRUPolicy
	// NoTokenStream leaves Output.Tokens empty, for a caller that reads
	// only how many tokens each pass sampled (Output.Sampled), as the
	// simulator does: a decode pass then writes nothing per sequence.
	NoTokenStream bool
}

// Request is one generation request.
type Request struct {
	ID        string
	Tokens    []uint32 // prompt; kept, not copied, while the request is in flight: do not modify
	MaxTokens int      // output tokens to generate at most
	// StopAt, when in (0, MaxTokens), is where the model ends its turn
	// on its own (an end of sequence, drawn by its caller): the request
	// finishes there with FinishStop. MaxTokens still bounds the request
	// against the context, as vLLM checks it.
	StopAt int
	// RemoteDecode makes this the prefill leg of a disaggregated request: it
	// stops after its first token and holds its KV until a peer pulls it
	// (Release) or HoldTimeout passes.
	RemoteDecode bool
	// Chain optionally gives kv.ChainHashes(Tokens, block size), when the
	// caller (a router, the simulator) has it already; it is not hashed again.
	Chain []kv.BlockHash
	Seed  uint64 // output token stream; 0 derives one from ID

	// Remote makes this the decode leg: its prompt's blocks are pulled from a
	// peer before it is scheduled.
	Remote *RemoteKV
	// Finishing marks an answer this engine began, which comes back to
	// be finished here: it is taken while the engine drains.
	Finishing bool
	// Continues marks an answer already begun elsewhere (its engine
	// failed or handed it over), or the prefill that readies its KV: its
	// client is mid-read. It joins the waiting queue ahead of new
	// arrivals, behind the sequences already there ahead of them, as a
	// preempted sequence does (vLLM requeues those at the front).
	Continues bool
}

// RemoteKV says which blocks a peer holds for a decode leg.
type RemoteKV struct {
	Blocks []kv.BlockHash // the peer's block chain for the prompt
	GBps   float64        // transfer bandwidth; 0 means the profile's network_gbps
}

// Usage is what a request cost, in tokens, and when things happened.
type Usage struct {
	PromptTokens      int
	CompletionTokens  int
	GPUHitTokens      int // prompt tokens found in GPU KV
	HostHitTokens     int // prompt tokens loaded from the host tier
	TransferredTokens int // prompt tokens pulled from a peer
	ComputedTokens    int // tokens prefilled, recomputation after preemption included
	Preemptions       int
	Arrival           time.Time
	FirstScheduled    time.Time
	FirstToken        time.Time
	Finish            time.Time
}

// CachedTokens is the prompt tokens not computed here on first schedule.
func (u Usage) CachedTokens() int { return u.GPUHitTokens + u.HostHitTokens + u.TransferredTokens }

// Token is one output token produced by a pass.
type Token struct {
	ReqID string
	ID    uint32
	Index int // 0-based position in the output
	// Sampler is the state of the request's output stream after this
	// token: a request submitted with it as Seed and the output so far
	// appended to its prompt writes the same continuation.
	Sampler uint64
}

// Finish reasons.
const (
	FinishLength       = "length"        // MaxTokens or the context limit reached
	FinishStop         = "stop"          // StopAt reached: the model ended its turn
	FinishRemoteDecode = "remote_decode" // prefill leg done, KV held for the peer
)

// Finished is a request that completed in a pass.
type Finished struct {
	ReqID  string
	Reason string
	Usage  Usage
	Blocks []kv.BlockHash // for FinishRemoteDecode: the held prompt blocks
	Output []uint32       // for FinishLength: the generated tokens
}

// PassStats describes one forward pass (or, when idle, the queues).
type PassStats struct {
	PrefillTokens   int     // new tokens computed
	PrefillAttended float64 // sum over prefill chunks of new tokens x average context attended
	DecodeSeqs      int     // sequences that got one decode token
	DecodeContext   int     // total context of those sequences
	// With sparse attention (Profile.Sparse), the parts of PrefillAttended
	// and DecodeContext within each query's top_k keys; equal to them for
	// dense attention, and read only by the pass's cost.
	PrefillTopK     float64
	DecodeTopK      int
	HostLoadBlocks  int // blocks copied host -> GPU for prefix hits
	OffloadBlocks   int // blocks copied GPU -> host on eviction
	Preemptions     int
	Waiting         int
	Running         int
	Held            int // remote-decode prefills and handed-over decodes holding KV for a peer
	GPUBlocksUsed   int // blocks in use by sequences (cached free blocks not counted)
	GPUBlocksCached int // blocks resident on GPU, in use or not
	GPUBlocks       int
	HostBlocksUsed  int
	HostBlocks      int
}

// Output is what one Step produced. Its slices belong to the model and are
// valid until the next call of any Model method.
type Output struct {
	Start    time.Time
	Duration time.Duration
	Idle     bool    // nothing could run; Duration is 0
	Tokens   []Token // the tokens sampled (none with Config.NoTokenStream)
	Sampled  int     // how many tokens the pass sampled
	Finished []Finished
	Events   []kv.Event // every KV change since the previous Step, in order
	Stats    PassStats
}

// Counters are cumulative totals since the model started.
type Counters struct {
	Passes            uint64
	BusyTime          time.Duration
	PromptTokens      uint64
	GenerationTokens  uint64
	PrefixQueries     uint64 // prompt tokens looked up in the prefix cache
	PrefixHits        uint64 // of those, found (GPU, host or transferred)
	Preemptions       uint64
	TransferredBlocks uint64 // pulled from peers
	FetchedBlocks     uint64 // fetched into the host tier by Fetch
	OffloadedBlocks   uint64
	Requests          uint64
	Aborted           uint64
	Migrated          uint64 // running sequences handed to a peer
}

type seqState uint8

const (
	stWaiting seqState = iota
	stRunning
	stHeld
	stDone
)

// A seq's fields are in the order a decode pass reads them, so that the
// pass, which visits every running sequence once, takes few cache lines of
// each: the request's prompt and limits (near the start of Request), the
// output, the counts, the sampler, the blocks.
type seq struct {
	req Request
	// The sequence's tokens are the prompt (the request's own slice,
	// shared, never written) followed by the generated output tokens: a
	// 100K-token context is not copied on every turn. out holds the
	// output's ids, all of them but, with Config.NoTokenStream, those
	// sampled since the last materialize.
	out       []uint32
	computed  int // tokens whose KV is in blocks
	generated int // output tokens sampled
	rng       uint64
	state     seqState
	blocks    []BlockID      // GPU blocks; blocks[i] holds tokens [i*bs, (i+1)*bs)
	chain     []kv.BlockHash // hashes of the full blocks of the tokens
	// kvReady is when KV coming from elsewhere will have arrived: a decode
	// leg's pull from its prefill peer, or a fetch of its prefix into the
	// host tier. The sequence is not admitted before (vLLM keeps such
	// requests aside, waiting for remote KV, and admits the others).
	kvReady time.Time
	// usage is what the request cost so far but for CompletionTokens,
	// which is generated (see report).
	usage     Usage
	holdUntil time.Time
	// heldBlocks is how much of chain a held sequence holds for its peer.
	heldBlocks int
	admitted   bool
	// ahead: the sequence waits ahead of new arrivals (preempted, or a
	// Request.Continues).
	ahead bool
}

// report is the request's usage so far.
func (s *seq) report() Usage {
	u := s.usage
	u.CompletionTokens = s.generated
	return u
}

type fetch struct {
	ready time.Time
	chain []kv.BlockHash
	from  int
}

// Model is one simulated engine. It is not safe for concurrent use.
type Model struct {
	p       Profile
	cfg     Config
	bs      int // block size, a power of two
	bsShift int // log2(bs)

	role     roles.Role
	draining bool

	byID    map[string]*seq
	waiting []*seq
	running []*seq
	held    []*seq
	fetches []fetch

	blocks     BlockTable
	gpuByHash  *kv.Index // hash -> BlockID of the cached GPU copy
	gpuUsed    int
	gpuPolicy  EvictionPolicy
	hostByHash *kv.Index // hash -> BlockID of the host copy
	hostPolicy EvictionPolicy
	hints      *kv.Table[int8] // hints for blocks not held yet (see arrivingHint)
	hitScratch []BlockID       // admit's GPU hits
	sink       kv.BlockHash    // keeps prefetching reads alive (see kv.Table.Prefetch)

	busyUntil time.Time
	eventSeq  uint64
	delivered bool // out.Events was handed out; clear before the next emit
	out       Output
	sched     []*seq
	counters  Counters

	advPasses   []Pass
	advFinished []Finished
	advEvents   []kv.Event
	topKScratch []int // bulkDecode's contexts under the sparse top_k
	bulkPasses  int   // passes computed in bulk by Advance (for tests)
}

// WithDefaults is c with what it leaves unset taken from profile p, else
// from vLLM's defaults: the configuration a model made with c runs.
func (c Config) WithDefaults(p *Profile) Config {
	if c.MaxNumSeqs <= 0 {
		c.MaxNumSeqs = p.MaxNumSeqs
		if c.MaxNumSeqs <= 0 {
			c.MaxNumSeqs = 256
		}
	}
	if c.MaxNumBatchedTokens <= 0 {
		c.MaxNumBatchedTokens = p.MaxNumBatchedTokens
		if c.MaxNumBatchedTokens <= 0 {
			c.MaxNumBatchedTokens = 8192
		}
	}
	if c.GPUBlocks <= 0 {
		c.GPUBlocks = p.GPUBlocks()
	}
	if c.HostBlocks <= 0 {
		c.HostBlocks = p.HostBlocks()
	}
	if c.HoldTimeout <= 0 {
		c.HoldTimeout = 480 * time.Second
	}
	if c.NewPolicy == nil {
		c.NewPolicy = NewLRUPolicy
	}
	return c
}

// NewModel returns an idle engine for profile p.
func NewModel(p *Profile, c Config) *Model {
	c = c.WithDefaults(p)
	m := &Model{
		p: *p, cfg: c, bs: p.BlockSize, bsShift: bits.TrailingZeros(uint(p.BlockSize)),
		byID:       map[string]*seq{},
		gpuByHash:  kv.NewIndex(min(c.GPUBlocks, 1<<22)),
		hostByHash: &kv.Index{},
		hints:      kv.NewTable[int8](0),
	}
	m.gpuPolicy = c.NewPolicy(&m.blocks)
	m.hostPolicy = c.NewPolicy(&m.blocks)
	return m
}

// Profile returns the model's profile.
func (m *Model) Profile() *Profile { return &m.p }

// Config returns the effective configuration.
func (m *Model) Config() Config { return m.cfg }

// Role returns the current role.
func (m *Model) Role() roles.Role { return m.role }

// SetRole changes the role at once; requests in flight are not touched.
// Setting a role ends a drain.
func (m *Model) SetRole(r roles.Role) { m.role, m.draining = r, false }

// SetDraining stops (true) or resumes (false) taking new requests.
func (m *Model) SetDraining(d bool) { m.draining = d }

// Draining reports whether new requests are refused.
func (m *Model) Draining() bool { return m.draining }

// Counters returns the cumulative totals.
func (m *Model) Counters() Counters { return m.counters }

// InFlight is the number of requests waiting, running or holding KV.
func (m *Model) InFlight() int { return len(m.byID) }

// Held is the number of requests holding KV for a peer to pull (prefill
// legs and handed-over decodes), counted in InFlight.
func (m *Model) Held() int { return len(m.held) }

// DropHolds ends every hold no peer has pulled, as if its timeout had
// passed: the blocks stay cached, evictable. It reports how many it ended.
func (m *Model) DropHolds() int {
	n := len(m.held)
	var last time.Time
	for _, s := range m.held {
		if s.holdUntil.After(last) {
			last = s.holdUntil
		}
	}
	m.expireHolds(last)
	return n
}

// Accepts reports whether a request of this kind would be taken now, and if
// not, why (ErrDraining or ErrWrongRole).
func (m *Model) Accepts(remoteDecode, remotePrefill bool) error {
	if m.draining {
		return ErrDraining
	}
	return m.acceptsRole(remoteDecode, remotePrefill)
}

func (m *Model) acceptsRole(remoteDecode, remotePrefill bool) error {
	if m.role == roles.Decode && remoteDecode {
		return fmt.Errorf("%w: a decode engine takes no prefill-only leg", ErrWrongRole)
	}
	if m.role == roles.Prefill && remotePrefill {
		return fmt.Errorf("%w: a prefill engine takes no decode leg", ErrWrongRole)
	}
	return nil
}

// Submit queues a request arriving at now.
func (m *Model) Submit(now time.Time, r Request) error {
	if m.draining && !r.Finishing {
		return ErrDraining
	}
	if err := m.acceptsRole(r.RemoteDecode, r.Remote != nil); err != nil {
		return err
	}
	if r.ID == "" || len(r.Tokens) == 0 || r.MaxTokens < 1 {
		return fmt.Errorf("%w: needs an id, at least one prompt token and max tokens >= 1", ErrInvalid)
	}
	if _, dup := m.byID[r.ID]; dup {
		return fmt.Errorf("%w: %s", ErrDuplicate, r.ID)
	}
	// Compared so that no sum can overflow: a client may ask for 2^63-1.
	if len(r.Tokens) > m.p.MaxModelLen || r.MaxTokens > m.p.MaxModelLen-len(r.Tokens) {
		return &ContextOverflow{MaxModelLen: m.p.MaxModelLen, Prompt: len(r.Tokens), MaxTokens: r.MaxTokens}
	}
	if need := (len(r.Tokens) + r.MaxTokens + m.bs - 1) / m.bs; need > m.cfg.GPUBlocks { // both bounded now
		return fmt.Errorf("%w: needs %d KV blocks, the engine has %d", ErrTooLong, need, m.cfg.GPUBlocks)
	}
	s := &seq{req: r, rng: r.Seed, state: stWaiting}
	if s.rng == 0 {
		s.rng = xxh3.HashString(r.ID) | 1
	}
	s.out = make([]uint32, 0, min(r.MaxTokens, 64))
	if n := len(r.Tokens) >> m.bsShift; len(r.Chain) == n {
		s.chain = append(make([]kv.BlockHash, 0, n+16), r.Chain...)
	} else {
		s.chain = kv.ChainHashes(r.Tokens, m.bs)
	}
	s.usage.PromptTokens = len(r.Tokens)
	s.usage.Arrival = now
	if r.Remote != nil {
		gbps := r.Remote.GBps
		if gbps <= 0 {
			gbps = m.p.NetworkGBps
		}
		_, local := m.Lookup(s.chain)
		n := min(len(r.Remote.Blocks), len(s.chain)) - local
		s.kvReady = now.Add(m.p.TransferTime(n, gbps))
	} else {
		for i := range m.fetches {
			s.waitFor(&m.fetches[i])
		}
	}
	m.byID[r.ID] = s
	if r.Continues {
		m.queueAhead(s)
	} else {
		m.waiting = append(m.waiting, s)
	}
	m.counters.Requests++
	return nil
}

// Abort removes a request wherever it is and frees its KV. It reports the
// request's usage so far and whether it was known.
func (m *Model) Abort(now time.Time, id string) (Usage, bool) {
	s, ok := m.byID[id]
	if !ok {
		return Usage{}, false
	}
	switch s.state {
	case stWaiting:
		m.waiting = removeSeq(m.waiting, s)
	case stRunning:
		m.running = removeSeq(m.running, s)
	case stHeld:
		m.held = removeSeq(m.held, s)
	}
	m.freeSeq(s)
	delete(m.byID, id)
	s.usage.Finish = now
	m.counters.Aborted++
	return s.report(), true
}

// Migrated is a decoding sequence taken off an engine to continue on
// another (a decode handover before a role switch).
type Migrated struct {
	Usage     Usage
	Tokens    []uint32       // prompt and output so far (a copy)
	Output    []uint32       // the output so far (a sub-slice of Tokens)
	Chain     []kv.BlockHash // the full blocks of Tokens whose KV this engine holds
	Remaining int            // output tokens still to generate
	// Sampler is the state of the output stream: a peer given it as its
	// Request.Seed draws the tokens this engine would have drawn next.
	Sampler uint64
}

// Migrate takes a running sequence that has started its output off the
// engine, for a peer to continue from its KV. The blocks stay cached here,
// evictable, so that the peer can pull them. It reports false for a
// sequence that is unknown or not decoding.
func (m *Model) Migrate(now time.Time, id string) (Migrated, bool) {
	return m.migrate(now, id, false)
}

// HandOver is Migrate for a peer that pulls the KV later, over a network
// (a live engine's handover): the sequence's blocks are held, as a
// prefill leg's are, until the peer takes them (Release, which returns
// Migrated.Chain) or HoldTimeout passes.
func (m *Model) HandOver(now time.Time, id string) (Migrated, bool) {
	return m.migrate(now, id, true)
}

func (m *Model) migrate(now time.Time, id string, hold bool) (Migrated, bool) {
	s, ok := m.byID[id]
	if !ok || s.state != stRunning || s.generated == 0 || s.req.RemoteDecode {
		return Migrated{}, false
	}
	m.materialize(s)
	full := min(s.computed>>m.bsShift, len(s.chain))
	mg := Migrated{Usage: s.report(), Tokens: append(append(make([]uint32, 0, s.ntok()), s.req.Tokens...), s.out...),
		Chain:     append([]kv.BlockHash(nil), s.chain[:full]...),
		Remaining: min(s.limit()-s.generated, m.p.MaxModelLen-s.ntok()), Sampler: s.rng}
	mg.Output = mg.Tokens[len(s.req.Tokens):]
	mg.Usage.Finish = now
	m.running = removeSeq(m.running, s)
	m.counters.Migrated++
	if hold {
		// The blocks past the full ones hold output the peer recomputes.
		s.state, s.holdUntil, s.heldBlocks = stHeld, now.Add(m.cfg.HoldTimeout), full
		m.held = append(m.held, s)
		return mg, true
	}
	m.freeSeq(s)
	delete(m.byID, id)
	return mg, true
}

// Release ends the hold of a remote-decode prefill (the peer pulled its KV)
// and returns the held block chain. The blocks stay cached, evictable.
func (m *Model) Release(id string) ([]kv.BlockHash, bool) {
	s, ok := m.byID[id]
	if !ok || s.state != stHeld {
		return nil, false
	}
	m.held = removeSeq(m.held, s)
	m.freeSeq(s)
	delete(m.byID, id)
	return s.chain[:s.heldBlocks], true
}

// Lookup returns how many leading blocks of chain are on GPU, and how many
// are on GPU or in the host tier.
func (m *Model) Lookup(chain []kv.BlockHash) (gpu, local int) {
	m.hitScratch = m.gpuHits(chain, m.hitScratch[:0])
	gpu = len(m.hitScratch)
	local = gpu
	for local < len(chain) && (m.onGPU(chain[local]) || m.onHost(chain[local])) {
		local++
	}
	return gpu, local
}

func (m *Model) onGPU(h kv.BlockHash) bool {
	return m.gpuByHash.Has(h)
}

func (m *Model) onHost(h kv.BlockHash) bool {
	return m.hostByHash.Has(h)
}

// Fetch starts pulling chain[from:] from a peer into the host tier at gbps
// (0: the profile's network bandwidth); blocks already here are not moved.
// It returns when the blocks will have arrived and how many move. Nothing
// waits on a fetch: a request scheduled after it finds the blocks in host.
func (m *Model) Fetch(now time.Time, chain []kv.BlockHash, from int, gbps float64) (time.Time, int) {
	if gbps <= 0 {
		gbps = m.p.NetworkGBps
	}
	n := 0
	for i := max(from, 0); i < len(chain); i++ {
		if !m.onGPU(chain[i]) && !m.onHost(chain[i]) {
			n++
		}
	}
	ready := now.Add(m.p.TransferTime(n, gbps))
	if n > 0 {
		f := fetch{ready: ready, chain: append([]kv.BlockHash(nil), chain...), from: max(from, 0)}
		i := len(m.fetches)
		m.fetches = append(m.fetches, f)
		for i > 0 && m.fetches[i-1].ready.After(ready) {
			m.fetches[i], m.fetches[i-1] = m.fetches[i-1], m.fetches[i]
			i--
		}
		for _, s := range m.waiting {
			if s.req.Remote == nil && !s.admitted {
				s.waitFor(&f)
			}
		}
	}
	return ready, n
}

// waitFor makes the sequence wait for a fetch that brings blocks of its
// prefix: computing them instead would throw the fetch away (the router
// chose it because moving beats recomputing).
func (s *seq) waitFor(f *fetch) {
	if !f.ready.After(s.kvReady) {
		return
	}
	// Chains are prefix hashes: equal at index j means equal up to j.
	// The fetch helps if the two share a block at or beyond f.from.
	j := min(len(s.chain), len(f.chain)) - 1
	if j < f.from || s.chain[f.from] != f.chain[f.from] {
		return
	}
	s.kvReady = f.ready
}

// OffloadGPU copies every cached GPU block that the host tier lacks to host,
// as before a role switch, so that the context stays reachable. It returns
// the number of blocks copied and the time the copy takes, which delays the
// next pass.
func (m *Model) OffloadGPU(now time.Time) (int, time.Duration) {
	n := 0
	var ids []BlockID
	m.gpuByHash.Range(func(h kv.BlockHash, id int32) bool {
		if !m.onHost(h) {
			ids = append(ids, BlockID(id))
		}
		return true
	})
	for _, id := range ids { // storeHost may change the host index, not the GPU one
		b := m.blocks.Get(id)
		if m.storeHost(b.Hash, b.Parent, b.Depth, b.Priority) {
			n++
		}
	}
	d := m.p.TransferTime(n, m.p.HostGBps)
	if m.busyUntil.Before(now) {
		m.busyUntil = now
	}
	m.busyUntil = m.busyUntil.Add(d)
	m.counters.OffloadedBlocks += uint64(n)
	return n, d
}

// Hint is an eviction priority for one block: lower is evicted first, 0
// removes the hint.
type Hint struct {
	Hash     kv.BlockHash
	Priority int8
	// Tiers, when not 0, says which tiers hold a copy (bit 1<<kv.Tier),
	// as the caller's directory knows: the others are not looked up.
	Tiers uint8
}

// TierBit is a tier's bit in Hint.Tiers.
func TierBit(t kv.Tier) uint8 { return 1 << (t & 1) }

// SetHints applies eviction hints to the block copies in both tiers. A
// hint for a block the engine holds no copy of waits for the block's
// arrival; the copies carry their hint between tiers.
func (m *Model) SetHints(hints []Hint) {
	for i, h := range hints {
		if i%prefetchBatch == 0 {
			// A rewrite's dead tail hints hundreds of blocks, each a
			// likely cache miss in both tiers' indexes: read the next
			// batch's slots in parallel.
			for _, x := range hints[i:min(i+prefetchBatch, len(hints))] {
				m.sink ^= m.gpuByHash.PrefetchOne(x.Hash) ^ m.hostByHash.PrefetchOne(x.Hash)
			}
		}
		var onGPU, onHost bool
		if h.Tiers == 0 || h.Tiers&TierBit(kv.TierGPU) != 0 {
			var gid int32
			if gid, onGPU = m.gpuByHash.Get(h.Hash); onGPU {
				m.reprioritize(BlockID(gid), m.gpuPolicy, h.Priority)
			}
		}
		if h.Tiers == 0 || h.Tiers&TierBit(kv.TierHost) != 0 {
			var hid int32
			if hid, onHost = m.hostByHash.Get(h.Hash); onHost {
				m.reprioritize(BlockID(hid), m.hostPolicy, h.Priority)
			}
		}
		switch {
		case !onGPU && !onHost && h.Priority != 0:
			m.hints.Put(h.Hash, h.Priority)
		case m.hints.Len() > 0:
			m.hints.Delete(h.Hash)
		}
	}
}

func (m *Model) reprioritize(id BlockID, p EvictionPolicy, prio int8) {
	b := m.blocks.Get(id)
	if b.Priority == prio {
		return
	}
	// Host copies are always evictable; GPU copies when nobody uses them.
	evictable := b.Tier == kv.TierHost || b.ref == 0
	if evictable {
		p.Remove(id)
	}
	b.Priority = prio
	if evictable {
		p.Add(id)
	}
}

// NextWake returns the earliest time after now at which something becomes
// ready without a new request (a transfer lands, a fetch completes, a KV
// hold expires), so that an idle runner knows when to step again.
func (m *Model) NextWake(now time.Time) (time.Time, bool) {
	var t time.Time
	ok := false
	consider := func(x time.Time) {
		if x.After(now) && (!ok || x.Before(t)) {
			t, ok = x, true
		}
	}
	for _, s := range m.waiting {
		if !s.admitted {
			consider(s.kvReady)
		}
	}
	for _, f := range m.fetches {
		consider(f.ready)
	}
	for _, s := range m.held {
		consider(s.holdUntil)
	}
	return t, ok
}

func removeSeq(list []*seq, s *seq) []*seq {
	for i, x := range list {
		if x == s {
			copy(list[i:], list[i+1:])
			list[len(list)-1] = nil
			return list[:len(list)-1]
		}
	}
	return list
}

// Resync queues an AllBlocksCleared event followed by a BlockStored event for
// every block copy the engine holds (GPU, then host), so that a consumer that
// lost events can rebuild this engine's entries. The events come with the
// next Step's output.
func (m *Model) Resync() int {
	m.emit(kv.AllCleared, kv.TierGPU, 0, 0, 0)
	n := 0
	for _, x := range []*kv.Index{m.gpuByHash, m.hostByHash} {
		x.Range(func(_ kv.BlockHash, id int32) bool {
			m.emitBlock(kv.BlockStored, m.blocks.Get(BlockID(id)))
			n++
			return true
		})
	}
	return n
}

// LastEventSeq is the sequence number of the last KV event emitted.
func (m *Model) LastEventSeq() uint64 { return m.eventSeq }

// Load reports what a load-based planner looks at: prompt tokens not yet
// prefilled (waiting requests, and running ones still in prefill), and the
// tokens that waiting requests will need in KV.
func (m *Model) Load() (queuedPrefillTokens, queuedKVTokens int) {
	for _, s := range m.waiting {
		queuedPrefillTokens += s.ntok() - s.computed
		queuedKVTokens += s.ntok()
	}
	for _, s := range m.running {
		if left := s.ntok() - s.computed; left > 1 {
			queuedPrefillTokens += left
		}
	}
	return queuedPrefillTokens, queuedKVTokens
}

// AbortAll drops every request (a worker being removed) and returns their
// ids, in no particular order.
func (m *Model) AbortAll(now time.Time) []string {
	var ids []string
	for id := range m.byID {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		m.Abort(now, id)
	}
	return ids
}
