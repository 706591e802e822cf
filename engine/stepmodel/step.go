package stepmodel

import (
	"slices"
	"time"

	"github.com/evolvellm/evolve/kv"
	"github.com/evolvellm/evolve/tokenizer"
)

// Step runs one forward pass starting at now (or when the previous pass or
// offload ends, if later) and returns its modelled duration and output. When
// nothing can run, the output is Idle with duration 0; see NextWake.
func (m *Model) Step(now time.Time) (time.Duration, Output) {
	if now.Before(m.busyUntil) {
		now = m.busyUntil
	}
	if m.delivered {
		m.out.Events = m.out.Events[:0]
		m.delivered = false
	}
	out := &m.out
	out.Start, out.Duration, out.Idle = now, 0, false
	out.Tokens, out.Sampled, out.Finished = out.Tokens[:0], 0, out.Finished[:0]
	out.Stats = PassStats{}
	st := &out.Stats

	m.expireHolds(now)
	m.completeFetches(now)

	budget := m.cfg.MaxNumBatchedTokens
	m.sched = m.sched[:0]

	// Running sequences first, in order; preempt from the back under KV pressure.
	for i := 0; i < len(m.running) && budget > 0; i++ {
		s := m.running[i]
		n := min(s.ntok()-s.computed, budget)
		for !m.ensureBlocks(s, s.computed+n) {
			victim := m.running[len(m.running)-1]
			m.running = m.running[:len(m.running)-1]
			m.preempt(victim)
			st.Preemptions++
			if victim == s {
				n = 0
				break
			}
		}
		if n == 0 {
			break
		}
		m.account(s, n, st)
		budget -= n
	}

	// Then waiting sequences, in arrival order, while budget, sequence slots
	// and KV blocks last. Sequences whose KV is still in flight (a decode
	// leg's pull, a fetch of the prefix) are skipped.
	if budget > 0 && len(m.running) < m.cfg.MaxNumSeqs {
		kept := m.waiting[:0]
		blocked := false
		for _, s := range m.waiting {
			if blocked || budget == 0 || len(m.running) >= m.cfg.MaxNumSeqs ||
				(!s.admitted && now.Before(s.kvReady)) {
				kept = append(kept, s)
				continue
			}
			n, ok := m.admit(now, s, budget, st)
			if !ok {
				blocked = true // vLLM stops admitting at the first that does not fit
				kept = append(kept, s)
				continue
			}
			s.state = stRunning
			m.running = append(m.running, s)
			m.account(s, n, st)
			budget -= n
		}
		for i := len(kept); i < len(m.waiting); i++ {
			m.waiting[i] = nil
		}
		m.waiting = kept
	}

	if len(m.sched) == 0 {
		out.Idle = true
		m.fillQueueStats(st)
		m.delivered = true
		return 0, *out
	}

	d := m.passTime(st)
	end := now.Add(d)
	out.Duration = d
	m.busyUntil = end
	m.counters.Passes++
	m.counters.BusyTime += d

	// Sample a token for every sequence whose KV is now complete.
	finished := false
	for _, s := range m.sched {
		if s.computed < s.ntok() {
			continue // a prefill chunk, more to come
		}
		m.sample(s, end)
		if s.state != stRunning {
			finished = true
		}
	}
	if finished {
		kept := m.running[:0]
		for _, s := range m.running {
			if s.state == stRunning {
				kept = append(kept, s)
			}
		}
		for i := len(kept); i < len(m.running); i++ {
			m.running[i] = nil
		}
		m.running = kept
	}
	m.fillQueueStats(st)
	m.delivered = true
	return d, *out
}

// admit matches s's prefix against the tiers, takes the blocks it needs for
// its first chunk and returns that chunk's size; false if KV does not fit.
func (m *Model) admit(now time.Time, s *seq, budget int, st *PassStats) (int, bool) {
	maxHit := (s.ntok() - 1) / m.bs // always compute at least the last token
	// The GPU hit, remembering each block's copy; blocks hit on GPU stop
	// being evictable once taken: count them out of the room left.
	hits, evictableHits := m.gpuHits(s.chain[:min(maxHit, len(s.chain))], m.hitScratch[:0]), 0
	for _, id := range hits {
		if m.blocks.Get(id).ref == 0 {
			evictableHits++
		}
	}
	m.hitScratch = hits
	g := len(hits)
	t := g
	host, xfer := 0, 0
	for t < maxHit && t < len(s.chain) {
		h := s.chain[t]
		switch {
		case m.onHost(h):
			host++
		case s.req.Remote != nil && t < len(s.req.Remote.Blocks) && s.req.Remote.Blocks[t] == h:
			xfer++
		default:
			goto matched
		}
		t++
	}
matched:
	n := min(s.ntok()-t*m.bs, budget)
	need := (t*m.bs+n+m.bs-1)/m.bs - g
	if m.gpuAvailable()-evictableHits < need {
		return 0, false
	}
	for _, id := range hits {
		m.acquireCached(id)
	}
	s.blocks = append(s.blocks, hits...)
	for i := g; i < t; i++ {
		h := s.chain[i]
		if hid, ok := m.hostByHash.Get(h); ok {
			m.touchHost(BlockID(hid))
		}
		b := m.allocGPU()
		var parent kv.BlockHash
		if i > 0 {
			parent = s.chain[i-1]
		}
		s.blocks = append(s.blocks, b)
		m.commitBlock(b, h, parent, i)
	}
	s.computed = t * m.bs
	st.HostLoadBlocks += host
	if !s.admitted {
		s.admitted = true
		s.usage.FirstScheduled = now
		s.usage.GPUHitTokens = g * m.bs
		s.usage.HostHitTokens = host * m.bs
		s.usage.TransferredTokens = xfer * m.bs
		m.counters.PrefixQueries += uint64(len(s.req.Tokens))
		m.counters.PrefixHits += uint64(t * m.bs)
		m.counters.TransferredBlocks += uint64(xfer)
	}
	if !m.ensureBlocks(s, s.computed+n) {
		panic("sim: admission accounted blocks it could not allocate")
	}
	return n, true
}

