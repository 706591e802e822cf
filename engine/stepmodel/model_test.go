package stepmodel

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/evolvellm/evolve/kv"
	"github.com/evolvellm/evolve/roles"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func tinyProfile(t testing.TB) *Profile {
	t.Helper()
	p, err := BuiltinProfile("tiny")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func prompt(n int, salt uint32) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = salt*100003 + uint32(i)
	}
	return out
}

// run steps the model until nothing is in flight (or limit passes) and
// returns the time it ended and every finished request by id.
type result struct {
	end      time.Time
	finished map[string]Finished
	tokens   map[string]int
	events   []kv.Event
	passes   []Output
}

func run(t testing.TB, m *Model, now time.Time, limit int) result {
	t.Helper()
	res := result{finished: map[string]Finished{}, tokens: map[string]int{}}
	for i := 0; i < limit; i++ {
		d, out := m.Step(now)
		res.events = append(res.events, out.Events...)
		for _, f := range out.Finished {
			res.finished[f.ReqID] = f
		}
		for _, tok := range out.Tokens {
			res.tokens[tok.ReqID]++
		}
		if !out.Idle {
			o := out
			o.Tokens, o.Finished, o.Events = nil, nil, nil
			res.passes = append(res.passes, o)
			now = out.Start.Add(d)
			continue
		}
		next, ok := m.NextWake(now)
		if !ok || len(m.waiting)+len(m.running) == 0 {
			res.end = now
			return res
		}
		now = next
	}
	t.Fatalf("model did not settle in %d passes (waiting %d running %d held %d)", limit, len(m.waiting), len(m.running), len(m.held))
	return res
}

func submit(t testing.TB, m *Model, now time.Time, r Request) {
	t.Helper()
	if err := m.Submit(now, r); err != nil {
		t.Fatalf("submit %s: %v", r.ID, err)
	}
}

func ttft(f Finished) time.Duration { return f.Usage.FirstToken.Sub(f.Usage.Arrival) }

func TestCachedPrefixShortensPrefill(t *testing.T) {
	p := tinyProfile(t)
	shared := prompt(768, 1)
	second := append(append([]uint32(nil), shared...), prompt(40, 2)...)

	warm := NewModel(p, Config{})
	submit(t, warm, t0, Request{ID: "a", Tokens: shared, MaxTokens: 4})
	r := run(t, warm, t0, 1000)
	submit(t, warm, r.end, Request{ID: "b", Tokens: second, MaxTokens: 4})
	hot := run(t, warm, r.end, 1000).finished["b"]

	cold := NewModel(p, Config{})
	submit(t, cold, t0, Request{ID: "b", Tokens: second, MaxTokens: 4})
	fresh := run(t, cold, t0, 1000).finished["b"]

	if hot.Usage.GPUHitTokens != 768 {
		t.Fatalf("GPU hit %d tokens, want 768", hot.Usage.GPUHitTokens)
	}
	if hot.Usage.ComputedTokens != len(second)-768 {
		t.Fatalf("computed %d tokens, want %d", hot.Usage.ComputedTokens, len(second)-768)
	}
	if fresh.Usage.CachedTokens() != 0 || fresh.Usage.ComputedTokens != len(second) {
		t.Fatalf("cold engine reported a hit: %+v", fresh.Usage)
	}
	if !(ttft(hot) < ttft(fresh)/3) {
		t.Fatalf("cached TTFT %v not well under cold TTFT %v", ttft(hot), ttft(fresh))
	}
}

// prefillTime is the TTFT of a 32-block prompt whose first 31 blocks are
// placed by setup.
func prefillTime(t *testing.T, setup func(m *Model, chain []kv.BlockHash) time.Time) (time.Duration, Usage) {
	p := tinyProfile(t)
	m := NewModel(p, Config{})
	tokens := prompt(512, 7)
	chain := kv.ChainHashes(tokens, p.BlockSize)
	now := setup(m, chain[:31])
	submit(t, m, now, Request{ID: "x", Tokens: tokens, MaxTokens: 1})
	f := run(t, m, now, 1000).finished["x"]
	return ttft(f), f.Usage
}

func TestHostHitCostsBetweenGPUHitAndRecompute(t *testing.T) {
	gpu, ug := prefillTime(t, func(m *Model, chain []kv.BlockHash) time.Time {
		submit(t, m, t0, Request{ID: "warm", Tokens: prompt(496, 7), MaxTokens: 1})
		return run(t, m, t0, 100).end
	})
	host, uh := prefillTime(t, func(m *Model, chain []kv.BlockHash) time.Time {
		ready, n := m.Fetch(t0, chain, 0, 0)
		if n != 31 {
			t.Fatalf("fetch moves %d blocks, want 31", n)
		}
		m.Step(ready) // lands the fetch
		if g, l := m.Lookup(chain); g != 0 || l != 31 {
			t.Fatalf("after fetch: %d on GPU, %d local", g, l)
		}
		return ready
	})
	miss, um := prefillTime(t, func(m *Model, chain []kv.BlockHash) time.Time { return t0 })

	if ug.GPUHitTokens != 496 || uh.HostHitTokens != 496 || um.CachedTokens() != 0 {
		t.Fatalf("hits: gpu %+v host %+v miss %+v", ug, uh, um)
	}
	if !(gpu < host && host < miss) {
		t.Fatalf("want GPU hit %v < host hit %v < recompute %v", gpu, host, miss)
	}
}

