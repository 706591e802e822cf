package sim

import (
	"fmt"
	"testing"
	"time"
)

// decodeHeavyModel returns a gb300-kimi-k2 engine with seqs sequences of ctx
// tokens each, all prefilled and decoding, and the time their decode starts.
func decodeHeavyModel(b *testing.B, seqs, ctx, maxTokens int) (*Model, time.Time) {
	p, err := LoadProfile("gb300-kimi-k2")
	if err != nil {
		b.Fatal(err)
	}
	m := NewModel(p, Config{MaxNumSeqs: seqs})
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
			return m, now
		}
	}
}

// BenchmarkStepDecode256x32K measures how fast the step model runs: one
// engine with 256 running sequences at 32K context, decoding. The figure to
// read is x-realtime: modelled engine-seconds per wall-second on one core.
func BenchmarkStepDecode256x32K(b *testing.B) {
	const maxTokens = 12_000
	m, now := decodeHeavyModel(b, 256, 32768, maxTokens)
	steps := 0
	var modelled time.Duration
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if steps == maxTokens/2 { // the first sequences started decoding during set-up
			b.StopTimer()
			m, now = decodeHeavyModel(b, 256, 32768, maxTokens)
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

// BenchmarkStepMixed measures a realistic mix: requests arriving, chunked
// prefill with prefix hits, decode, and finishes, on the tiny profile.
func BenchmarkStepMixed(b *testing.B) {
	p, err := LoadProfile("gb300-kimi-k2")
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
