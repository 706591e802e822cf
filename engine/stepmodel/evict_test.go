package stepmodel

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// refLRU is the plain model of the eviction order: one slice per priority,
// oldest first, and a block moves to the end of its priority's slice when
// added again.
type refLRU struct {
	prio  map[BlockID]int8
	order map[int8][]BlockID
}

func (r *refLRU) remove(id BlockID) {
	p, ok := r.prio[id]
	if !ok {
		return
	}
	r.order[p] = slices.DeleteFunc(r.order[p], func(x BlockID) bool { return x == id })
	delete(r.prio, id)
}

func (r *refLRU) add(id BlockID, prio int8) {
	r.remove(id)
	r.prio[id] = prio
	r.order[prio] = append(r.order[prio], id)
}

func (r *refLRU) victim() BlockID {
	var prios []int8
	for p, ids := range r.order {
		if len(ids) > 0 {
			prios = append(prios, p)
		}
	}
	if len(prios) == 0 {
		return NoBlock
	}
	return r.order[slices.Min(prios)][0]
}

// The LRU policy evicts in exactly the order of a plain LRU list per
// priority, through adds, re-adds, removals, priority changes, and
// evictions whose block ids are freed and reused.
func TestLRUPolicyMatchesPlainLRU(t *testing.T) {
	var tab BlockTable
	pol := NewLRUPolicy(&tab)
	ref := &refLRU{prio: map[BlockID]int8{}, order: map[int8][]BlockID{}}
	r := rand.New(rand.NewPCG(1, 2))
	var ids []BlockID
	for step := range 200000 {
		switch op := r.IntN(20); {
		case op < 5 || len(ids) == 0: // a new block
			id := tab.alloc()
			tab.Get(id).Priority = int8(r.IntN(3) - 1)
			ids = append(ids, id)
			pol.Add(id)
			ref.add(id, tab.Get(id).Priority)
		case op < 12: // re-added (released again)
			id := ids[r.IntN(len(ids))]
			pol.Add(id)
			ref.add(id, tab.Get(id).Priority)
		case op < 15: // taken (in use again)
			id := ids[r.IntN(len(ids))]
			pol.Remove(id)
			ref.remove(id)
		case op < 17: // a new hint moves it to another priority
			id := ids[r.IntN(len(ids))]
			_, in := ref.prio[id]
			pol.Remove(id)
			tab.Get(id).Priority = int8(r.IntN(3) - 1)
			ref.remove(id)
			if in {
				pol.Add(id)
				ref.add(id, tab.Get(id).Priority)
			}
		default: // evicted: the id is freed and may be reused
			v := pol.Victim()
			if want := ref.victim(); v != want {
				t.Fatalf("step %d: victim %d, want %d", step, v, want)
			}
			if v == NoBlock {
				continue
			}
			pol.Remove(v)
			ref.remove(v)
			tab.release(v)
			ids = slices.DeleteFunc(ids, func(x BlockID) bool { return x == v })
		}
		if pol.Len() != len(ref.prio) {
			t.Fatalf("step %d: Len %d, want %d", step, pol.Len(), len(ref.prio))
		}
		for _, l := range pol.(*lruPolicy).lists {
			if n := len(l.q) - l.head; n > 3*l.live+maxStale+1 || len(l.q) > 2*n+maxStale+1 {
				t.Fatalf("step %d: a queue holds %d entries (%d from its head) for %d blocks", step, len(l.q), n, l.live)
			}
		}
	}
	for pol.Len() > 0 { // drain: the whole order agrees
		v, want := pol.Victim(), ref.victim()
		if v != want {
			t.Fatalf("drain: victim %d, want %d", v, want)
		}
		pol.Remove(v)
		ref.remove(v)
	}
	if pol.Victim() != NoBlock {
		t.Fatal("an empty policy named a victim")
	}
}