func TestDecodePassGrowsWithBatchAndContext(t *testing.T) {
	decodePass := func(batch, ctx int) time.Duration {
		p := tinyProfile(t)
		m := NewModel(p, Config{})
		for i := 0; i < batch; i++ {
			submit(t, m, t0, Request{ID: fmt.Sprint(i), Tokens: prompt(ctx, uint32(i+1)), MaxTokens: 100})
		}
		now := t0
		for i := 0; i < 200; i++ {
			d, out := m.Step(now)
			now = now.Add(d)
			if out.Stats.DecodeSeqs == batch && out.Stats.PrefillTokens == 0 {
				return d
			}
		}
		t.Fatalf("no pure decode pass for batch %d ctx %d", batch, ctx)
		return 0
	}
	for i, tc := range []struct{ b1, c1, b2, c2 int }{
		{1, 64, 8, 64},    // batch grows
		{8, 64, 8, 512},   // context grows
		{4, 256, 16, 256}, // batch grows at longer context
		{16, 64, 16, 400}, // context grows at larger batch
	} {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			a, b := decodePass(tc.b1, tc.c1), decodePass(tc.b2, tc.c2)
			if !(b > a) {
				t.Errorf("decode pass batch %d ctx %d = %v, batch %d ctx %d = %v: want growth", tc.b1, tc.c1, a, tc.b2, tc.c2, b)
			}
		})
	}
}

func TestPrefillPassGrowsWithTokensAndContext(t *testing.T) {
	p := tinyProfile(t)
	m := NewModel(p, Config{})
	short := m.passTime(&PassStats{PrefillTokens: 256, PrefillAttended: 256 * 128})
	more := m.passTime(&PassStats{PrefillTokens: 512, PrefillAttended: 512 * 256})
	deeper := m.passTime(&PassStats{PrefillTokens: 256, PrefillAttended: 256 * 4000})
	if !(more > short && deeper > short) {
		t.Fatalf("prefill pass: 256 tok %v, 512 tok %v, 256 tok deep %v", short, more, deeper)
	}
}

func TestChunkedPrefillSplitsLongPrompt(t *testing.T) {
	p := tinyProfile(t) // 1024-token budget
	m := NewModel(p, Config{})
	submit(t, m, t0, Request{ID: "long", Tokens: prompt(3000, 3), MaxTokens: 2})
	r := run(t, m, t0, 100)
	if r.passes[0].Stats.PrefillTokens != 1024 || r.passes[2].Stats.PrefillTokens != 3000-2048 {
		t.Fatalf("chunks %d, %d, %d", r.passes[0].Stats.PrefillTokens, r.passes[1].Stats.PrefillTokens, r.passes[2].Stats.PrefillTokens)
	}
	if r.tokens["long"] != 2 {
		t.Fatalf("%d tokens out", r.tokens["long"])
	}
}

func TestGPUPressureOffloadsToHost(t *testing.T) {
	p := tinyProfile(t)
	m := NewModel(p, Config{GPUBlocks: 64})
	now := t0
	for i := 0; i < 4; i++ { // 4 x 32 blocks through a 64-block GPU
		submit(t, m, now, Request{ID: fmt.Sprint(i), Tokens: prompt(512, uint32(10+i)), MaxTokens: 1})
		now = run(t, m, now, 100).end
	}
	first := kv.ChainHashes(prompt(512, 10), p.BlockSize)
	g, l := m.Lookup(first)
	if g != 0 || l != 32 {
		t.Fatalf("first prompt: %d blocks on GPU, %d local; want 0 and 32 (offloaded)", g, l)
	}
	if c := m.Counters(); c.OffloadedBlocks < 64 {
		t.Fatalf("offloaded %d blocks", c.OffloadedBlocks)
	}
	submit(t, m, now, Request{ID: "again", Tokens: prompt(512, 10), MaxTokens: 1})
	f := run(t, m, now, 100).finished["again"]
	if f.Usage.HostHitTokens != 496 {
		t.Fatalf("reload: %+v", f.Usage)
	}
}

func TestHostEvictionDropsAndEmitsEvents(t *testing.T) {
	p := tinyProfile(t)
	m := NewModel(p, Config{GPUBlocks: 32, HostBlocks: 40})
	now := t0
	var events []kv.Event
	for i := 0; i < 4; i++ {
		submit(t, m, now, Request{ID: fmt.Sprint(i), Tokens: prompt(496, uint32(20+i)), MaxTokens: 1})
		r := run(t, m, now, 100)
		now, events = r.end, append(events, r.events...)
	}
	counts := map[string]int{}
	for i, e := range events {
		if i > 0 && e.Seq != events[i-1].Seq+1 {
			t.Fatalf("event sequence gap at %d: %d after %d", i, e.Seq, events[i-1].Seq)
		}
		counts[e.Kind.String()+"/"+e.Tier.String()]++
	}
	if counts["BlockRemoved/host"] == 0 || counts["BlockStored/host"] == 0 || counts["BlockRemoved/gpu"] == 0 {
		t.Fatalf("events %v", counts)
	}
	if _, out := m.Step(now); out.Stats.HostBlocksUsed > 40 {
		t.Fatalf("host over capacity: %d", out.Stats.HostBlocksUsed)
	}
}

func TestPreemptionRecomputesAndFinishesAll(t *testing.T) {
	p := tinyProfile(t)
	m := NewModel(p, Config{GPUBlocks: 48, HostBlocks: 1})
	for i := 0; i < 6; i++ { // 6 x (8 + up to 10) blocks > 48
		submit(t, m, t0, Request{ID: fmt.Sprint(i), Tokens: prompt(128, uint32(30+i)), MaxTokens: 150})
	}
	r := run(t, m, t0, 10000)
	if len(r.finished) != 6 {
		t.Fatalf("%d of 6 finished", len(r.finished))
	}
	pre, recomputed := 0, 0
	for _, f := range r.finished {
		pre += f.Usage.Preemptions
		if f.Usage.ComputedTokens > 128 {
			recomputed++
		}
		if f.Usage.CompletionTokens != 150 {
			t.Fatalf("%s: %d tokens", f.ReqID, f.Usage.CompletionTokens)
		}
	}
	if pre == 0 || recomputed == 0 {
		t.Fatalf("preemptions %d, recomputed requests %d", pre, recomputed)
	}
}

