package stepmodel

import (
	"slices"
	"time"

	"github.com/evolvellm/evolve/kv"
)

// Pass is one forward pass as reported by Advance.
type Pass struct {
	Start    time.Time
	Duration time.Duration
	Stats    PassStats
}

// AdvanceOutput is what Advance produced. Its slices belong to the model and
// are valid until the next call of any Model method.
type AdvanceOutput struct {
	End      time.Time // when the last pass ends (the start time if none ran)
	Idle     bool      // stopped because nothing could run
	Tokens   int       // output tokens produced
	Passes   []Pass
	Finished []Finished
	Events   []kv.Event
}

// Advance runs passes from now, one after another, until a pass finishes a
// request, until the next pass would start at or after until, or until
// nothing can run. It is Step in a loop, with the same results (requests,
// tokens, times, cache contents), except that runs of steady decode passes
// (no queue, every sequence decoding, free KV for the whole run) are
// computed in bulk, which is what lets the simulator run hours of traffic on
// many engines in seconds. Inside such a run, KV events come grouped by
// sequence rather than by pass, and each pass's KV usage figures are those
// at the run's start.
func (m *Model) Advance(now, until time.Time) AdvanceOutput {
	ao := AdvanceOutput{Passes: m.advPasses[:0], Finished: m.advFinished[:0], Events: m.advEvents[:0]}
	for {
		if now.Before(m.busyUntil) {
			now = m.busyUntil
		}
		if !now.Before(until) {
			break
		}
		if k := m.steadySpan(now, until); k >= 2 {
			now = m.bulkDecode(now, until, k, &ao)
			continue
		}
		d, out := m.Step(now)
		ao.Events = append(ao.Events, out.Events...)
		if out.Idle {
			ao.Idle = true
			break
		}
		ao.Tokens += out.Sampled
		ao.Passes = append(ao.Passes, Pass{Start: out.Start, Duration: d, Stats: out.Stats})
		ao.Finished = append(ao.Finished, out.Finished...)
		now = out.Start.Add(d)
		if len(out.Finished) > 0 {
			break
		}
	}
	ao.End = now
	m.advPasses, m.advFinished, m.advEvents = ao.Passes, ao.Finished, ao.Events
	return ao
}

// steadySpan returns how many passes from now can be computed in bulk: every
// running sequence decodes one token per pass, nothing waits, no request
// finishes (the finishing pass is left to Step), no timed event (transfer,
// fetch, hold expiry) falls inside, and free GPU blocks cover the growth
// without evicting. 0 means step normally.
func (m *Model) steadySpan(now, until time.Time) int {
	b := len(m.running)
	if b == 0 || len(m.waiting) > 0 || b > m.cfg.MaxNumBatchedTokens {
		return 0
	}
	if len(m.fetches) > 0 || len(m.held) > 0 {
		if t, ok := m.NextWake(now.Add(-1)); ok && t.Before(until) {
			return 0 // keep it simple: a timed event is near, step normally
		}
	}
	k := int(^uint(0) >> 1)
	for _, s := range m.running {
		if s.generated == 0 || s.computed != s.ntok()-1 {
			return 0
		}
		left := min(s.limit()-s.generated, m.p.MaxModelLen-s.ntok())
		k = min(k, left-1)
	}
	if k < 2 {
		return 0
	}
	free := m.cfg.GPUBlocks - m.gpuUsed
	// Cheap bound first: each sequence needs at most k/bs+1 new blocks.
	if b*(k/m.bs+1) <= free {
		return k
	}
	for k >= 2 && m.blocksFor(k) > free {
		k /= 2
	}
	return k
}

// blocksFor is how many new GPU blocks the running sequences need for k more
// decode passes.
func (m *Model) blocksFor(k int) int {
	n := 0
	for _, s := range m.running {
		n += (s.computed+k+m.bs-1)>>m.bsShift - len(s.blocks)
	}
	return n
}

// bulkDecode runs up to k steady decode passes starting at now, stopping
// before a pass that would start at or after until, and returns the end of
// the last.
func (m *Model) bulkDecode(now, until time.Time, k int, ao *AdvanceOutput) time.Time {
	if m.delivered {
		m.out.Events = m.out.Events[:0]
		m.delivered = false
	}
	b := len(m.running)
	ctx := 0
	for _, s := range m.running {
		ctx += s.ntok()
	}
	var base PassStats
	m.fillQueueStats(&base)
	topK := m.newTopKSum(ctx)
	passes := 0
	for passes < k && now.Before(until) {
		st := base
		st.DecodeSeqs, st.DecodeContext = b, ctx+passes*b
		st.DecodeTopK = topK.at(passes)
		d := m.passTime(&st)
		ao.Passes = append(ao.Passes, Pass{Start: now, Duration: d, Stats: st})
		m.counters.Passes++
		m.counters.BusyTime += d
		now = now.Add(d)
		passes++
	}
	sh, bs := m.bsShift, m.bs
	for _, s := range m.running {
		s.generated += passes
		if !m.cfg.NoTokenStream {
			m.materialize(s)
		}
		before := s.computed >> sh
		s.computed += passes
		after := s.computed >> sh
		if (s.computed+bs-1)>>sh > len(s.blocks) {
			if !m.ensureBlocks(s, s.computed) {
				panic("sim: steady span ran out of the free blocks it counted")
			}
		}
		if s.ntok()>>sh > len(s.chain) {
			m.materialize(s)
			s.extendChain(bs)
		}
		for i := before; i < after; i++ {
			var parent kv.BlockHash
			if i > 0 {
				parent = s.chain[i-1]
			}
			m.commitBlock(s.blocks[i], s.chain[i], parent, i)
		}
	}
	m.counters.GenerationTokens += uint64(passes * b)
	m.bulkPasses += passes
	ao.Tokens += passes * b
	m.busyUntil = now
	ao.Events = append(ao.Events, m.out.Events...)
	m.delivered = true
	return now
}

// topKSum gives, for the running sequences, the sum over them of
// min(context, top_k) after j more decode passes (Profile.DecodeTopK), in
// amortised constant time per pass when j only grows.
type topKSum struct {
	k     int
	b     int   // sequences
	below []int // contexts under top_k, ascending
	n     int   // of those, how many are still under it at the last j
	sum   int   // their sum
}

// newTopKSum starts a topKSum over the running sequences, whose contexts
// add up to ctx.
func (m *Model) newTopKSum(ctx int) topKSum {
	t := topKSum{k: m.p.Sparse.TopK, b: len(m.running)}
	if t.k <= 0 {
		t.sum = ctx // dense: every context token is read
		return t
	}
	t.below = m.topKScratch[:0]
	for _, s := range m.running {
		if c := s.ntok(); c < t.k {
			t.below = append(t.below, c)
			t.sum += c
		}
	}
	slices.Sort(t.below)
	t.n = len(t.below)
	m.topKScratch = t.below
	return t
}

// at is the sum after j passes; j must not decrease from one call to the
// next.
func (t *topKSum) at(j int) int {
	if t.k <= 0 {
		return t.sum + j*t.b
	}
	for t.n > 0 && t.below[t.n-1]+j >= t.k {
		t.n--
		t.sum -= t.below[t.n]
	}
	return t.sum + j*t.n + (t.b-t.n)*t.k
}
