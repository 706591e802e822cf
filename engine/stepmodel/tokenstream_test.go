package stepmodel

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/evolvellm/evolve/kv"
)

// streamRun steps m through arr and records everything a caller sees but
// the token records: per pass its start, duration, stats and how many
// tokens it sampled, every KV event, and the finished requests. Halfway
// it hands one decoding request over, so that a Migrated is compared too.
type streamRun struct {
	passes   []string
	events   []kv.Event
	finished map[string]Finished
	migrated Migrated
	streamed int // Output.Tokens records seen
}

func runStream(t *testing.T, m *Model, arr []arrival) streamRun {
	t.Helper()
	r := streamRun{finished: map[string]Finished{}}
	handed := false
	handOver := func(start time.Time, submitted int) {
		if handed || submitted <= len(arr)/2 {
			return
		}
		for _, s := range m.running {
			if s.generated > 70 && !s.req.RemoteDecode { // past a block of output, mid-block
				mg, ok := m.HandOver(start, s.req.ID)
				if !ok {
					t.Fatalf("hand over %s refused", s.req.ID)
				}
				r.migrated, handed = mg, true
				return
			}
		}
	}
	stepThrough(t, m, arr, handOver, func(d time.Duration, out Output) {
		r.events = append(r.events, out.Events...)
		r.streamed += len(out.Tokens)
		if len(out.Tokens) != 0 && len(out.Tokens) != out.Sampled {
			t.Fatalf("pass sampled %d tokens but streamed %d", out.Sampled, len(out.Tokens))
		}
		for _, f := range out.Finished {
			r.finished[f.ReqID] = f
		}
		if !out.Idle {
			r.passes = append(r.passes, fmt.Sprint(out.Start, d, out.Stats, out.Sampled))
		}
	})
	if !handed {
		t.Fatal("no request was handed over: the test compares no Migrated")
	}
	return r
}

// The simulator turns the token stream off; everything else an engine
// reports must stay as it is, down to the output ids, the chains hashed
// from them and the sampler handed on, with preemptions and a handover.
func TestNoTokenStreamChangesNothingElse(t *testing.T) {
	for _, gpuBlocks := range []int{0, 120} {
		t.Run(fmt.Sprint("gpu", gpuBlocks), func(t *testing.T) {
			p := tinyProfile(t)
			arr := mixedArrivals()
			want := runStream(t, NewModel(p, Config{GPUBlocks: gpuBlocks}), arr)
			quiet := NewModel(p, Config{GPUBlocks: gpuBlocks, NoTokenStream: true})
			got := runStream(t, quiet, arr)
			if want.streamed == 0 || got.streamed != 0 {
				t.Fatalf("token records: %d streamed, %d without the stream", want.streamed, got.streamed)
			}
			if !slices.Equal(got.passes, want.passes) {
				t.Fatalf("passes differ (%d and %d)", len(got.passes), len(want.passes))
			}
			if !slices.Equal(got.events, want.events) {
				t.Fatalf("KV events differ (%d and %d)", len(got.events), len(want.events))
			}
			if len(want.finished) != len(arr)-1 || len(got.finished) != len(want.finished) {
				t.Fatalf("finished %d and %d of %d", len(want.finished), len(got.finished), len(arr))
			}
			for id, w := range want.finished {
				g := got.finished[id]
				if g.Reason != w.Reason || !slices.Equal(g.Output, w.Output) || !slices.Equal(g.Blocks, w.Blocks) || g.Usage != w.Usage {
					t.Fatalf("%s differs:\nstream    %+v\nno stream %+v", id, w, g)
				}
			}
			w, g := want.migrated, got.migrated
			if g.Sampler != w.Sampler || !slices.Equal(g.Tokens, w.Tokens) || !slices.Equal(g.Chain, w.Chain) || g.Remaining != w.Remaining || g.Usage != w.Usage {
				t.Fatalf("handover differs:\nstream    %+v\nno stream %+v", w.Usage, g.Usage)
			}
		})
	}
}