// ensureBlocks gives s enough GPU blocks to hold tokens tokens.
func (m *Model) ensureBlocks(s *seq, tokens int) bool {
	need := (tokens + m.bs - 1) >> m.bsShift
	for len(s.blocks) < need {
		b := m.allocGPU()
		if b == NoBlock {
			return false
		}
		s.blocks = append(s.blocks, b)
	}
	return true
}

// account schedules n tokens of s in this pass: cost terms, and caching of
// the blocks they fill.
func (m *Model) account(s *seq, n int, st *PassStats) {
	decode := s.generated > 0 && n == 1 && s.computed == s.ntok()-1
	if decode {
		st.DecodeSeqs++
		st.DecodeContext += s.ntok()
		st.DecodeTopK += m.p.DecodeTopK(s.ntok())
	} else {
		all, topK := m.p.PrefillPairs(s.computed, n)
		st.PrefillTokens += n
		st.PrefillAttended += all
		st.PrefillTopK += topK
		s.usage.ComputedTokens += n
	}
	before := s.computed >> m.bsShift
	s.computed += n
	for i := before; i < s.computed>>m.bsShift; i++ {
		var parent kv.BlockHash
		if i > 0 {
			parent = s.chain[i-1]
		}
		m.commitBlock(s.blocks[i], s.chain[i], parent, i)
	}
	m.sched = append(m.sched, s)
}

// passTime is the modelled duration of the scheduled pass (see Profile).
func (m *Model) passTime(st *PassStats) time.Duration {
	p := &m.p
	base := 0.0
	if st.PrefillTokens > 0 {
		base = p.Prefill.BaseMs * 1e-3
	}
	if st.DecodeSeqs > 0 {
		// The experts read are those of every token in the pass.
		base = max(base, p.DecodeBaseSec(st.DecodeSeqs+st.PrefillTokens))
	}
	t := base +
		p.PrefillTokenSec(st.PrefillTokens) +
		p.PrefillAttentionSec(st.PrefillAttended, st.PrefillTopK) +
		p.Decode.PerSeqUs*1e-6*float64(st.DecodeSeqs) +
		p.DecodeReadSec(float64(st.DecodeContext), float64(st.DecodeTopK)) +
		float64(st.HostLoadBlocks+st.OffloadBlocks)*p.BlockBytes()/(p.HostGBps*1e9)
	return seconds(t)
}

// sample appends one output token to s at time end and finishes it when done.
// With Config.NoTokenStream the token is only counted: its id is drawn
// when the tokens are read (materialize), at the block's end, so that a
// pass does not write to every sequence's output.
func (m *Model) sample(s *seq, end time.Time) {
	idx := s.generated
	s.generated++
	if !m.cfg.NoTokenStream {
		tok := m.nextToken(s)
		s.out = append(s.out, tok)
		m.out.Tokens = append(m.out.Tokens, Token{ReqID: s.req.ID, ID: tok, Index: idx, Sampler: s.rng})
	}
	if s.ntok()&(m.bs-1) == 0 {
		m.materialize(s)
		s.extendChain(m.bs)
	}
	if idx == 0 {
		s.usage.FirstToken = end
	}
	m.counters.GenerationTokens++
	m.out.Sampled++

	switch {
	case s.req.RemoteDecode:
		m.materialize(s)
		s.state = stHeld
		s.holdUntil = end.Add(m.cfg.HoldTimeout)
		m.held = append(m.held, s)
		s.usage.Finish = end
		m.counters.PromptTokens += uint64(s.usage.PromptTokens)
		nb := min(len(s.chain), len(s.req.Tokens)/m.bs)
		s.heldBlocks = nb
		m.out.Finished = append(m.out.Finished, Finished{
			ReqID: s.req.ID, Reason: FinishRemoteDecode, Usage: s.report(), Blocks: s.chain[:nb:nb],
		})
	case s.generated >= s.limit() || s.ntok() >= m.p.MaxModelLen:
		m.materialize(s)
		s.state = stDone
		s.usage.Finish = end
		m.counters.PromptTokens += uint64(s.usage.PromptTokens)
		m.freeSeq(s)
		delete(m.byID, s.req.ID)
		reason := FinishLength
		if s.generated < s.req.MaxTokens && s.generated >= s.limit() {
			reason = FinishStop
		}
		m.out.Finished = append(m.out.Finished, Finished{ReqID: s.req.ID, Reason: reason, Usage: s.report(), Output: s.out[:len(s.out):len(s.out)]})
	}
}