func TestRoleChangeNeverDropsARequest(t *testing.T) {
	p := tinyProfile(t)
	m := NewModel(p, Config{})
	for i := 0; i < 5; i++ {
		submit(t, m, t0, Request{ID: fmt.Sprint(i), Tokens: prompt(600, uint32(40+i)), MaxTokens: 20})
	}
	submit(t, m, t0, Request{ID: "leg", Tokens: prompt(300, 50), MaxTokens: 1, RemoteDecode: true})
	now := t0
	for i := 0; i < 3; i++ {
		d, _ := m.Step(now)
		now = now.Add(d)
	}
	m.SetRole(roles.Decode) // in flight: prefills and a remote-decode leg
	if err := m.Submit(now, Request{ID: "new-leg", Tokens: prompt(64, 51), MaxTokens: 1, RemoteDecode: true}); !errors.Is(err, ErrWrongRole) {
		t.Fatalf("decode engine took a prefill leg: %v", err)
	}
	r := run(t, m, now, 1000)
	for i := 0; i < 5; i++ {
		if f, ok := r.finished[fmt.Sprint(i)]; !ok || f.Usage.CompletionTokens != 20 {
			t.Fatalf("request %d lost after role change", i)
		}
	}
	if r.finished["leg"].Reason != FinishRemoteDecode {
		t.Fatalf("leg: %+v", r.finished["leg"])
	}
	m.SetRole(roles.Prefill)
	if err := m.Submit(now, Request{ID: "d", Tokens: prompt(64, 52), MaxTokens: 1, Remote: &RemoteKV{}}); !errors.Is(err, ErrWrongRole) {
		t.Fatalf("prefill engine took a decode leg: %v", err)
	}
	m.SetDraining(true)
	if err := m.Submit(now, Request{ID: "e", Tokens: prompt(64, 53), MaxTokens: 1}); !errors.Is(err, ErrDraining) {
		t.Fatalf("draining engine took a request: %v", err)
	}
}

func TestDisaggregatedPrefillThenDecodeByTransfer(t *testing.T) {
	p := tinyProfile(t)
	pre, dec := NewModel(p, Config{}), NewModel(p, Config{})
	tokens := prompt(1000, 60) // 62 full blocks + 8 tokens
	submit(t, pre, t0, Request{ID: "r", Tokens: tokens, MaxTokens: 1, RemoteDecode: true})
	r := run(t, pre, t0, 100)
	f := r.finished["r"]
	if f.Reason != FinishRemoteDecode || len(f.Blocks) != 62 {
		t.Fatalf("prefill leg: reason %q, %d blocks", f.Reason, len(f.Blocks))
	}
	if _, out := pre.Step(r.end); out.Stats.Held != 1 || out.Stats.GPUBlocksUsed < 62 {
		t.Fatalf("prefill engine does not hold the KV: %+v", out.Stats)
	}
	chain, ok := pre.Release("r")
	if !ok || len(chain) != 62 {
		t.Fatalf("release: %v %d", ok, len(chain))
	}
	if _, out := pre.Step(r.end); out.Stats.Held != 0 || out.Stats.GPUBlocksUsed != 0 {
		t.Fatalf("after release: %+v", out.Stats)
	}

	submit(t, dec, r.end, Request{ID: "r", Tokens: tokens, MaxTokens: 50, Remote: &RemoteKV{Blocks: chain}})
	d := run(t, dec, r.end, 1000).finished["r"]
	if d.Usage.TransferredTokens != 62*16 || d.Usage.ComputedTokens != 8 {
		t.Fatalf("decode leg recomputed: %+v", d.Usage)
	}
	if min := p.TransferTime(62, p.NetworkGBps); ttft(d) < min {
		t.Fatalf("decode leg's first token at %v, before the %v transfer", ttft(d), min)
	}
	if d.Usage.CompletionTokens != 50 {
		t.Fatalf("decode produced %d tokens", d.Usage.CompletionTokens)
	}
}

func TestHeldKVExpires(t *testing.T) {
	p := tinyProfile(t)
	m := NewModel(p, Config{HoldTimeout: time.Second})
	submit(t, m, t0, Request{ID: "r", Tokens: prompt(100, 70), MaxTokens: 1, RemoteDecode: true})
	r := run(t, m, t0, 100)
	next, ok := m.NextWake(r.end)
	if !ok || next.Sub(r.end) != time.Second {
		t.Fatalf("next wake %v %v", next.Sub(r.end), ok)
	}
	m.Step(next)
	if m.InFlight() != 0 {
		t.Fatal("hold did not expire")
	}
	if _, ok := m.Release("r"); ok {
		t.Fatal("released an expired hold")
	}
}

func TestAbortFreesKV(t *testing.T) {
	p := tinyProfile(t)
	m := NewModel(p, Config{})
	submit(t, m, t0, Request{ID: "r", Tokens: prompt(300, 80), MaxTokens: 1000})
	now := t0
	for i := 0; i < 5; i++ {
		d, _ := m.Step(now)
		now = now.Add(d)
	}
	if _, ok := m.Abort(now, "r"); !ok {
		t.Fatal("abort of a running request failed")
	}
	_, out := m.Step(now)
	if out.Stats.GPUBlocksUsed != 0 || out.Stats.Running != 0 || m.InFlight() != 0 {
		t.Fatalf("KV not freed: %+v", out.Stats)
	}
	if _, ok := m.Abort(now, "r"); ok {
		t.Fatal("second abort succeeded")
	}
}

