package orchestrator

import (
	"testing"
	"time"

	"github.com/evolvellm/evolve/engine/stepmodel"
	"github.com/evolvellm/evolve/internal/wait"
	"github.com/evolvellm/evolve/roles"
)

// The model the cluster serves follows the engines present: an engine
// started first with a mistyped model name does not lock the cluster to
// it. On a tie the model served stays; once most engines serve another,
// the cluster serves that one, the mistyped engine is rejected (and told
// why), and after it leaves nothing is rejected.
func TestServedModelFollowsTheEngines(t *testing.T) {
	tc := startTestCluster(t)
	tiny, _ := stepmodel.BuiltinProfile("tiny")
	typo := *tiny
	typo.Model = "evolve-tinyy"
	states := func() map[string]string {
		tc.o.c.mu.Lock()
		defer tc.o.c.mu.Unlock()
		out := map[string]string{}
		for id, n := range tc.o.c.nodes {
			out[id] = n.state
		}
		return out
	}
	model := func() string { m, _ := tc.o.servedModel(); return m }
	tc.addEngine(t, "typo", &typo, roles.Decode)
	wait.Until(t, 10*time.Second, "the mistyped engine serving, alone", func() bool { return states()["typo"] == StateServing })
	tc.addEngine(t, "e1", tiny, roles.Decode)
	wait.Until(t, 10*time.Second, "e1 judged", func() bool { return states()["e1"] != "" })
	if s := states(); s["e1"] != StateRejected || model() != "evolve-tinyy" {
		t.Fatalf("one engine of each: %v, serving %s; the model served stays on a tie", s, model())
	}
	tc.addEngine(t, "e2", tiny, roles.Prefill)
	wait.Until(t, 10*time.Second, "the cluster serving evolve-tiny, its two engines serving", func() bool {
		s := states()
		return model() == "evolve-tiny" && s["e1"] == StateServing && s["e2"] == StateServing && s["typo"] == StateRejected
	})
	tc.o.c.mu.Lock()
	reason := tc.o.c.nodes["typo"].reason
	tc.o.c.mu.Unlock()
	if reason == "" {
		t.Fatal("the rejected engine has no reason")
	}
	if status, _ := postJSON(t, tc.o.RouterURL()+"/v1/completions", `{"model": "evolve-tiny", "prompt": "hi", "max_tokens": 2}`); status != 200 {
		t.Fatalf("a request for the engines' model: %d", status)
	}
	// The mistyped engine leaves: the cluster is as if it had never come.
	tc.engines[0]()
	wait.Until(t, 10*time.Second, "typo gone", func() bool { return states()["typo"] == StateDown })
	if s := states(); s["e1"] != StateServing || s["e2"] != StateServing || model() != "evolve-tiny" {
		t.Fatalf("after the mistyped engine left: %v, serving %s", s, model())
	}
}

// With the orchestrator's served model given, an engine of another model
// is rejected however many there are, and the first of that model serves.
func TestServedModelFlagHolds(t *testing.T) {
	tc := startTestClusterWith(t, Config{ServedModel: "evolve-tiny"}, nil)
	tiny, _ := stepmodel.BuiltinProfile("tiny")
	other := *tiny
	other.Model = "evolve-other"
	tc.addEngine(t, "o1", &other, roles.Decode)
	tc.addEngine(t, "o2", &other, roles.Decode)
	tc.addEngine(t, "e1", tiny, roles.Decode)
	wait.Until(t, 10*time.Second, "e1 serving, o1 and o2 rejected", func() bool {
		tc.o.c.mu.Lock()
		defer tc.o.c.mu.Unlock()
		n := tc.o.c.nodes
		return n["e1"] != nil && n["e1"].state == StateServing && n["o1"] != nil && n["o1"].state == StateRejected &&
			n["o2"] != nil && n["o2"].state == StateRejected
	})
	if m, _ := tc.o.servedModel(); m != "evolve-tiny" {
		t.Fatalf("serving %s", m)
	}
}

// The engines of the model served that restart keep it served: the one
// of another model left meanwhile does not take the cluster (and its
// longer context does not become the router's limit).
func TestServedModelStaysWhileItsEnginesRestart(t *testing.T) {
	tc := startTestCluster(t)
	tiny, _ := stepmodel.BuiltinProfile("tiny")
	other := *tiny
	other.Model, other.MaxModelLen = "evolve-other", 2*tiny.MaxModelLen
	state := func(id string) string {
		tc.o.c.mu.Lock()
		defer tc.o.c.mu.Unlock()
		if n := tc.o.c.nodes[id]; n != nil {
			return n.state
		}
		return ""
	}
	tc.addEngine(t, "good", tiny, roles.Decode)
	wait.Until(t, 10*time.Second, "good serving", func() bool { return state("good") == StateServing })
	tc.addEngine(t, "stray", &other, roles.Decode)
	wait.Until(t, 10*time.Second, "stray rejected", func() bool { return state("stray") == StateRejected })
	if _, maxLen := tc.o.servedModel(); maxLen != tiny.MaxModelLen {
		t.Fatalf("the router's context limit is %d: the rejected engine's, not the served model's %d", maxLen, tiny.MaxModelLen)
	}
	tc.engines[0]() // good restarts
	wait.Until(t, 10*time.Second, "good down", func() bool { return state("good") == StateDown })
	if m, _ := tc.o.servedModel(); m != "evolve-tiny" || state("stray") != StateRejected {
		t.Fatalf("while good restarts the cluster serves %s, stray is %s", m, state("stray"))
	}
	tc.addEngine(t, "good", tiny, roles.Decode)
	wait.Until(t, 10*time.Second, "good serving again", func() bool { return state("good") == StateServing })
	if m, _ := tc.o.servedModel(); m != "evolve-tiny" || state("stray") != StateRejected {
		t.Fatalf("after good came back the cluster serves %s, stray is %s", m, state("stray"))
	}
}
