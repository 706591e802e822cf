package orchestrator

import (
	"testing"
	"time"
)

func TestLatencyWindowKeepsTheLastMinute(t *testing.T) {
	var w latencyWindow
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := 0; i < 100; i++ { // one a second: the first 40 fall out
		at := t0.Add(time.Duration(i) * time.Second)
		w.addTTFT(at, float64(i))
		w.addE2E(at, 10*float64(i))
	}
	r := w.recent(t0.Add(100*time.Second), t0)
	if r.Requests != 60 || r.RequestsSec != 1 {
		t.Fatalf("window: %+v", r)
	}
	if r.TTFTP50 != 69 || r.TTFTP95 != 96 || r.E2EP50 != 690 || r.E2EP95 != 960 {
		t.Fatalf("percentiles: %+v", r)
	}
	if r := w.recent(t0.Add(time.Hour), t0); r.Requests != 0 || r.TTFTP95 != 0 {
		t.Fatalf("an idle hour later: %+v", r)
	}
}

// A router nobody asks for its latencies keeps two minutes of samples at
// most, not every sample since the last status call (up to maxRecent).
func TestLatencyWindowForgetsWhenNobodyAsks(t *testing.T) {
	var w latencyWindow
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const every = 10 * time.Millisecond
	for i := range 30000 { // five minutes, 100 a second
		w.addE2E(t0.Add(time.Duration(i)*every), 1)
	}
	if most := int(2*RecentWindow/every) + 1; len(w.e2e) > most {
		t.Fatalf("%d samples kept after five minutes, want at most %d", len(w.e2e), most)
	}
	if r := w.recent(t0.Add(30000*every), t0); r.Requests != int(RecentWindow/every) {
		t.Fatalf("the last minute: %d requests, want %d", r.Requests, int(RecentWindow/every))
	}
}

// Over a router's first seconds the window is those seconds: 20 requests
// in its first 20 s are one a second, not a third of one.
func TestLatencyWindowOfAYoungRouterIsItsAge(t *testing.T) {
	var w latencyWindow
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range 20 {
		w.addE2E(t0.Add(time.Duration(i)*time.Second+time.Second/2), 1)
	}
	if r := w.recent(t0.Add(20*time.Second), t0); r.WindowSec != 20 || r.Requests != 20 || r.RequestsSec != 1 {
		t.Fatalf("20 s after the start: %+v", r)
	}
	if r := w.recent(t0.Add(time.Second/4), t0); r.WindowSec != 1 {
		t.Fatalf("a quarter second after the start, the window is %v s, want at least 1", r.WindowSec)
	}
}