func TestEvictionHintsOrderVictims(t *testing.T) {
	p := tinyProfile(t)
	m := NewModel(p, Config{GPUBlocks: 64})
	a, b := prompt(496, 90), prompt(496, 91) // 31 blocks each
	submit(t, m, t0, Request{ID: "a", Tokens: a, MaxTokens: 1})
	now := run(t, m, t0, 100).end
	submit(t, m, now, Request{ID: "b", Tokens: b, MaxTokens: 1})
	now = run(t, m, now, 100).end
	// Plain LRU would evict a (older) first; a hint protects it and marks b.
	ca, cb := kv.ChainHashes(a, 16), kv.ChainHashes(b, 16)
	var hints []Hint
	for i := range ca {
		hints = append(hints, Hint{Hash: ca[i], Priority: 5}, Hint{Hash: cb[i], Priority: -5})
	}
	m.SetHints(hints)
	submit(t, m, now, Request{ID: "c", Tokens: prompt(496, 92), MaxTokens: 1})
	run(t, m, now, 100)
	if g, _ := m.Lookup(ca); g != 31 {
		t.Fatalf("hinted-up prefix lost GPU blocks: %d of 31 left", g)
	}
	if g, _ := m.Lookup(cb); g == 31 {
		t.Fatal("hinted-down prefix kept all its blocks")
	}
}

func TestLRUEvictsDeepestSuffixFirst(t *testing.T) {
	p := tinyProfile(t)
	m := NewModel(p, Config{GPUBlocks: 40})
	a := prompt(496, 93) // 31 blocks
	submit(t, m, t0, Request{ID: "a", Tokens: a, MaxTokens: 1})
	now := run(t, m, t0, 100).end
	submit(t, m, now, Request{ID: "b", Tokens: prompt(300, 94), MaxTokens: 1}) // needs 19: evicts ~10 of a
	run(t, m, now, 100)
	g, l := m.Lookup(kv.ChainHashes(a, 16))
	if g == 0 || g == 31 || l != 31 {
		t.Fatalf("a: %d blocks on GPU (want its head kept), %d local", g, l)
	}
}

func TestSubmitRejectsBadInput(t *testing.T) {
	p := tinyProfile(t)
	m := NewModel(p, Config{})
	for i, tc := range []struct {
		r    Request
		want error
	}{
		{Request{ID: "", Tokens: prompt(4, 1), MaxTokens: 1}, ErrInvalid},
		{Request{ID: "a", Tokens: nil, MaxTokens: 1}, ErrInvalid},
		{Request{ID: "a", Tokens: prompt(4, 1), MaxTokens: 0}, ErrInvalid},
		{Request{ID: "a", Tokens: prompt(8000, 1), MaxTokens: 500}, ErrTooLong},
	} {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			if err := m.Submit(t0, tc.r); !errors.Is(err, tc.want) {
				t.Errorf("%+v: got %v, want %v", tc.r.ID, err, tc.want)
			}
		})
	}
	submit(t, m, t0, Request{ID: "dup", Tokens: prompt(4, 1), MaxTokens: 1})
	if err := m.Submit(t0, Request{ID: "dup", Tokens: prompt(4, 1), MaxTokens: 1}); !errors.Is(err, ErrDuplicate) {
		t.Fatalf("duplicate: %v", err)
	}
}

func TestMaxNumSeqsLimitsBatch(t *testing.T) {
	p := tinyProfile(t)
	m := NewModel(p, Config{MaxNumSeqs: 3})
	for i := 0; i < 10; i++ {
		submit(t, m, t0, Request{ID: fmt.Sprint(i), Tokens: prompt(20, uint32(i)), MaxTokens: 5})
	}
	r := run(t, m, t0, 1000)
	for _, o := range r.passes {
		if o.Stats.Running > 3 {
			t.Fatalf("%d running", o.Stats.Running)
		}
	}
	if len(r.finished) != 10 {
		t.Fatalf("%d finished", len(r.finished))
	}
}

func TestStepIsDeterministic(t *testing.T) {
	p := tinyProfile(t)
	trace := func() []string {
		m := NewModel(p, Config{GPUBlocks: 100})
		for i := 0; i < 8; i++ {
			submit(t, m, t0, Request{ID: fmt.Sprint(i), Tokens: prompt(200+i*37, uint32(i%3)), MaxTokens: 30})
		}
		var log []string
		now := t0
		for i := 0; i < 500; i++ {
			d, out := m.Step(now)
			if out.Idle {
				break
			}
			for _, tok := range out.Tokens {
				log = append(log, fmt.Sprint(tok.ReqID, tok.ID, d))
			}
			now = now.Add(d)
		}
		return log
	}
	a, b := trace(), trace()
	if len(a) == 0 || fmt.Sprint(a) != fmt.Sprint(b) {
		t.Fatal("two identical runs differ")
	}
}

func TestBuiltinProfilesLoad(t *testing.T) {
	for _, name := range ProfileNames() {
		p, err := BuiltinProfile(name)
		if err != nil {
			t.Fatal(err)
		}
		if p.GPUBlocks() < 1 || p.HostBlocks() < 1 {
			t.Fatalf("%s: capacities %d %d", name, p.GPUBlocks(), p.HostBlocks())
		}
	}
	for _, want := range []string{"gb300-glm46", "gb300-kimi-k2", "tiny"} {
		if _, err := BuiltinProfile(want); err != nil {
			t.Fatalf("missing profile %s: %v", want, err)
		}
	}
	if _, err := BuiltinProfile("nope"); err == nil {
		t.Fatal("unknown profile loaded")
	}
	if _, err := ParseProfile([]byte("name: x\ngpus: 1\nbogus: 3\n")); err == nil {
		t.Fatal("unknown field accepted")
	}
}

