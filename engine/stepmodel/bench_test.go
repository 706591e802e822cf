package stepmodel

import (
	"fmt"
	"runtime"
	"testing"
	"time"
)

// decodeHeavyModel returns a gb300-kimi-k2 engine with seqs sequences of ctx
// tokens each, all prefilled and decoding, and the time their decode starts.
// The GPU is sized to hold their growth, so that a long benchmark measures
// decoding rather than preemption; the set-up's garbage is collected before
// the timer restarts.
func decodeHeavyModel(b *testing.B, profile string, seqs, ctx, maxTokens int) (*Model, time.Time) {
	p, err := BuiltinProfile(profile)
	if err != nil {
		b.Fatal(err)
	}
	blocks := seqs * ((ctx+maxTokens)/p.BlockSize + 1)
	m := NewModel(p, Config{MaxNumSeqs: seqs, GPUBlocks: max(blocks, p.GPUBlocks())})
	for i := 0; i < seqs; i++ {
		if err := m.Submit(t0, Request{ID: fmt.Sprint("s", i), Tokens: prompt(ctx, uint32(i+1)), MaxTokens: maxTokens}); err != nil {
			b.Fatal(err)
		}
	}
	now := t0
	for {
		d, out := m.Step(now)
		now = now.Add(d)
		if out.Stats.DecodeSeqs == seqs {
			runtime.GC()
			return m, now
		}
	}
}

// BenchmarkStepDecode256x32K measures how fast the step model runs: one
// engine with 256 running sequences decoding, their contexts growing from
// 28K to 36K tokens (32K on average); the model is rebuilt, off the clock,
// when they near the end. The figure to
// read is x-realtime: modelled engine-seconds per wall-second on one core.
func BenchmarkStepDecode256x32K(b *testing.B) {
	for _, profile := range benchProfiles {
		b.Run(profile, func(b *testing.B) { benchStepDecode(b, profile) })
	}
}

// benchProfiles: 64-token blocks (MLA on Blackwell, sparse and dense) and
// 16-token blocks (GQA),
// since per-block bookkeeping is much of the cost.
var benchProfiles = []string{"gb300-glm5", "gb300-kimi-k2", "gb300-glm46", "h200-glm46"}

func benchStepDecode(b *testing.B, profile string) {
	const maxTokens = 8192
	m, now := decodeHeavyModel(b, profile, 256, 28672, maxTokens)
	steps := 0
	var modelled time.Duration
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if steps >= maxTokens-1200 { // the first sequences started decoding during set-up
			b.StopTimer()
			m, now = decodeHeavyModel(b, profile, 256, 28672, maxTokens)
			steps = 0
			b.StartTimer()
		}
		d, out := m.Step(now)
		if out.Idle || out.Stats.DecodeSeqs != 256 {
			b.Fatalf("not a full decode pass: %+v", out.Stats)
		}
		now = now.Add(d)
		modelled += d
		steps++
	}
	b.ReportMetric(modelled.Seconds()/b.Elapsed().Seconds(), "x-realtime")
	b.ReportMetric(float64(modelled.Microseconds())/float64(b.N)/1000, "ms-per-pass")
}

// BenchmarkAdvanceDecode256x32K is the same engine driven as the simulator
// drives it: Advance to the next outside event, here one every 100 ms of
// modelled time (an engine serving a few dozen agents).
func BenchmarkAdvanceDecode256x32K(b *testing.B) {
	for _, profile := range benchProfiles {
		b.Run(profile, func(b *testing.B) { benchAdvanceDecode(b, profile) })
	}
}

func benchAdvanceDecode(b *testing.B, profile string) {
	const maxTokens = 8192
	m, now := decodeHeavyModel(b, profile, 256, 28672, maxTokens)
	var modelled time.Duration
	passes := 0
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if passes >= maxTokens-1200 {
			b.StopTimer()
			m, now = decodeHeavyModel(b, profile, 256, 28672, maxTokens)
			passes = 0
			b.StartTimer()
		}
		ao := m.Advance(now, now.Add(100*time.Millisecond))
		if ao.Idle || len(ao.Finished) > 0 {
			b.Fatalf("not a steady decode: idle %v, %d finished", ao.Idle, len(ao.Finished))
		}
		modelled += ao.End.Sub(now)
		passes += len(ao.Passes)
		now = ao.End
	}
	b.ReportMetric(modelled.Seconds()/b.Elapsed().Seconds(), "x-realtime")
}

// BenchmarkStepMixed measures a realistic mix: requests arriving, chunked
// prefill with prefix hits, decode, and finishes, on gb300-kimi-k2.
func BenchmarkStepMixed(b *testing.B) {
	p, err := BuiltinProfile("gb300-kimi-k2")
	if err != nil {
		b.Fatal(err)
	}
	m := NewModel(p, Config{})
	now := t0
	shared := prompt(20000, 1)
	n := 0
	var modelled time.Duration
	b.ResetTimer()
	for b.Loop() {
		if m.InFlight() < 300 {
			tokens := append(append([]uint32(nil), shared...), prompt(2000+n%7*500, uint32(n+2))...)
			_ = m.Submit(now, Request{ID: fmt.Sprint(n), Tokens: tokens, MaxTokens: 300 + n%5*100})
			n++
		}
		d, _ := m.Step(now)
		if d == 0 {
			d = time.Millisecond
		}
		now = now.Add(d)
		modelled += d
	}
	b.ReportMetric(modelled.Seconds()/b.Elapsed().Seconds(), "x-realtime")
}
