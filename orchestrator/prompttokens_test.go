package orchestrator

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/evolvellm/evolve/openaiapi"
	"github.com/evolvellm/evolve/protocol"
)

// A chat request's legs carry the router's token ids in place of its
// messages while every engine reads them, and the client's body (less any
// ids the client put there) once one does not; completions go as sent.
func TestLegBodyGivesEvolveEnginesTheTokens(t *testing.T) {
	o := &Orchestrator{c: newCluster()}
	o.c.nodes["e0"] = &node{reg: protocol.Registration{ID: "e0", PromptTokens: true}}
	o.c.nodes["e1"] = &node{reg: protocol.Registration{ID: "e1", PromptTokens: true}}
	chat := []byte(`{"model": "m", "messages": [{"role": "user", "content": "fix the scheduler"}],
		"tools": [{"type": "function", "function": {"name": "Read"}}], "max_tokens": 9, "evolve_prompt_tokens": [1, 2]}`)
	p, rb, perr := openaiapi.ParseBody(chat, true, 0)
	if perr != nil {
		t.Fatal(perr)
	}

	leg := o.legBody(p, rb)
	if leg.Has("messages") || !leg.Has("tools") || string(leg.Members["max_tokens"]) != "9" {
		t.Fatalf("leg members %v", leg.Members)
	}
	got, perr := openaiapi.Parse(leg.Raw, true, 0)
	if perr != nil || !slices.Equal(got.Tokens, p.Tokens) || len(got.Req.Tools) == 0 {
		t.Fatalf("an engine reads the leg %s as %+v, %v; the router read %v", leg.Raw, got, perr, p.Tokens)
	}
	var back map[string]json.RawMessage
	if err := json.Unmarshal(leg.Raw, &back); err != nil || len(back) != len(leg.Members) {
		t.Fatalf("leg bytes %s and members %v differ (%v)", leg.Raw, leg.Members, err)
	}

	// A vLLM engine joins: it renders the messages itself.
	o.c.nodes["v0"] = &node{reg: protocol.Registration{ID: "v0", Tokenizer: "engine"}}
	leg = o.legBody(p, rb)
	if !leg.Has("messages") || leg.Has(openaiapi.PromptTokensMember) {
		t.Fatalf("mixed cluster leg members %v", leg.Members)
	}
	if got, perr := openaiapi.Parse(leg.Raw, true, 0); perr != nil || !slices.Equal(got.Tokens, p.Tokens) {
		t.Fatalf("mixed cluster: an engine reads %v, %v", got, perr)
	}

	comp := []byte(`{"prompt": [5, 6, 7], "max_tokens": 2}`)
	p, rb, _ = openaiapi.ParseBody(comp, false, 0)
	if leg := o.legBody(p, rb); string(leg.Raw) != string(comp) {
		t.Fatalf("completion leg %s", leg.Raw)
	}
}