// Sparse attention counts, per new token, the pairs within its top_k keys;
// chunks add up to the whole prompt, and dense attention counts them all.
func TestPrefillPairs(t *testing.T) {
	dense := &Profile{}
	sparse := &Profile{Sparse: SparseAttention{TopK: 1000}}
	for i, tc := range []struct {
		c, n          int
		all, topK     float64
		denseTopKSame bool
	}{
		{0, 800, 800 * 400, 800 * 400, true},                           // under top_k: the same
		{2000, 500, 500 * 2250, 500 * 1000, true},                      // past it: top_k each
		{600, 800, 800 * 1000, (1000*1000-600*600)/2 + 400*1000, true}, // across it
	} {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			all, topK := sparse.PrefillPairs(tc.c, tc.n)
			if all != tc.all || topK != tc.topK {
				t.Errorf("sparse PrefillPairs(%d, %d) = %v, %v; want %v, %v", tc.c, tc.n, all, topK, tc.all, tc.topK)
			}
			if a, k := dense.PrefillPairs(tc.c, tc.n); a != tc.all || k != a {
				t.Errorf("dense PrefillPairs(%d, %d) = %v, %v; want %v twice", tc.c, tc.n, a, k, tc.all)
			}
		})
	}
	// Chunked or whole, the same pairs.
	var sumAll, sumTopK float64
	for c := 0; c < 5000; c += 700 {
		a, k := sparse.PrefillPairs(c, min(700, 5000-c))
		sumAll, sumTopK = sumAll+a, sumTopK+k
	}
	if a, k := sparse.PrefillPairs(0, 5000); a != sumAll || k != sumTopK {
		t.Errorf("whole %v, %v; chunked %v, %v", a, k, sumAll, sumTopK)
	}
	if sparse.DecodeTopK(300) != 300 || sparse.DecodeTopK(5000) != 1000 || dense.DecodeTopK(5000) != 5000 {
		t.Error("DecodeTopK")
	}
}

// GLM-5's sparse attention makes long contexts cheap where Kimi K2's dense
// MLA pays for every pair, and costs the same as dense (plus the indexer)
// on short ones.
func TestGLM5SparseAttention(t *testing.T) {
	p, err := BuiltinProfile("gb300-glm5")
	if err != nil {
		t.Fatal(err)
	}
	if !p.IsSparse() {
		t.Fatal("gb300-glm5 is not sparse")
	}
	dense := *p
	dense.Sparse = SparseAttention{}
	prefill := func(p *Profile, tokens int) time.Duration {
		m := NewModel(p, Config{})
		submit(t, m, t0, Request{ID: "x", Tokens: prompt(tokens, 1), MaxTokens: 1})
		run(t, m, t0, 1000)
		return m.Counters().BusyTime
	}
	// 128K tokens: dense MLA would take about 8.7 s as for DeepSeek;
	// sparse attention pays its per-token work (27 us a token, 3.5 s) and
	// little for the pairs.
	s, d := prefill(p, 128*1024), prefill(&dense, 128*1024)
	if !(s < d*3/4) || s < 5500*time.Millisecond || s > 6200*time.Millisecond {
		t.Errorf("128K prefill: sparse %v, dense %v; want about 5.8 s and under three quarters", s, d)
	}
	// 1,500 tokens, all within top_k: dense plus the sparse path's
	// per-token work plus the indexer's share of the pairs.
	s, d = prefill(p, 1500), prefill(&dense, 1500)
	perTok := time.Duration(1500 * p.Sparse.PerTokenUs * float64(time.Microsecond))
	if s < d+perTok || s > d+perTok+d/50 {
		t.Errorf("1.5K prefill: sparse %v, dense %v; want dense + %v + at most 2%%", s, d, perTok)
	}
	// A decode step at 64K context reads top_k latents and every indexer
	// key: 3 ms of KV where dense MLA would read 15.7 ms.
	m := NewModel(p, Config{})
	st := PassStats{DecodeSeqs: 100, DecodeContext: 100 * 65536, DecodeTopK: 100 * 2048}
	itl := m.passTime(&st)
	md := NewModel(&dense, Config{})
	itlDense := md.passTime(&PassStats{DecodeSeqs: 100, DecodeContext: 100 * 65536, DecodeTopK: 100 * 65536})
	if itl < 22*time.Millisecond || itl > 24500*time.Microsecond || itlDense-itl < 12*time.Millisecond {
		t.Errorf("decode, 100 sequences at 64K: %v (dense %v), want about 23.2 ms and 12.7 ms less than dense", itl, itlDense)
	}
}

// A MoE step reads more experts as its batch grows: with 256 experts and
// top-8, the shares calibration.md cites.
func TestExpertShareGrowsWithTheBatch(t *testing.T) {
	p := &Profile{MoE: MoE{Experts: 256, ExpertsPerToken: 8}}
	for i, tc := range []struct {
		tokens int
		want   float64
	}{{8, 0.22}, {16, 0.40}, {32, 0.64}, {64, 0.87}} {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			if got := p.ExpertShare(tc.tokens); got < tc.want-0.01 || got > tc.want+0.01 {
				t.Errorf("ExpertShare(%d) = %.3f, want %.2f", tc.tokens, got, tc.want)
			}
		})
	}
	if (&Profile{}).ExpertShare(1) != 1 || p.ExpertShare(0) != 0 {
		t.Error("a dense model reads all its weights; no token reads no expert")
	}
	// The step pays it: a batch of 32 costs more than 32 x per_seq over one.
	glm, err := BuiltinProfile("gb300-glm5")
	if err != nil {
		t.Fatal(err)
	}
	one, many := glm.DecodeStepSec(1, 1024), glm.DecodeStepSec(32, 1024)
	perSeq := glm.Decode.PerSeqUs*1e-6 + glm.DecodeReadSec(1024, 1024)
	if extra := many - one - 31*perSeq; extra < 0.6*glm.Decode.ExpertReadMs*1e-3 {
		t.Errorf("32 sequences cost %.2f ms over one beyond their per-sequence work, want at least 60%% of expert_read_ms", extra*1e3)
	}
}