// limit is the output the sequence writes at most: to its StopAt, or its
// MaxTokens.
func (s *seq) limit() int {
	if s.req.StopAt > 0 && s.req.StopAt < s.req.MaxTokens {
		return s.req.StopAt
	}
	return s.req.MaxTokens
}

// ntok is the sequence's length: prompt and output.
func (s *seq) ntok() int { return len(s.req.Tokens) + s.generated }

// materialize draws the ids of the tokens s sampled but has not written to
// its output yet (see sample), in order, advancing its sampler.
func (m *Model) materialize(s *seq) {
	n := len(s.out)
	if n >= s.generated {
		return
	}
	if cap(s.out) < s.generated {
		// Room for the whole output at once: it runs to its limit, and
		// growing a long answer by doubling would copy it over and over.
		total := max(s.generated, min(s.limit(), m.p.MaxModelLen-len(s.req.Tokens)))
		s.out = slices.Grow(s.out, total-n)
	}
	s.out = s.out[:s.generated]
	for i := n; i < s.generated; i++ {
		s.out[i] = m.nextToken(s)
	}
}

// extendChain hashes the full blocks of the tokens that the chain lacks;
// a block may straddle the prompt and the output.
func (s *seq) extendChain(bs int) {
	p := len(s.req.Tokens)
	var buf []uint32
	for i, n := len(s.chain), s.ntok()/bs; i < n; i++ {
		lo, hi := i*bs, (i+1)*bs
		var blk []uint32
		switch {
		case hi <= p:
			blk = s.req.Tokens[lo:hi]
		case lo >= p:
			blk = s.out[lo-p : hi-p]
		default:
			buf = append(append(buf[:0], s.req.Tokens[lo:]...), s.out[:hi-p]...)
			blk = buf
		}
		var parent kv.BlockHash
		if i > 0 {
			parent = s.chain[i-1]
		}
		s.chain = append(s.chain, kv.NextHash(parent, i > 0, blk))
	}
}

// nextToken draws s's next output token: a word of the tokenizer's output
// vocabulary, or a period now and then.
func (m *Model) nextToken(s *seq) uint32 {
	s.rng ^= s.rng << 13
	s.rng ^= s.rng >> 7
	s.rng ^= s.rng << 17
	if s.rng%12 == 0 {
		return tokenizer.Period
	}
	return tokenizer.Word(int(s.rng >> 40))
}

// preempt frees a running sequence's KV and requeues it at the front of the
// waiting queue; it will recompute (cached blocks may still hit).
func (m *Model) preempt(s *seq) {
	m.freeSeq(s)
	s.state = stWaiting
	s.usage.Preemptions++
	m.counters.Preemptions++
	m.waiting = append(m.waiting, nil)
	copy(m.waiting[1:], m.waiting)
	m.waiting[0] = s
	s.ahead = true
}

// queueAhead puts s in the waiting queue ahead of new arrivals, behind
// the sequences already waiting ahead of them (preempted ones, answers
// that continue here).
func (m *Model) queueAhead(s *seq) {
	i := 0
	for i < len(m.waiting) && m.waiting[i].ahead {
		i++
	}
	m.waiting = append(m.waiting, nil)
	copy(m.waiting[i+1:], m.waiting[i:])
	m.waiting[i] = s
	s.ahead = true
}

func (m *Model) expireHolds(now time.Time) {
	for i := 0; i < len(m.held); {
		s := m.held[i]
		if now.Before(s.holdUntil) {
			i++
			continue
		}
		m.held = removeSeq(m.held, s)
		m.freeSeq(s)
		delete(m.byID, s.req.ID)
	}
}

func (m *Model) fillQueueStats(st *PassStats) {
	st.Waiting = len(m.waiting)
	st.Running = len(m.running)
	st.Held = len(m.held)
	st.GPUBlocksUsed = m.gpuUsed - m.gpuPolicy.Len()
	st.GPUBlocksCached = m.gpuUsed
	st.GPUBlocks = m.cfg.GPUBlocks
	st.HostBlocksUsed = m.hostByHash.Len()
	st.HostBlocks = m.cfg.HostBlocks
}

// prefetchBatch is how many blocks ahead a walk over a sequence's blocks
// fetches what it will touch (the GPU index's slots and the blocks on
// admission, the blocks on release): such a walk is bound by memory
// latency otherwise.
const prefetchBatch = 32
