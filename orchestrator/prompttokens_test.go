package orchestrator

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"

	"github.com/evolvellm/evolve/openaiapi"
	"github.com/evolvellm/evolve/protocol"
)

// A chat request's legs carry the router's token ids in place of its
// messages while every engine reads them, and the client's body (less any
// ids the client put there) once one does not; completions go as sent.
func TestLegBodyGivesEvolveEnginesTheTokens(t *testing.T) {
	o := &Orchestrator{c: newCluster(0)}
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

// A request whose legs were built with the router's token ids goes on on
// an engine that joined since and does not read them (an older engine,
// in a rolling upgrade): that engine gets the client's messages instead,
// and an engine that reads the ids still gets them.
func TestALegToAnEngineThatReadsNoIdsCarriesTheMessages(t *testing.T) {
	got := map[string][]byte{}
	engine := func(name string) *httptest.Server {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			got[name], _ = io.ReadAll(r.Body)
		}))
		t.Cleanup(srv.Close)
		return srv
	}
	reads, old := engine("reads"), engine("old")
	o := &Orchestrator{c: newCluster(0), http: http.DefaultClient}
	o.c.nodes["e0"] = &node{reg: protocol.Registration{ID: "e0", URL: reads.URL, PromptTokens: true}}
	chat := []byte(`{"messages": [{"role": "user", "content": "fix the scheduler"}], "max_tokens": 9}`)
	p, rb, perr := openaiapi.ParseBody(chat, true, 0)
	if perr != nil {
		t.Fatal(perr)
	}
	legs := o.legBody(p, rb)
	o.c.nodes["e1"] = &node{reg: protocol.Registration{ID: "e1", URL: old.URL}}
	a := &attempt{o: o, attemptRequest: attemptRequest{r: httptest.NewRequest("POST", "/v1/chat/completions", nil), p: p, body: legs, client: rb,
		path: "/v1/chat/completions"}}
	for _, srv := range []*httptest.Server{reads, old} {
		resp, err := a.post(srv.URL, legs.With(map[string]json.RawMessage{"stream": json.RawMessage("true")}))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	for name, ids := range map[string]bool{"reads": true, "old": false} {
		t.Run(name, func(t *testing.T) {
			leg, err := openaiapi.ParseObject(got[name])
			if err != nil || leg.Has(openaiapi.PromptTokensMember) != ids || leg.Has("messages") == ids || string(leg.Members["stream"]) != "true" {
				t.Fatalf("%s engine got %s (%v)", name, got[name], err)
			}
			if e, perr := openaiapi.Parse(got[name], true, 0); perr != nil || !slices.Equal(e.Tokens, p.Tokens) {
				t.Fatalf("%s engine reads %v, %v; the router read %v", name, e, perr, p.Tokens)
			}
		})
	}
}