func TestSubmitUsesGivenChain(t *testing.T) {
	p := tinyProfile(t)
	tokens := prompt(200, 9)
	chain := kv.ChainHashes(tokens, p.BlockSize)
	a, b := NewModel(p, Config{}), NewModel(p, Config{})
	submit(t, a, t0, Request{ID: "x", Tokens: tokens, MaxTokens: 1})
	submit(t, b, t0, Request{ID: "x", Tokens: tokens, MaxTokens: 1, Chain: chain})
	run(t, a, t0, 100)
	run(t, b, t0, 100)
	if ga, _ := a.Lookup(chain); ga != len(chain) {
		t.Fatalf("hashed chain: %d of %d blocks cached", ga, len(chain))
	}
	if gb, _ := b.Lookup(chain); gb != len(chain) {
		t.Fatalf("given chain: %d of %d blocks cached", gb, len(chain))
	}
	chain[0] = 1 // the model kept its own copy
	if gb, _ := b.Lookup(kv.ChainHashes(tokens, p.BlockSize)); gb != len(chain) {
		t.Fatal("the model aliases the caller's chain")
	}
}

func TestWriteThroughCopiesEveryBlockToHost(t *testing.T) {
	p := tinyProfile(t)
	m := NewModel(p, Config{WriteThrough: true})
	tokens := prompt(320, 77)
	submit(t, m, t0, Request{ID: "w", Tokens: tokens, MaxTokens: 1})
	run(t, m, t0, 100)
	chain := kv.ChainHashes(tokens, p.BlockSize)
	if g, l := m.Lookup(chain); g != 20 || l != 20 || m.hostByHash.Len() != 20 {
		t.Fatalf("gpu %d local %d host %d, want all 20 blocks in both tiers", g, l, m.hostByHash.Len())
	}
}

