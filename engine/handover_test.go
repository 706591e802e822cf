package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/evolvellm/evolve/engine/stepmodel"
	"github.com/evolvellm/evolve/openaiapi"
	"github.com/evolvellm/evolve/openaiapi/openaiapitest"
	"github.com/evolvellm/evolve/protocol"
	"github.com/evolvellm/evolve/roles"
	"github.com/evolvellm/evolve/tokenizer"
)

// startEngine runs engine id with the tiny profile behind an HTTP server,
// publishing to sk (nil: nowhere).
func startEngine(t *testing.T, id string, role roles.Role, speedup float64, sk EventSink) (*Simulated, *httptest.Server) {
	t.Helper()
	return startEngineConfig(t, Config{ID: id, Role: role, Speedup: speedup}, sk)
}

// startEngineConfig is startEngine from a Config (the tiny profile's).
func startEngineConfig(t *testing.T, cfg Config, sk EventSink) (*Simulated, *httptest.Server) {
	t.Helper()
	p, err := stepmodel.BuiltinProfile("tiny")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Profile = p
	e, err := NewSimulated(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if sk != nil {
		e.SetSink(sk)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.Run(ctx); close(done) }()
	srv := httptest.NewServer(e.Handler())
	e.cfg.AdvertiseURL = srv.URL
	t.Cleanup(func() { srv.Close(); cancel(); <-done })
	return e, srv
}

// readChat reads a streamed chat answer (openaiapitest.ReadChat); a
// chunk that does not parse, or an error event, fails the test.
func readChat(t *testing.T, body io.Reader, each func(n int)) *openaiapitest.Chat {
	t.Helper()
	c := openaiapitest.ReadChat(body, each)
	if len(c.Errors) > 0 {
		t.Fatalf("chunks that do not parse or carry an error: %q", c.Errors)
	}
	return c
}

// postRaw posts body to an engine, as a router does when movable (with
// the headers of one that reads whole answers' opening lines).
func postRaw(t *testing.T, url string, body []byte, movable bool) *http.Response {
	t.Helper()
	req, _ := http.NewRequest("POST", url, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if movable {
		req.Header.Set(protocol.HeaderHandOver, "1")
		req.Header.Set(protocol.HeaderWholeTokens, "1")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("%s: %d %s", url, resp.StatusCode, b)
	}
	return resp
}

// A decode engine told to hand over ends a router's streams and answers
// with what a peer needs, holds their KV until the peer pulls it, and the
// peer continues each answer as the first engine would have: the same
// tokens, the same id, the role named once, usage and the KV story
// summed. A request without the router's header runs to its end where it
// is.
func TestHandOverMovesAnAnswerToAPeerUnchanged(t *testing.T) {
	a, srvA := startEngine(t, "a", roles.Decode, 1, nil)
	_, srvB := startEngine(t, "b", roles.Decode, 1, nil)
	const n = 300
	body := []byte(`{"messages": [{"role": "user", "content": "` + strings.Repeat("the long context of an agent ", 30) +
		`"}], "max_tokens": 300, "ignore_eos": true, "seed": 5, "stream": true, "stream_options": {"include_usage": true}}`)
	whole := []byte(strings.Replace(string(body), `"stream": true, "stream_options": {"include_usage": true}`, `"stream": false`, 1))

	// The answers as one engine writes them.
	ref := readChat(t, postRaw(t, srvB.URL+"/v1/chat/completions", body, false).Body, nil)
	var refWhole struct {
		Choices []struct {
			Message struct{ Content string } `json:"message"`
		} `json:"choices"`
	}
	resp := postRaw(t, srvB.URL+"/v1/chat/completions", whole, false)
	json.NewDecoder(resp.Body).Decode(&refWhole)
	resp.Body.Close()
	if len(ref.Content) != n || !ref.Done || len(refWhole.Choices) != 1 {
		t.Fatalf("reference: %d chunks, done %v", len(ref.Content), ref.Done)
	}
	// A router that does not say it reads a whole answer's opening lines
	// (one from before them) gets the plain answer.
	req, _ := http.NewRequest("POST", srvB.URL+"/v1/chat/completions", bytes.NewReader(whole))
	req.Header.Set(protocol.HeaderHandOver, protocol.HandOverAllowed)
	if r, err := http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	} else {
		var plain struct{ ID string }
		err := json.NewDecoder(r.Body).Decode(&plain)
		r.Body.Close()
		if err != nil || plain.ID == "" {
			t.Fatalf("a whole answer to an older router is not plain JSON: %v", err)
		}
	}

	// On engine a: a movable stream, a movable whole answer and a stream
	// from a client that is not a router.
	stay := make(chan *openaiapitest.Chat, 1)
	go func() {
		r := postRaw(t, srvA.URL+"/v1/chat/completions", body, false)
		defer r.Body.Close()
		stay <- readChat(t, r.Body, nil)
	}()
	wholeMoved := make(chan *openaiapitest.Whole, 1)
	go func() {
		r := postRaw(t, srvA.URL+"/v1/chat/completions", whole, true)
		defer r.Body.Close()
		w, err := openaiapitest.ReadWhole(r.Body)
		if err != nil {
			t.Error(err)
		}
		wholeMoved <- w
	}()
	moving := postRaw(t, srvA.URL+"/v1/chat/completions", body, true)
	told := false
	first := readChat(t, moving.Body, func(k int) {
		if k == 20 && !told {
			told = true
			if rep := a.Control(context.Background(), protocol.ControlRequest{Op: protocol.OpHandOver}); !rep.OK {
				t.Errorf("hand over: %+v", rep)
			}
		}
	})
	moving.Body.Close()
	if first.Done || first.HandOver == nil || first.Usage != nil || first.Evolve != nil {
		t.Fatalf("the moved stream ended: done %v, handover %v, usage %v", first.Done, first.HandOver != nil, first.Usage)
	}
	h := first.HandOver
	if len(h.Resume.Output) != len(first.Content) || len(first.Content) < 20 || len(first.Content) >= n {
		t.Fatalf("handed over after %d chunks with %d output tokens", len(first.Content), len(h.Resume.Output))
	}
	// A request its router sent before the switch began is still taken,
	// and moves on at its first token.
	late := readChat(t, postRaw(t, srvA.URL+"/v1/chat/completions", body, true).Body, nil)
	if late.HandOver == nil || len(late.Content) < 1 || len(late.Content) > 3 || len(late.HandOver.Resume.Output) != len(late.Content) {
		t.Fatalf("a late request: %d chunks, handed over %v", len(late.Content), late.HandOver != nil)
	}
	if _, ok := late.HandOver.KVTransferParams["remote_request_id"].(string); !ok {
		t.Fatalf("kv_transfer_params %v", late.HandOver.KVTransferParams)
	}
	b, _ := json.Marshal(protocol.PullRequest{RemoteRequestID: late.HandOver.KVTransferParams["remote_request_id"].(string)})
	if r, err := http.Post(srvA.URL+"/evolve/v1/kv/pull", "application/json", bytes.NewReader(b)); err != nil || r.StatusCode != 200 {
		t.Fatalf("pull the late request's KV: %v %v", err, r)
	}

	// The peer goes on.
	rb, err := openaiapi.ParseObject(body)
	if err != nil {
		t.Fatal(err)
	}
	kvp, _ := json.Marshal(h.KVTransferParams)
	res, _ := json.Marshal(h.Resume)
	cont := readChat(t, postRaw(t, srvB.URL+"/v1/chat/completions", rb.With(map[string]json.RawMessage{"kv_transfer_params": kvp, "evolve_resume": res}), true).Body, nil)
	if !cont.Done || cont.HandOver != nil {
		t.Fatalf("continuation: done %v", cont.Done)
	}
	got := append(append([]string(nil), first.Content...), cont.Content...)
	if strings.Join(got, "") != strings.Join(ref.Content, "") || len(got) != n {
		t.Fatalf("the answer changed across the handover: %d chunks\n got %q\nwant %q", len(got), strings.Join(got, ""), strings.Join(ref.Content, ""))
	}
	if len(first.IDs) != 1 || len(cont.IDs) != 1 || !first.IDs[h.Resume.ID] || !cont.IDs[h.Resume.ID] || first.Roles+cont.Roles != 1 {
		t.Fatalf("ids %v then %v, role named %d times", first.IDs, cont.IDs, first.Roles+cont.Roles)
	}
	if cont.Usage["completion_tokens"] != float64(n) || cont.Usage["prompt_tokens"] != ref.Usage["prompt_tokens"] {
		t.Fatalf("usage %v, want %v", cont.Usage, ref.Usage)
	}
	ev := cont.Evolve
	if ev == nil || ev.HandedOver != 1 || ev.Engine != "b" || ev.ComputedTokens < h.Resume.Prior.ComputedTokens || ev.E2ESec <= h.Resume.Prior.E2ESec {
		t.Fatalf("the answer's story: %+v after %+v", ev, h.Resume.Prior)
	}
	if ev.PullError != "" {
		t.Fatalf("the peer did not pull the held KV: %s", ev.PullError)
	}

	// The whole answer moves too, and reads as one.
	var wm struct {
		Object   string             `json:"object"`
		HandOver *protocol.HandOver `json:"evolve_handover"`
	}
	wmw := <-wholeMoved
	if err := json.Unmarshal(wmw.JSON, &wm); err != nil || wm.HandOver == nil || wm.Object != "evolve.handover" {
		t.Fatalf("the whole answer was not handed over: %v %+v", err, wm)
	}
	// Its router read the tokens it had before it moved, named one by
	// one ahead of the continuation.
	if wmw.ID != wm.HandOver.Resume.ID || len(wmw.Bad) > 0 || len(wmw.Tokens) == 0 || !slices.Equal(wmw.Tokens, wm.HandOver.Resume.Output) ||
		wmw.Samplers[len(wmw.Samplers)-1] != wm.HandOver.Resume.Sampler {
		t.Fatalf("the whole answer's opening lines: id %q (answer %q), %d tokens (%d handed over), bad %q",
			wmw.ID, wm.HandOver.Resume.ID, len(wmw.Tokens), len(wm.HandOver.Resume.Output), wmw.Bad)
	}
	kvp, _ = json.Marshal(wm.HandOver.KVTransferParams)
	res, _ = json.Marshal(wm.HandOver.Resume)
	wb, _ := openaiapi.ParseObject(whole)
	resp = postRaw(t, srvB.URL+"/v1/chat/completions", wb.With(map[string]json.RawMessage{"kv_transfer_params": kvp, "evolve_resume": res}), true)
	wholeRest, err := openaiapitest.ReadWhole(resp.Body)
	resp.Body.Close()
	if err != nil || wholeRest.ID != wm.HandOver.Resume.ID || len(wholeRest.Tokens)+len(wm.HandOver.Resume.Output) != n {
		t.Fatalf("the whole answer's rest: %v, id %q, %d+%d tokens named", err, wholeRest.ID, len(wm.HandOver.Resume.Output), len(wholeRest.Tokens))
	}
	var wholeOut struct {
		ID      string `json:"id"`
		Choices []struct {
			Message struct{ Content string } `json:"message"`
		} `json:"choices"`
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	json.Unmarshal(wholeRest.JSON, &wholeOut)
	if wholeOut.ID != wm.HandOver.Resume.ID || wholeOut.Usage.CompletionTokens != n || len(wholeOut.Choices) != 1 ||
		wholeOut.Choices[0].Message.Content != refWhole.Choices[0].Message.Content {
		t.Fatalf("the whole answer changed: %+v", wholeOut)
	}

	// The client that is not a router got its whole answer from a.
	s := <-stay
	if !s.Done || s.HandOver != nil || len(s.Content) != n {
		t.Fatalf("a plain client's stream: done %v, handed over %v, %d chunks", s.Done, s.HandOver != nil, len(s.Content))
	}
	// Both holds were pulled: a holds nothing for anyone.
	deadline := time.Now().Add(5 * time.Second)
	for a.Control(context.Background(), protocol.ControlRequest{Op: protocol.OpStatus}).InFlight != 0 {
		if time.Now().After(deadline) {
			t.Fatal("engine a still holds handed-over KV")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// A resume that leaves nothing to write, or names no answer, is
	// refused.
	for _, bad := range []protocol.Resume{{ID: "x", Output: make([]uint32, n)}, {Output: []uint32{1}}, {ID: "x"}} {
		b, _ := json.Marshal(bad)
		r, err := http.Post(srvB.URL+"/v1/chat/completions", "application/json", bytes.NewReader(rb.With(map[string]json.RawMessage{"evolve_resume": b})))
		if err != nil {
			t.Fatal(err)
		}
		r.Body.Close()
		if r.StatusCode != 400 {
			t.Fatalf("resume %s: %d", b, r.StatusCode)
		}
	}
}

// A stream its router sent names each token and the sampler's state after
// it in a comment before the token's event (a plain client's stream has
// none); from any of them, an engine given the output so far and that
// state, and no KV, recomputes the prompt and writes the rest of the very
// same answer, as a router does when the first engine dies mid-stream;
// or a prefill engine computes that KV and a decode engine pulls it and
// writes the rest.
func TestTokenCommentsLetAnotherEngineFinishTheAnswer(t *testing.T) {
	_, srvA := startEngine(t, "a", roles.Decode, 1, nil)
	_, srvB := startEngine(t, "b", roles.Prefill, 1, nil) // a prefill engine takes whole requests too
	const n = 200
	body := `{"messages": [{"role": "user", "content": "` + strings.Repeat("an agent's question ", 20) +
		`"}], "max_tokens": 200, "seed": 8, "stream": true, "stream_options": {"include_usage": true}}`

	raw := func(resp *http.Response) []string {
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return strings.Split(string(b), "\n")
	}
	for _, l := range raw(postRaw(t, srvA.URL+"/v1/chat/completions", []byte(body), false)) {
		if strings.HasPrefix(l, ":") {
			t.Fatalf("a plain client's stream has a comment: %q", l)
		}
	}
	lines := raw(postRaw(t, srvA.URL+"/v1/chat/completions", []byte(body), true))
	type named struct {
		id      uint32
		sampler uint64
		text    string
	}
	var toks []named
	var answerID string
	var created int64
	for i, l := range lines {
		rest, ok := strings.CutPrefix(l, protocol.TokenComment)
		if !ok {
			continue
		}
		var tk named
		if _, err := fmt.Sscan(rest, &tk.id, &tk.sampler); err != nil {
			t.Fatalf("comment %q: %v", l, err)
		}
		var ch struct {
			ID      string `json:"id"`
			Created int64  `json:"created"`
			Choices []struct {
				Delta struct{ Content string } `json:"delta"`
			} `json:"choices"`
		}
		data, ok := strings.CutPrefix(lines[i+1], "data: ")
		if !ok || json.Unmarshal([]byte(data), &ch) != nil || len(ch.Choices) != 1 {
			t.Fatalf("the comment %q is not followed by its token's event but %q", l, lines[i+1])
		}
		tk.text = ch.Choices[0].Delta.Content
		answerID, created = ch.ID, ch.Created
		if tokenizer.TokenText(tk.id) != tk.text {
			t.Fatalf("comment names token %d (%q); the event writes %q", tk.id, tokenizer.TokenText(tk.id), tk.text)
		}
		toks = append(toks, tk)
	}
	if len(toks) != n {
		t.Fatalf("%d tokens named, want %d", len(toks), n)
	}

	// Engine b goes on after token k.
	const k = 73
	out := make([]uint32, k)
	for i := range out {
		out[i] = toks[i].id
	}
	res, _ := json.Marshal(protocol.Resume{ID: answerID, Created: created, Output: out, Sampler: toks[k-1].sampler})
	resumed := strings.Replace(body, `"seed": 8,`, `"seed": 8, "evolve_resume": `+string(res)+`,`, 1)
	rest := readChat(t, postRaw(t, srvB.URL+"/v1/chat/completions", []byte(resumed), true).Body, nil)
	if len(rest.Content) != n-k || !rest.Done || len(rest.IDs) != 1 || !rest.IDs[answerID] || rest.Roles != 0 {
		t.Fatalf("resumed: %d chunks, done %v, ids %v, role named %d times", len(rest.Content), rest.Done, rest.IDs, rest.Roles)
	}
	for i, c := range rest.Content {
		if c != toks[k+i].text {
			t.Fatalf("token %d: %q, the first engine wrote %q", k+i, c, toks[k+i].text)
		}
	}
	if rest.Usage["completion_tokens"] != float64(n) || rest.Evolve == nil || rest.Evolve.HandedOver != 1 || rest.Evolve.Engine != "b" {
		t.Fatalf("usage %v, evolve %+v", rest.Usage, rest.Evolve)
	}

	// Or the answer goes on in two legs, as a router splits a long one: a
	// prefill engine computes the KV of the prompt and the output so far
	// and holds it (a prefill leg with evolve_resume), and a decode engine
	// pulls it and writes the rest, computing next to nothing itself.
	_, srvP := startEngine(t, "p", roles.Prefill, 1, nil)
	ec, srvC := startEngine(t, "c", roles.Decode, 1, nil)
	rb, err := openaiapi.ParseObject([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	leg := postRaw(t, srvP.URL+"/v1/chat/completions", rb.With(map[string]json.RawMessage{
		"evolve_resume": res, "max_tokens": json.RawMessage("1"), "stream": json.RawMessage("false"), "stream_options": nil,
		"kv_transfer_params": json.RawMessage(`{"do_remote_decode": true}`),
	}), true)
	var pre struct {
		KV     json.RawMessage      `json:"kv_transfer_params"`
		Evolve *protocol.ResponseKV `json:"evolve"`
		Usage  struct {
			Prompt int `json:"prompt_tokens"`
		} `json:"usage"`
	}
	err = json.NewDecoder(leg.Body).Decode(&pre)
	leg.Body.Close()
	prompt := int(rest.Usage["prompt_tokens"].(float64))
	if err != nil || len(pre.KV) == 0 || pre.Evolve == nil || pre.Usage.Prompt != prompt+k || pre.Evolve.ComputedTokens < k {
		t.Fatalf("the resumed answer's prefill leg: %v, kv %s, usage %+v, evolve %+v", err, pre.KV, pre.Usage, pre.Evolve)
	}
	split := readChat(t, postRaw(t, srvC.URL+"/v1/chat/completions", rb.With(map[string]json.RawMessage{
		"evolve_resume": res, "kv_transfer_params": pre.KV,
	}), true).Body, nil)
	if len(split.Content) != n-k || !split.Done || len(split.IDs) != 1 || !split.IDs[answerID] || split.Roles != 0 {
		t.Fatalf("split: %d chunks, done %v, ids %v, role named %d times", len(split.Content), split.Done, split.IDs, split.Roles)
	}
	for i, c := range split.Content {
		if c != toks[k+i].text {
			t.Fatalf("split, token %d: %q, the first engine wrote %q", k+i, c, toks[k+i].text)
		}
	}
	bs := ec.cfg.Profile.BlockSize
	if e := split.Evolve; e == nil || e.Engine != "c" || e.HandedOver != 1 || e.TransferredTokens < (prompt+k)/bs*bs-bs ||
		e.ComputedTokens > bs || split.Usage["completion_tokens"] != float64(n) || split.Usage["prompt_tokens"] != float64(prompt) {
		t.Fatalf("split: usage %v, evolve %+v", split.Usage, split.Evolve)
	}
}

// An engine leaving (SIGTERM) hands a router's stream over at once and
// takes no new request, but an answer it handed over that comes back
// (no peer took it) is finished there: the same answer, to its end.
func TestALeavingEngineHandsOverAndFinishesWhatComesBack(t *testing.T) {
	a, srvA := startEngine(t, "a", roles.Decode, 1, nil)
	const n = 300
	body := []byte(`{"messages": [{"role": "user", "content": "` + strings.Repeat("the long context of an agent ", 30) +
		`"}], "max_tokens": 300, "seed": 6, "stream": true, "stream_options": {"include_usage": true}}`)
	ref := readChat(t, postRaw(t, srvA.URL+"/v1/chat/completions", body, false).Body, nil)

	left := make(chan int, 1)
	moving := postRaw(t, srvA.URL+"/v1/chat/completions", body, true)
	first := readChat(t, moving.Body, func(k int) {
		if k == 20 {
			go func() { left <- a.Leave(context.Background()) }()
		}
	})
	moving.Body.Close()
	h := first.HandOver
	if h == nil || first.Done {
		t.Fatalf("leaving, the engine did not hand the stream over (done %v)", first.Done)
	}
	rb, err := openaiapi.ParseObject(body)
	if err != nil {
		t.Fatal(err)
	}
	// Nothing new is taken, a continuation of another engine's answer
	// included.
	other := h.Resume
	other.Prior.Engine = "b"
	res, _ := json.Marshal(other)
	for _, b := range [][]byte{body, rb.With(map[string]json.RawMessage{"evolve_resume": res})} {
		req, _ := http.NewRequest("POST", srvA.URL+"/v1/chat/completions", bytes.NewReader(b))
		req.Header.Set(protocol.HeaderHandOver, protocol.HandOverNever)
		r, err := http.DefaultClient.Do(req)
		if err != nil || r.StatusCode != 503 {
			t.Fatalf("a leaving engine took a new request: %v %v", err, r)
		}
		r.Body.Close()
	}
	// Its own answer comes back, the hold released, and is finished here.
	pull, _ := json.Marshal(protocol.PullRequest{RemoteRequestID: h.KVTransferParams["remote_request_id"].(string)})
	if r, err := http.Post(srvA.URL+"/evolve/v1/kv/pull", "application/json", bytes.NewReader(pull)); err != nil || r.StatusCode != 200 {
		t.Fatalf("release the hold: %v %v", err, r)
	}
	res, _ = json.Marshal(h.Resume)
	req, _ := http.NewRequest("POST", srvA.URL+"/v1/chat/completions", bytes.NewReader(rb.With(map[string]json.RawMessage{"evolve_resume": res})))
	req.Header.Set(protocol.HeaderHandOver, protocol.HandOverNever)
	r, err := http.DefaultClient.Do(req)
	if err != nil || r.StatusCode != 200 {
		t.Fatalf("the answer coming back: %v %v", err, r)
	}
	rest := readChat(t, r.Body, nil)
	r.Body.Close()
	got := strings.Join(first.Content, "") + strings.Join(rest.Content, "")
	if !rest.Done || rest.HandOver != nil || len(first.Content)+len(rest.Content) != n || got != strings.Join(ref.Content, "") {
		t.Fatalf("finished here: done %v, moved again %v, %d+%d chunks, same text %v", rest.Done, rest.HandOver != nil,
			len(first.Content), len(rest.Content), got == strings.Join(ref.Content, ""))
	}
	select {
	case k := <-left:
		if k != 0 {
			t.Fatalf("Leave returned with %d in flight", k)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Leave did not return once the engine's work was done")
	}
}

// An answer that goes on here after its engine failed (evolve_resume)
// has a client mid-read: it waits ahead of the requests that arrived
// before it and are still queued, rather than behind them.
func TestAResumedAnswerWaitsAheadOfQueuedRequests(t *testing.T) {
	e, srv := startEngineConfig(t, Config{ID: "a", Role: roles.Decode, Speedup: 4, Sim: stepmodel.Config{MaxNumSeqs: 1}}, nil)
	chat := func(words, maxTokens int) []byte {
		return []byte(fmt.Sprintf(`{"messages": [{"role": "user", "content": %q}], "max_tokens": %d}`,
			strings.Repeat("context ", words), maxTokens))
	}
	// One request runs (the engine takes one at a time), two wait.
	runs, err := openaiapi.ParseObject(chat(40, 2000))
	if err != nil {
		t.Fatal(err)
	}
	running := postRaw(t, srv.URL+"/v1/chat/completions", runs.With(map[string]json.RawMessage{"stream": json.RawMessage("true")}), false)
	defer running.Body.Close()
	done := make(chan string, 3)
	post := func(name string, body []byte) {
		go func() {
			r, err := http.Post(srv.URL+"/v1/chat/completions", "application/json", bytes.NewReader(body))
			if err == nil {
				io.Copy(io.Discard, r.Body)
				r.Body.Close()
				if r.StatusCode != 200 {
					name += fmt.Sprintf(" (%d)", r.StatusCode)
				}
			} else {
				name += " (" + err.Error() + ")"
			}
			done <- name
		}()
	}
	post("queued-1", chat(41, 20))
	post("queued-2", chat(42, 20))
	deadline := time.Now().Add(5 * time.Second)
	for e.Heartbeat().Waiting < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("the engine has %d waiting", e.Heartbeat().Waiting)
		}
		time.Sleep(5 * time.Millisecond)
	}
	rb, err := openaiapi.ParseObject(chat(43, 20))
	if err != nil {
		t.Fatal(err)
	}
	res, _ := json.Marshal(protocol.Resume{ID: "chatcmpl-elsewhere", Created: 1,
		Output: []uint32{tokenizer.Word(1), tokenizer.Word(2), tokenizer.Word(3)}})
	post("resumed", rb.With(map[string]json.RawMessage{"evolve_resume": res}))
	var order []string
	for range 3 {
		select {
		case name := <-done:
			order = append(order, name)
		case <-time.After(20 * time.Second):
			t.Fatalf("answers so far, in order: %v", order)
		}
	}
	if order[0] != "resumed" || !slices.Contains(order, "queued-1") || !slices.Contains(order, "queued-2") {
		t.Fatalf("answers in order %v: the resumed one should come first", order)
	}
}

// A leaving engine whose router went away after reading a hand-over (no
// peer will pull that KV) stops waiting for the pull once nothing else is
// in flight for orphanHoldWait, rather than for its whole grace, and ends
// the hold.
func TestALeavingEngineGivesUpAHoldNoPeerPulls(t *testing.T) {
	a, srvA := startEngine(t, "a", roles.Decode, 1, nil)
	a.orphanHoldWait = 400 * time.Millisecond
	body := []byte(`{"messages": [{"role": "user", "content": "an agent's context"}], "max_tokens": 300, "stream": true}`)
	left := make(chan int, 1)
	var handed time.Time
	moving := postRaw(t, srvA.URL+"/v1/chat/completions", body, true)
	first := readChat(t, moving.Body, func(k int) {
		if k == 20 {
			go func() { left <- a.Leave(context.Background()) }()
		}
	})
	handed = time.Now()
	moving.Body.Close()
	if first.HandOver == nil {
		t.Fatalf("leaving, the engine did not hand the stream over (done %v)", first.Done)
	}
	if a.Heartbeat().Held != 1 {
		t.Fatalf("held after the hand-over: %+v", a.Heartbeat())
	}
	select {
	case k := <-left:
		if waited := time.Since(handed); k != 0 || waited < a.orphanHoldWait {
			t.Fatalf("Leave returned %d in flight after %v", k, waited)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Leave still waits for a hold no peer pulls")
	}
	// The hold is over: a late pull finds nothing.
	pull, _ := json.Marshal(protocol.PullRequest{RemoteRequestID: first.HandOver.KVTransferParams["remote_request_id"].(string)})
	r, err := http.Post(srvA.URL+"/evolve/v1/kv/pull", "application/json", bytes.NewReader(pull))
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode == 200 || a.Heartbeat().Held != 0 {
		t.Fatalf("a pull after the hold ended: %d; held %d", r.StatusCode, a.Heartbeat().Held)
	}
}
