package routing

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/evolvellm/evolve/kv"
	"github.com/evolvellm/evolve/roles"
)

// A replica fed the loads another router placed holds the same
// bookkeeping as that router, and none once they finish.
func TestSharedLoadReplicatesBookkeeping(t *testing.T) {
	split := &View{BlockSize: 16, Nodes: []Node{
		{ID: "p0", Role: roles.Prefill, Serving: true, MaxSeqs: 64, PrefillSecPerToken: 1e-4},
		{ID: "d0", Role: roles.Decode, Serving: true, MaxSeqs: 64, PrefillSecPerToken: 1e-4},
		{ID: "d1", Role: roles.Decode, Serving: true, MaxSeqs: 64, PrefillSecPerToken: 1e-4}}}
	whole := &View{BlockSize: 16, Nodes: []Node{
		{ID: "d0", Role: roles.Decode, Serving: true, MaxSeqs: 64, PrefillSecPerToken: 1e-4},
		{ID: "d1", Role: roles.Decode, Serving: true, MaxSeqs: 64, PrefillSecPerToken: 1e-4}}}
	for _, tc := range []struct {
		name   string
		mk     func() Policy
		states func(Policy) any
	}{
		{"dynamo", func() Policy { return NewDynamo() }, func(p Policy) any { return p.(*Dynamo).workers }},
		{"evolve", func() Policy { return NewEvolve(EvolveConfig{}) }, func(p Policy) any {
			e := p.(*Evolve)
			return []any{e.queued, e.decodes}
		}},
	} {
		for vname, v := range map[string]*View{"disaggregated": split, "aggregated": whole} {
			t.Run(tc.name+"/"+vname, func(t *testing.T) {
				a, b := tc.mk(), tc.mk()
				now := time.Unix(0, 0)
				var ids []string
				for i := range 6 {
					chain := make([]kv.BlockHash, 40+10*i)
					for j := range chain {
						chain[j] = kv.BlockHash(100*i + j + 1)
					}
					id := fmt.Sprint("r", i)
					var m kv.Match
					if _, err := a.Route(now, &Request{ID: id, Tokens: 16 * len(chain), Chain: chain, Match: &m}, v); err != nil {
						t.Fatal(err)
					}
					l, ok := a.(Shared).Load(id)
					if !ok {
						t.Fatalf("no load for %s", id)
					}
					b.(Shared).AddLoad(id, l)
					ids = append(ids, id)
				}
				if !reflect.DeepEqual(tc.states(a), tc.states(b)) {
					t.Fatalf("after placing: %+v, replica %+v", tc.states(a), tc.states(b))
				}
				a.FirstToken(now, ids[0])
				b.FirstToken(now, ids[0])
				for _, id := range ids[:3] {
					a.Finished(now, id)
					b.Finished(now, id)
				}
				if !reflect.DeepEqual(tc.states(a), tc.states(b)) {
					t.Fatalf("after finishing half: %+v, replica %+v", tc.states(a), tc.states(b))
				}
				for _, id := range ids[3:] {
					b.Finished(now, id)
				}
				if d, ok := b.(*Dynamo); ok {
					for id, w := range d.workers {
						if w.activePrefillTokens > 1e-9 || w.decodeBlocks != 0 || len(w.activeBlocks) != 0 {
							t.Fatalf("replica's %s after every request finished: %+v", id, *w)
						}
					}
				}
				if e, ok := b.(*Evolve); ok && (len(e.queued) != 0 || len(e.decodes) != 0) {
					t.Fatalf("replica after every request finished: %v %v", e.queued, e.decodes)
				}
			})
		}
	}
}