// A decoding sequence migrates: the peer continues from the KV it pulls and
// the whole output is as long as asked.
func TestMigrateHandsADecodeToAPeer(t *testing.T) {
	p, _ := BuiltinProfile("tiny")
	a, b := NewModel(p, Config{}), NewModel(p, Config{})
	now := t0
	prompt := make([]uint32, 300)
	for i := range prompt {
		prompt[i] = uint32(600 + i%50)
	}
	if err := a.Submit(now, Request{ID: "r", Tokens: prompt, MaxTokens: 100, Seed: 1}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 40; i++ {
		d, _ := a.Step(now)
		now = now.Add(d)
	}
	if _, ok := a.Migrate(now, "nope"); ok {
		t.Fatal("migrated an unknown request")
	}
	mg, ok := a.Migrate(now, "r")
	if !ok || len(mg.Output) == 0 || len(mg.Output)+mg.Remaining != 100 || len(mg.Tokens) != 300+len(mg.Output) {
		t.Fatalf("migrate: ok %v, %d out, %d remaining, %d tokens", ok, len(mg.Output), mg.Remaining, len(mg.Tokens))
	}
	if a.InFlight() != 0 || len(mg.Chain) < 300/p.BlockSize {
		t.Fatalf("after migrate: %d in flight on the source, chain %d blocks", a.InFlight(), len(mg.Chain))
	}
	if gpu, _ := a.Lookup(mg.Chain); gpu != len(mg.Chain) {
		t.Fatalf("the source keeps %d of %d blocks cached for the peer", gpu, len(mg.Chain))
	}
	err := b.Submit(now, Request{ID: "r", Tokens: mg.Tokens, Chain: nil, MaxTokens: mg.Remaining, Seed: 2,
		Remote: &RemoteKV{Blocks: mg.Chain}})
	if err != nil {
		t.Fatal(err)
	}
	var fin *Finished
	for i := 0; i < 500 && fin == nil; i++ {
		d, out := b.Step(now)
		now = now.Add(d)
		for j := range out.Finished {
			fin = &out.Finished[j]
		}
		if out.Idle {
			if w, ok := b.NextWake(now); ok {
				now = w
			}
		}
	}
	if fin == nil || len(fin.Output) != mg.Remaining || fin.Usage.TransferredTokens == 0 {
		t.Fatalf("the peer's leg: %+v", fin)
	}
	if a.Counters().Migrated != 1 {
		t.Fatalf("counters %+v", a.Counters())
	}
}

// A decode handed over holds its KV until the peer takes it, and the
// peer, given the sampler's state, continues the very output the source
// would have written: the client cannot tell that its answer moved.
func TestHandOverHoldsKVAndContinuesTheOutput(t *testing.T) {
	p := tinyProfile(t)
	whole := NewModel(p, Config{})
	submit(t, whole, t0, Request{ID: "r", Tokens: prompt(300, 7), MaxTokens: 100, Seed: 9})
	want := run(t, whole, t0, 1000).finished["r"].Output
	if len(want) != 100 {
		t.Fatalf("the reference run wrote %d tokens", len(want))
	}

	a, b := NewModel(p, Config{HoldTimeout: time.Minute}), NewModel(p, Config{})
	submit(t, a, t0, Request{ID: "r", Tokens: prompt(300, 7), MaxTokens: 100, Seed: 9})
	now := t0
	for i := 0; i < 30; i++ {
		d, _ := a.Step(now)
		now = now.Add(d)
	}
	mg, ok := a.HandOver(now, "r")
	if !ok || len(mg.Output) == 0 || len(mg.Output)+mg.Remaining != 100 {
		t.Fatalf("hand over: ok %v, %d out, %d remaining", ok, len(mg.Output), mg.Remaining)
	}
	if _, again := a.HandOver(now, "r"); again {
		t.Fatal("a held sequence was handed over twice")
	}
	if _, out := a.Step(now); out.Stats.Running != 0 || out.Stats.Held != 1 {
		t.Fatalf("the source runs %d and holds %d", out.Stats.Running, out.Stats.Held)
	}
	held, ok := a.Release("r")
	if !ok || len(held) != len(mg.Chain) || held[len(held)-1] != mg.Chain[len(mg.Chain)-1] {
		t.Fatalf("release gave %d blocks, want the %d handed over", len(held), len(mg.Chain))
	}
	if a.InFlight() != 0 {
		t.Fatalf("%d in flight on the source after the peer took its KV", a.InFlight())
	}
	submit(t, b, now, Request{ID: "r", Tokens: mg.Tokens, MaxTokens: mg.Remaining, Seed: mg.Sampler, Remote: &RemoteKV{Blocks: held}})
	fin := run(t, b, now, 1000).finished["r"]
	got := append(append([]uint32(nil), mg.Output...), fin.Output...)
	if !slices.Equal(got, want) {
		t.Fatalf("the output changed across the handover:\n got %v\nwant %v", got, want)
	}
	if fin.Usage.TransferredTokens != len(held)*p.BlockSize {
		t.Fatalf("the peer pulled %d tokens, want %d", fin.Usage.TransferredTokens, len(held)*p.BlockSize)
	}

	// Unpulled, the hold expires and the blocks go back to the cache.
	c := NewModel(p, Config{HoldTimeout: time.Second})
	submit(t, c, t0, Request{ID: "r", Tokens: prompt(300, 7), MaxTokens: 100})
	now = t0
	for i := 0; i < 30; i++ {
		d, _ := c.Step(now)
		now = now.Add(d)
	}
	if _, ok := c.HandOver(now, "r"); !ok {
		t.Fatal("hand over")
	}
	c.Step(now.Add(2 * time.Second))
	if c.InFlight() != 0 {
		t.Fatalf("an expired hold still counts: %d in flight", c.InFlight())
	}
}

// A hint given before a block arrives applies when it does, and the copies
// carry it between tiers: offloaded to host and loaded back, a hinted-down
// context still goes first, though it is the most recently used.
func TestEvictionHintsWaitForBlocksAndFollowThem(t *testing.T) {
	p := tinyProfile(t)
	m := NewModel(p, Config{GPUBlocks: 64, HostBlocks: 200})
	a, x := prompt(496, 95), prompt(496, 96) // 31 blocks each
	ca, cx := kv.ChainHashes(a, 16), kv.ChainHashes(x, 16)
	var hints []Hint
	for _, h := range cx {
		hints = append(hints, Hint{Hash: h, Priority: -5})
	}
	m.SetHints(hints) // x is nowhere yet
	submit(t, m, t0, Request{ID: "a", Tokens: a, MaxTokens: 1})
	now := run(t, m, t0, 100).end
	submit(t, m, now, Request{ID: "x", Tokens: x, MaxTokens: 1})
	now = run(t, m, now, 100).end
	c := prompt(496, 97)
	submit(t, m, now, Request{ID: "c", Tokens: c, MaxTokens: 1})
	now = run(t, m, now, 100).end
	if g, _ := m.Lookup(ca); g != 31 {
		t.Fatalf("older unhinted a lost GPU blocks (%d of 31 left): x's hint did not wait for x", g)
	}
	if g, l := m.Lookup(cx); g == 31 || l != 31 {
		t.Fatalf("x: %d on GPU, %d local; want evicted from GPU into host", g, l)
	}
	// Load x back from host (most recently used now), then press the GPU.
	submit(t, m, now, Request{ID: "x2", Tokens: x, MaxTokens: 1})
	now = run(t, m, now, 100).end
	submit(t, m, now, Request{ID: "d", Tokens: prompt(496, 98), MaxTokens: 1})
	run(t, m, now, 100)
	if g, _ := m.Lookup(cx); g == 31 {
		t.Fatal("x reloaded from host lost its hint: it kept every GPU block")
	}
	if g, _ := m.Lookup(kv.ChainHashes(c, 16)); g != 31 {
		t.Fatalf("c, older than x's reload, lost GPU blocks (%d of 31 left) while hinted-down x was there", g)
	}
}

// A request whose prefix is being fetched waits for the fetch instead of
// recomputing what it brings, whether the fetch started before the request
// arrived or after; a request that needs nothing from it is not held up.
func TestRequestWaitsForFetchOfItsPrefix(t *testing.T) {
	p := tinyProfile(t)
	for _, fetchFirst := range []bool{true, false} {
		m := NewModel(p, Config{})
		tokens := prompt(512, 7)
		chain := kv.ChainHashes(tokens, p.BlockSize)
		other := prompt(64, 8)
		var ready time.Time
		var n int
		if fetchFirst {
			ready, n = m.Fetch(t0, chain[:31], 0, 0)
		}
		submit(t, m, t0, Request{ID: "x", Tokens: tokens, MaxTokens: 1})
		submit(t, m, t0, Request{ID: "other", Tokens: other, MaxTokens: 1})
		if !fetchFirst {
			ready, n = m.Fetch(t0, chain[:31], 0, 0)
		}
		if n != 31 || !ready.After(t0) {
			t.Fatalf("fetch moves %d blocks, ready at %v", n, ready)
		}
		res := run(t, m, t0, 1000)
		x, o := res.finished["x"], res.finished["other"]
		if x.Usage.HostHitTokens != 496 || x.Usage.ComputedTokens != 16 {
			t.Fatalf("fetchFirst=%v: the request computed %d tokens and hit %d in host; want 16 and 496 (it must wait for the fetch)",
				fetchFirst, x.Usage.ComputedTokens, x.Usage.HostHitTokens)
		}
		if x.Usage.FirstScheduled.Before(ready) {
			t.Fatalf("fetchFirst=%v: scheduled at %v, before the fetch landed at %v", fetchFirst, x.Usage.FirstScheduled, ready)
		}
		if !o.Usage.FirstScheduled.Equal(t0) {
			t.Fatalf("fetchFirst=%v: an unrelated request was scheduled at %v, want %v (not held up by the fetch)", fetchFirst, o.Usage.FirstScheduled, t0)
		}
	}
}

func TestCoarserBlocksKeepCapacityAndRoundHitsDown(t *testing.T) {
	p := tinyProfile(t)
	for _, bad := range []int{8, 24, 0, -16, 16384} {
		if _, err := p.WithBlockSize(bad); err == nil {
			t.Errorf("WithBlockSize(%d) took a block size a %d-token profile cannot be modelled in", bad, p.BlockSize)
		}
	}
	c, err := p.WithBlockSize(64)
	if err != nil {
		t.Fatal(err)
	}
	if p.BlockSize != 16 || c.BlockSize != 64 {
		t.Fatalf("block sizes %d and %d: the copy must change and the profile stay", p.BlockSize, c.BlockSize)
	}
	if c.GPUBlocks()*c.BlockSize != p.GPUBlocks()*p.BlockSize || c.HostBlocks()*c.BlockSize != p.HostBlocks()*p.BlockSize {
		t.Fatalf("capacity changed: %d x %d GPU, %d host, against %d x %d, %d", c.GPUBlocks(), c.BlockSize, c.HostBlocks(), p.GPUBlocks(), p.BlockSize, p.HostBlocks())
	}
	if c.TransferTime(1, 1) != p.TransferTime(4, 1) {
		t.Fatalf("a 64-token block moves in %v, four 16-token blocks in %v", c.TransferTime(1, 1), p.TransferTime(4, 1))
	}
	// 760 shared tokens: 47 whole 16-token blocks, 11 whole 64-token ones.
	shared := prompt(760, 1)
	second := append(append([]uint32(nil), shared...), prompt(40, 2)...)
	for i, tc := range []struct {
		p   *Profile
		hit int
	}{{p, 752}, {c, 704}} {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			m := NewModel(tc.p, Config{})
			submit(t, m, t0, Request{ID: "a", Tokens: shared, MaxTokens: 4})
			r := run(t, m, t0, 1000)
			submit(t, m, r.end, Request{ID: "b", Tokens: second, MaxTokens: 4})
			u := run(t, m, r.end, 1000).finished["b"].Usage
			if u.GPUHitTokens != tc.hit || u.ComputedTokens != len(second)-tc.hit {
				t.Errorf("%d-token blocks: hit %d tokens and computed %d, want %d and %d", tc.p.BlockSize, u.GPUHitTokens, u.ComputedTokens, tc.hit, len(second)-tc.hit)
			}
		})
	}
}

