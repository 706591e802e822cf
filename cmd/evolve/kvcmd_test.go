package main

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"text/tabwriter"
	"unicode/utf8"

	"github.com/evolvellm/evolve/orchestrator"
)

// A large cluster's figures (64 GLM-4.6 trays, hours of traffic) still fit
// 80 columns in the table, rounded; wide prints them exact.
func TestKVTableFitsATerminalAtScale(t *testing.T) {
	st := orchestrator.KVStatus{Blocks: 4_950_123, Replicas: 38_000_456, ReferencedBlocks: 1_234_567, LiveBranches: 10_240,
		PromptTokens: 98_765_432_100, GPUHitTokens: 88_000_000_000, LocalHostTokens: 5_000_000_000, RemoteHostTokens: 765_432_100,
		RecomputedTokens: 5_000_000_000, LostKVReuse: 123_456_789, BytesMoved: 3 << 50}
	for i := range 64 {
		n := orchestrator.KVNode{ID: fmt.Sprintf("engine-%d", i), Role: "prefill", State: orchestrator.StateServing,
			GPUCapacity: 231_250, GPUUsage: 1, GPUCached: 231_250, GPUReferenced: 199_999,
			HostCapacity: 318_750, HostUsage: 1, HostCached: 318_750, HostReferenced: 318_750,
			RefEvictedGPU: 12_345_678, RefEvictedHost: 9_876_543, RefLost: 209_000}
		st.Nodes = append(st.Nodes, n)
	}
	st.Nodes[63].State = orchestrator.StateSwitching // not in the pool
	st.Pool = orchestrator.KVPool{GPUCapacity: 63 * 231_250, GPUCached: 63 * 231_250, GPUReferenced: 63 * 199_999,
		HostCapacity: 63 * 318_750, HostCached: 63 * 318_750, HostReferenced: 63 * 318_750}
	render := func(wide bool) string {
		var b bytes.Buffer
		w := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
		printKV(w, st, wide)
		w.Flush()
		return b.String()
	}
	table := render(false)
	for _, line := range strings.Split(table, "\n") {
		if n := utf8.RuneCountInString(line); n > 80 {
			t.Fatalf("a line is %d columns wide:\n%s", n, table)
		}
	}
	for _, want := range []string{"engine-63  prefill  switching  100%  100%    86%", "cluster             serving    100%  100%    86%", "0 of 14.6M blocks free", "1.2M blocks by 10.2K branches: 12.6M GPU and 20.1M host copies",
		"5.0M blocks in 38.0M copies", "98.8G: 89.1% GPU hit", "3.0 PiB", "123.5M tokens recomputed"} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
	wide := render(true)
	for _, want := range []string{"231250", "199999", "12345678", "209000", "98765432100", "LAST COPY"} {
		if !strings.Contains(wide, want) {
			t.Errorf("wide lacks %q:\n%s", want, wide)
		}
	}
}

func TestCountAndBytes(t *testing.T) {
	for _, c := range []struct {
		v    int64
		want string
	}{{0, "0"}, {9999, "9999"}, {10_000, "10.0K"}, {999_949, "999.9K"}, {999_950, "1.0M"}, {-25_000, "-25.0K"}, {2_500_000_000, "2.5G"}} {
		t.Run(c.want, func(t *testing.T) {
			if got := count(c.v, false); got != c.want {
				t.Errorf("count(%d) = %q, want %q", c.v, got, c.want)
			}
		})
	}
	if got := count(2_500_000_000, true); got != "2500000000" {
		t.Errorf("wide count = %q", got)
	}
	for _, c := range []struct {
		v    int64
		want string
	}{{0, "0 B"}, {1023, "1023 B"}, {1536, "1.5 KiB"}, {169_844 << 20, "165.9 GiB"}} {
		t.Run(c.want, func(t *testing.T) {
			if got := bytesIEC(c.v); got != c.want {
				t.Errorf("bytesIEC(%d) = %q, want %q", c.v, got, c.want)
			}
		})
	}
}

func TestShare(t *testing.T) {
	for _, c := range []struct {
		f    float64
		want string
	}{{0, "0%"}, {0.0004, "<0.1%"}, {0.003, "0.3%"}, {0.0994, "9.9%"}, {0.0996, "10%"}, {0.864, "86%"}, {1, "100%"}} {
		t.Run(c.want, func(t *testing.T) {
			if got := share(c.f); got != c.want {
				t.Errorf("share(%v) = %q, want %q", c.f, got, c.want)
			}
		})
	}
}

func TestCounted(t *testing.T) {
	for n, want := range map[int]string{0: "0 math agents", 1: "1 math agent", 24: "24 math agents"} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			if got := counted(n, "math agent"); got != want {
				t.Errorf("counted(%d) = %q, want %q", n, got, want)
			}
		})
	}
}
