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