// An answer that continues here (its engine failed or handed it over)
// waits ahead of new arrivals, in the order the continuations came: its
// client is mid-read, as a preempted sequence's is.
func TestContinuingAnswersWaitAheadOfNewArrivals(t *testing.T) {
	p := tinyProfile(t)
	m := NewModel(p, Config{MaxNumSeqs: 1})
	for i := 0; i < 3; i++ {
		submit(t, m, t0, Request{ID: fmt.Sprint("new", i), Tokens: prompt(40, uint32(i)), MaxTokens: 5})
	}
	for i := 0; i < 2; i++ {
		submit(t, m, t0, Request{ID: fmt.Sprint("cont", i), Tokens: prompt(40, uint32(10+i)), MaxTokens: 5, Continues: true})
	}
	submit(t, m, t0, Request{ID: "new3", Tokens: prompt(40, 3), MaxTokens: 5})
	r := run(t, m, t0, 1000)
	var order []string
	for id := range r.finished {
		order = append(order, id)
	}
	slices.SortFunc(order, func(a, b string) int {
		return r.finished[a].Usage.FirstToken.Compare(r.finished[b].Usage.FirstToken)
	})
	if want := []string{"cont0", "cont1", "new0", "new1", "new2", "new3"}; !slices.Equal(order, want) {
		t.Fatalf("first tokens in order %v, want %v", order, want)
	}
}

// A request that ends its turn on its own (StopAt) finishes there, for
// "stop"; one that reaches MaxTokens first, or has no StopAt, for
// "length"; the context is checked against MaxTokens, as vLLM checks it.
func TestStopAtEndsTheTurn(t *testing.T) {
	p := tinyProfile(t)
	m := NewModel(p, Config{})
	submit(t, m, t0, Request{ID: "stops", Tokens: prompt(100, 1), MaxTokens: 200, StopAt: 30})
	submit(t, m, t0, Request{ID: "long", Tokens: prompt(100, 2), MaxTokens: 20, StopAt: 30})
	submit(t, m, t0, Request{ID: "plain", Tokens: prompt(100, 3), MaxTokens: 25})
	r := run(t, m, t0, 10000)
	for id, want := range map[string]struct {
		reason string
		n      int
	}{"stops": {FinishStop, 30}, "long": {FinishLength, 20}, "plain": {FinishLength, 25}} {
		t.Run(id, func(t *testing.T) {
			f := r.finished[id]
			if f.Reason != want.reason || len(f.Output) != want.n || f.Usage.CompletionTokens != want.n {
				t.Errorf("%s: %s after %d tokens (usage %d), want %s after %d", id, f.Reason, len(f.Output), f.Usage.CompletionTokens, want.reason, want.n)
			}
		})
	}
	if err := m.Submit(t0, Request{ID: "over", Tokens: prompt(100, 4), MaxTokens: p.MaxModelLen, StopAt: 10}); !errors.Is(err, ErrTooLong) {
		t.Fatalf("max_tokens past the context with an early stop: %v", err)
	}
}
