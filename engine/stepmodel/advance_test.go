package stepmodel

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/evolvellm/evolve/kv"
)

type arrival struct {
	at time.Time
	r  Request
}

// mixedArrivals is a small agent-like workload: shared prefixes, short and
// long outputs, arrivals while others decode.
func mixedArrivals() []arrival {
	var out []arrival
	shared := prompt(200, 500)
	for i := 0; i < 40; i++ {
		tokens := append(append([]uint32(nil), shared...), prompt(30+i*7%90, uint32(600+i))...)
		out = append(out, arrival{
			at: t0.Add(time.Duration(i*i%37) * 40 * time.Millisecond).Add(time.Duration(i) * 90 * time.Millisecond),
			r:  Request{ID: fmt.Sprint("r", i), Tokens: tokens, MaxTokens: 5 + (i*53)%300},
		})
	}
	slices.SortStableFunc(out, func(a, b arrival) int { return a.at.Compare(b.at) })
	return out
}

func byStep(t *testing.T, m *Model, arr []arrival) map[string]Finished {
	got := map[string]Finished{}
	stepThrough(t, m, arr, nil, func(_ time.Duration, out Output) {
		for _, f := range out.Finished {
			got[f.ReqID] = f
		}
	})
	return got
}

// stepThrough steps m until arr is submitted and nothing runs, submitting
// each arrival when its time comes. before, if not nil, runs ahead of each
// pass with its start; after sees each Step's result, idle ones included.
func stepThrough(t *testing.T, m *Model, arr []arrival, before func(start time.Time, submitted int), after func(time.Duration, Output)) {
	t.Helper()
	now, i := t0, 0
	for guard := 0; guard < 1_000_000; guard++ {
		start := now
		if start.Before(m.busyUntil) {
			start = m.busyUntil
		}
		for i < len(arr) && !arr[i].at.After(start) {
			submit(t, m, arr[i].at, arr[i].r)
			i++
		}
		if before != nil {
			before(start, i)
		}
		d, out := m.Step(start)
		after(d, out)
		if out.Idle {
			if i == len(arr) {
				return
			}
			now = arr[i].at
			continue
		}
		now = start.Add(d)
	}
	t.Fatal("step loop did not end")
}

func byAdvance(t *testing.T, m *Model, arr []arrival) (map[string]Finished, int) {
	got := map[string]Finished{}
	far := t0.Add(1000 * time.Hour)
	now, i, bulk := t0, 0, 0
	for guard := 0; guard < 1_000_000; guard++ {
		until := far
		if i < len(arr) {
			until = arr[i].at
		}
		ao := m.Advance(now, until)
		bulk += len(ao.Passes)
		for _, f := range ao.Finished {
			got[f.ReqID] = f
		}
		now = ao.End
		if ao.Idle && i < len(arr) && now.Before(arr[i].at) {
			now = arr[i].at
		}
		if ao.Idle && i == len(arr) {
			return got, bulk
		}
		start := now
		if start.Before(m.busyUntil) {
			start = m.busyUntil
		}
		for i < len(arr) && !arr[i].at.After(start) {
			submit(t, m, arr[i].at, arr[i].r)
			i++
		}
	}
	t.Fatal("advance loop did not end")
	return nil, 0
}

func TestAdvanceMatchesStepLoop(t *testing.T) {
	for _, tc := range []struct {
		gpuBlocks int
		sparse    bool
	}{
		{0, false}, {120, false}, // roomy, and tight enough to preempt
		{0, true}, // sparse attention: contexts cross top_k inside bulk runs
	} {
		gpuBlocks := tc.gpuBlocks
		t.Run(fmt.Sprintf("gpu%d,sparse=%t", gpuBlocks, tc.sparse), func(t *testing.T) {
			p := tinyProfile(t)
			if tc.sparse {
				p.Sparse = SparseAttention{TopK: 256, SelectedKVBytesPerToken: p.KVBytesPerToken * 3 / 4, IndexerPairCost: 0.1}
			}
			a, b := NewModel(p, Config{GPUBlocks: gpuBlocks}), NewModel(p, Config{GPUBlocks: gpuBlocks})
			arr := mixedArrivals()
			want := byStep(t, a, arr)
			got, _ := byAdvance(t, b, arr)
			if b.bulkPasses == 0 {
				t.Fatal("the bulk path never ran: the test compares nothing")
			}
			if len(want) != len(arr) || len(got) != len(arr) {
				t.Fatalf("finished: step %d, advance %d, of %d", len(want), len(got), len(arr))
			}
			for id, w := range want {
				g := got[id]
				if g.Reason != w.Reason || !slices.Equal(g.Output, w.Output) || fmt.Sprint(g.Usage) != fmt.Sprint(w.Usage) {
					t.Fatalf("%s differs:\nstep    %+v\nadvance %+v", id, w.Usage, g.Usage)
				}
			}
			ca, cb := a.Counters(), b.Counters()
			if ca.GenerationTokens != cb.GenerationTokens || ca.Passes != cb.Passes || ca.BusyTime != cb.BusyTime || ca.PrefixHits != cb.PrefixHits {
				t.Fatalf("counters differ:\nstep    %+v\nadvance %+v", ca, cb)
			}
			for _, x := range arr {
				c := kvChain(p, x.r.Tokens)
				if ga, la := a.Lookup(c); true {
					if gb, lb := b.Lookup(c); ga != gb || la != lb {
						t.Fatalf("%s: cache differs: step %d/%d, advance %d/%d", x.r.ID, ga, la, gb, lb)
					}
				}
			}
		})
	}
}

// Advance must actually take the bulk path on a steady decode, or the
// benchmark figure means nothing.
func TestAdvanceBulkPathRuns(t *testing.T) {
	p := tinyProfile(t)
	m := NewModel(p, Config{})
	for i := 0; i < 8; i++ {
		submit(t, m, t0, Request{ID: fmt.Sprint(i), Tokens: prompt(100, uint32(i)), MaxTokens: 800})
	}
	now := t0
	for i := 0; i < 3; i++ { // prefill, then decode begins
		d, _ := m.Step(now)
		now = now.Add(d)
	}
	if k := m.steadySpan(now, now.Add(time.Hour)); k < 780 {
		t.Fatalf("steady span %d passes, want nearly the 800 tokens", k)
	}
	ao := m.Advance(now, now.Add(time.Hour))
	if len(ao.Finished) != 8 || ao.Tokens < 8*790 {
		t.Fatalf("advance: %d finished, %d tokens", len(ao.Finished), ao.Tokens)
	}
}

func kvChain(p *Profile, tokens []uint32) []kv.BlockHash { return kv.ChainHashes(tokens, p.BlockSize) }
