package orchestrator

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/evolvellm/evolve/kv"
	"github.com/evolvellm/evolve/openaiapi"
	"github.com/evolvellm/evolve/orchestrator/routing"
	"github.com/evolvellm/evolve/protocol"
	"github.com/evolvellm/evolve/roles"
)

// An answer goes on elsewhere when its engine stops writing it. Two
// things make it stop: the engine hands it over (a decode node switching
// to prefill ends it with a protocol.HandOver: moveOn), or the engine
// fails mid-stream (resume, from the tokens the client has read, which
// an evolve engine's stream names in protocol.TokenComment lines). Either
// way the client reads one answer: the same id, and the tokens the first
// engine would have written.

// errHandedOver: the leg ended with a continuation (attempt.handOver).
var errHandedOver = errors.New("the engine handed the request over")

// errFailedMidStream: the engine died after the client had read part of
// the answer, which can go on elsewhere (attempt.canResume).
type errFailedMidStream struct{ err error }

func (e *errFailedMidStream) Error() string { return e.err.Error() }
func (e *errFailedMidStream) Unwrap() error { return e.err }

// goOn continues the answer while its last leg ended without finishing
// it (err from forward), and returns how it ended: nil when the client
// has the whole answer.
func (a *attempt) goOn(err error) error {
	for {
		var mid *errFailedMidStream
		switch {
		case errors.Is(err, errHandedOver):
			err = a.moveOn()
		case errors.As(err, &mid):
			failed := a.decode
			a.o.release(failed)
			a.decode = ""
			a.o.log.Warn("engine failed mid-stream; continuing the answer on another node", "request", a.reqID, "node", failed,
				"output_tokens", len(a.out), "err", mid.err)
			a.failed[failed] = true
			a.interruptedOn = failed
			a.o.interrupted(failed, false)
			if a.vllm != nil {
				err = a.resumeVLLM(mid.err)
				continue
			}
			r := protocol.Resume{ID: a.answerID, Created: a.created, Output: a.out, Sampler: a.sampler}
			err = a.resume(r, "", resumeEngineFailed, mid.err)
		default:
			return err
		}
	}
}

// avoidHandingOver moves a decode leg not yet sent away from a node that
// is handing its decodes over, when a peer can take it.
func (a *attempt) avoidHandingOver() {
	if !a.o.handingOver(a.decode) {
		return
	}
	to, url := a.o.claimDecodePeer(map[string]bool{a.decode: true})
	if to == "" {
		return // it goes there and moves on at its first token
	}
	a.o.release(a.decode)
	a.decode, a.urls[to] = to, url
}

// moveOn continues a request its decode node handed over (a role
// switch) on a peer decode node: the client's request again, with the
// continuation, whose answer goes on in the client's answer. It tries up
// to maxAttempts peers. When none goes on, the node that handed the
// answer over finishes it where its KV is, as a node that cannot hand
// over does; failing that, another node recomputes it (resume).
func (a *attempt) moveOn() error {
	h := a.handOver
	a.handOver = nil
	a.moves++
	from := a.decode
	a.out = append(a.out[:0], h.Resume.Output...)
	a.sampler, a.answerID, a.created = h.Resume.Sampler, h.Resume.ID, h.Resume.Created
	kvp, _ := json.Marshal(h.KVTransferParams)
	res, _ := json.Marshal(h.Resume)
	body := a.body.With(map[string]json.RawMessage{"kv_transfer_params": kvp, "evolve_resume": res})
	tried := map[string]bool{from: true}
	for id := range a.failed {
		tried[id] = true
	}
	var err error
	for try := 0; try < maxAttempts; try++ {
		to, url := a.o.claimDecodePeer(tried)
		if to == "" {
			break
		}
		tried[to] = true
		a.urls[to] = url
		a.decode, a.leaving = to, from
		a.o.log.Debug("handed over", "request", a.reqID, "from", from, "to", to, "output_tokens", len(h.Resume.Output))
		err = a.forward(url, body)
		if err == nil || errors.Is(err, errHandedOver) || a.legAnswered {
			return err
		}
		if a.r.Context().Err() != nil {
			// The client went away before the peer took the KV: free it
			// now rather than when its hold times out.
			a.releaseHold(a.urls[from], kvp)
			return err
		}
		a.o.log.Warn("peer refused a handed-over request", "request", a.reqID, "node", to, "err", err)
		a.o.release(to)
		a.decode, a.leaving = from, ""
	}
	a.o.met.handOvers.WithLabelValues("failed").Inc()
	// Its KV stays cached where it was held: the node that handed the
	// answer over recomputes little of it.
	a.releaseHold(a.urls[from], kvp)
	if err == nil {
		err = errors.New("no serving decode node to continue on")
	}
	err = fmt.Errorf("node %s handed the request over and no peer went on with it: %w", from, err)
	a.o.log.Warn("no peer went on with a handed-over answer; finishing it where it was", "request", a.reqID, "node", from, "err", err)
	return a.resume(h.Resume, from, resumeNoPeer, err)
}

// Why resume continues an answer (the cause label of
// evolve_router_resumed_answers_total).
const (
	resumeEngineFailed = "engine_failed"
	resumeNoPeer       = "no_peer"
)

// resume continues the answer from r on a node that pulls or recomputes
// the KV of the prompt and the output so far, or has a prefill node
// compute it (placeResume): first on home when given (a.decode,
// whose claim the request holds: the node that held that KV, which then
// finishes the answer where it is), then on the least claimed node that
// can (claimResumer: the one holding most of the prompt's KV) and has not
// failed the request. cause is why the
// answer needs it; when no node goes on, the client is told so in its
// stream.
func (a *attempt) resume(r protocol.Resume, home, why string, cause error) error {
	a.resumes++
	res, _ := json.Marshal(r)
	err := cause
	if a.resumes <= maxAttempts {
		for try := 0; try < maxAttempts; try++ {
			to, url := home, a.urls[home]
			if try > 0 || home == "" {
				if to, url = a.o.claimResumer(a.failed, a.chain); to == "" {
					break
				}
			}
			if to == home {
				a.stayURL = url // not to be handed over again
			}
			a.urls[to], a.decode = url, to
			// Home holds the KV of the output so far: it never needs a
			// prefill node's.
			body := a.placeResume(to, res, len(r.Output), to != home)
			done, ferr := a.continueOn(to, url, body, why, a.dropResumePrefill)
			if done {
				return ferr
			}
			err = ferr
		}
	}
	a.o.met.resumed.WithLabelValues(why, "failed").Inc()
	// A whole answer the client has not begun to read is routed again
	// from the start (serveGenerate): it is not lost yet.
	if why == resumeEngineFailed && a.clientHasBytes {
		a.o.interrupted(a.interruptedOn, true)
	}
	err = fmt.Errorf("no node could continue the answer (%v)", err)
	if a.clientHasBytes {
		a.streamError(err)
	}
	return err
}

// continueOn sends node to (at url) a leg that continues the answer
// (why: resume's cause) and says whether the answer is over: it went on
// there, or the client left. When the node could not go on, it is
// failed for this answer and its claim dropped. after, if set, runs once
// the leg ends.
func (a *attempt) continueOn(to, url string, body []byte, why string, after func()) (bool, error) {
	a.resuming = why
	ferr := a.forward(url, body)
	if after != nil {
		after()
	}
	if ferr == nil || errors.Is(ferr, errHandedOver) || a.legAnswered {
		return true, ferr
	}
	a.resuming = ""
	if a.r.Context().Err() != nil {
		return true, ferr
	}
	a.o.log.Warn("node could not continue an answer", "request", a.reqID, "node", to, "err", ferr)
	a.failed[to] = true
	a.o.release(to)
	a.decode = ""
	return false, ferr
}

// placeResume readies node to to go on with the answer from res (with
// outLen output tokens so far) and returns the body to send it. When to
// is a decode node that would recompute more than
// routing.DefaultLocalPrefillTokens of the prompt and the output so far,
// even after pulling what peers hold, and split allows it, a prefill
// node computes that KV (resumePrefill) and to pulls it, as the decode
// leg of a split request does: the recompute does not stall the streams
// to is decoding. Otherwise to pulls what peers hold of the prompt
// (resumeFetches) and recomputes the rest itself.
func (a *attempt) placeResume(to string, res json.RawMessage, outLen int, split bool) []byte {
	// One look at the cluster serves both nodes' plans and the choice of
	// the prefill node.
	var m kv.Match
	v := a.o.view(a.chain, &m, a.failed)
	plan := a.resumeFetches(v, &m, to)
	if recompute := len(a.p.Tokens) - plan.covered*v.BlockSize + outLen; split && plan.decode &&
		recompute > routing.DefaultLocalPrefillTokens {
		if kvp, ok := a.resumePrefill(v, &m, to, res, recompute); ok {
			return a.body.With(map[string]json.RawMessage{"kv_transfer_params": kvp, "evolve_resume": res})
		}
	}
	a.startResumeFetches(plan)
	return a.body.With(map[string]json.RawMessage{"evolve_resume": res})
}

// resumePrefill has a serving prefill node (claimResumePrefill) compute
// and hold the KV of the prompt and the output so far for decode node
// to, pulling first what peers hold of the prompt; it returns the
// kv_transfer_params of the hold, or false when no prefill node did it
// (to then recomputes that KV itself). The prefill node's claim lasts
// until to answers (dropResumePrefill).
func (a *attempt) resumePrefill(v *routing.View, m *kv.Match, to string, res json.RawMessage, recompute int) (json.RawMessage, bool) {
	p, url := a.o.claimResumePrefill(a.failedAnd(to), m)
	if p == "" {
		return nil, false
	}
	a.urls[p] = url
	a.startResumeFetches(a.resumeFetches(v, m, p))
	return a.prefillForResume(p, url, to, a.body, map[string]json.RawMessage{"evolve_resume": res}, recompute)
}

// failedAnd is the nodes that failed this answer, and to.
func (a *attempt) failedAnd(to string) map[string]bool {
	exclude := map[string]bool{to: true}
	for id := range a.failed {
		exclude[id] = true
	}
	return exclude
}

// prefillForResume runs the prefill leg of a resumed answer (body, with
// extra) on prefill node p, at url, for decode node to, and returns its
// kv_transfer_params; false when p could not (it is released, and to
// recomputes that KV itself). p's claim lasts until to answers
// (dropResumePrefill).
func (a *attempt) prefillForResume(p, url, to string, body openaiapi.Body, extra map[string]json.RawMessage, recompute int) (json.RawMessage, bool) {
	kvp, err := a.prefillLeg(url, body, extra)
	if err != nil {
		// Not a failure of the answer: a node that refuses (draining)
		// still serves its KV to the decode node.
		a.o.log.Warn("prefill node could not compute a resumed answer's KV; the decode node recomputes it", "request", a.reqID,
			"node", p, "decode", to, "err", err)
		a.o.release(p)
		return nil, false
	}
	a.resumePrefillNode, a.resumePrefillKV = p, kvp
	a.o.met.resumePrefilled.Inc()
	a.o.log.Debug("a prefill node computed a resumed answer's KV", "request", a.reqID, "node", p, "decode", to,
		"decode_would_recompute", recompute)
	return kvp, true
}

// dropResumePrefill ends the claim of the prefill node that computed a
// resumed answer's KV (resumePrefill) once the decode leg has ended or
// answered: an engine pulls the KV before it answers, and one that never
// answered leaves the hold to be freed now rather than when it times out.
func (a *attempt) dropResumePrefill() {
	if a.resumePrefillNode == "" {
		return
	}
	if !a.legAnswered {
		a.releaseHold(a.urls[a.resumePrefillNode], a.resumePrefillKV)
	}
	a.o.release(a.resumePrefillNode)
	a.resumePrefillNode, a.resumePrefillKV = "", nil
}

// resumePlan is what a node readied for a resumed answer pulls of its
// prompt's KV (resumeFetches).
type resumePlan struct {
	node    string
	decode  bool // the node decodes
	fetches []routing.Fetch
	held    int // prompt blocks the node holds (GPU and host)
	covered int // and those with the pulls
}

// resumeFetches plans what node to pulls, before it goes on with an
// answer or computes its KV, of the blocks of the prompt that peers hold
// beyond what to holds (routing.PeerFetches: a contiguous extension,
// where pulling beats recomputing), from v and m, the view without the
// nodes that failed the request and the directory's match of the prompt.
// A node that failed this request is no source: the directory still
// lists what it held until its heartbeats stop
// (kv.Directory.SourcesWithout).
func (a *attempt) resumeFetches(v *routing.View, m *kv.Match, to string) resumePlan {
	plan := resumePlan{node: to}
	var target *routing.Node
	sources := make(map[kv.NodeID]string, len(v.Nodes))
	failed := map[kv.NodeID]bool{}
	for i := range v.Nodes {
		n := &v.Nodes[i]
		switch {
		case n.ID == to:
			target = n
		case a.failed[n.ID]:
			failed[n.Dir] = true
		}
		if !n.SelfManagedKV {
			sources[n.Dir] = n.ID
		}
	}
	if target == nil {
		return plan
	}
	plan.decode = target.Role == roles.Decode
	plan.held = m.For(target.Dir).Local
	plan.covered = plan.held
	if len(a.chain) == 0 {
		return plan
	}
	// Match may name a failed node the holder of a run: take live ones,
	// from where to's prefix ends (m stays as it is for other nodes).
	live := *m
	a.o.c.mu.Lock()
	live.Cluster, live.Sources = a.o.c.dir.SourcesWithout(a.chain, plan.held, func(n kv.NodeID) bool { return failed[n] }, nil)
	a.o.c.mu.Unlock()
	plan.fetches = routing.PeerFetches(target, &live, v.BlockSize, sources)
	if k := len(plan.fetches); k > 0 {
		plan.covered = plan.fetches[k-1].End // they come in chain order
	}
	return plan
}

// startResumeFetches starts a resumeFetches plan and waits for its pulls
// to start, as a routed request's fetches do: the node's engine then
// holds the request until they land, and recomputes only what no live
// node holds.
func (a *attempt) startResumeFetches(plan resumePlan) {
	if len(plan.fetches) == 0 {
		return
	}
	blocks := plan.covered - plan.held
	a.o.kvc.fetchedBlocks.Add(int64(blocks))
	a.o.met.resumePulled.Add(float64(blocks))
	a.o.log.Debug("fetching a resumed answer's prompt KV from peers", "request", a.reqID, "node", plan.node,
		"blocks", blocks, "held_there", plan.held, "prompt_blocks", len(a.chain))
	a.o.startFetches(routing.Decision{Fetches: plan.fetches}, a.chain)
}

// interrupted counts an answer node id was streaming when it failed, or
// (lost) one of those that no node could continue.
func (o *Orchestrator) interrupted(id string, lost bool) {
	o.c.mu.Lock()
	defer o.c.mu.Unlock()
	n := o.c.nodes[id]
	if n == nil {
		return
	}
	if lost {
		n.lost++
	} else {
		n.interrupted++
		n.failedAt = time.Now()
	}
	o.c.changed(id)
}

// canResume says whether the answer the client is reading (or, whole,
// waiting for) can go on elsewhere should its engine fail now: its engine
// named the tokens it sent (protocol.TokenComment), and the answer has
// not moved too often.
func (a *attempt) canResume() bool {
	if a.vllm != nil {
		return a.canResumeVLLM()
	}
	return len(a.out) > 0 && !a.outLost && a.answerID != "" && a.resumes < maxAttempts
}

// readWhole reads an engine's whole answer. An evolve engine opens the
// one it writes for a router with lines that name the answer and each
// token as it samples it (protocol.AnswerComment, TokenComment): they
// are kept, as a stream's are, so that should the engine die before the
// answer's JSON, the answer goes on elsewhere from them (canResume).
func (a *attempt) readWhole(body io.Reader) ([]byte, error) {
	rd := bufio.NewReader(body)
	for {
		line, err := rd.ReadBytes('\n')
		if len(line) > 0 && line[0] == ':' {
			if err != nil {
				return nil, fmt.Errorf("the answer ended before its JSON: %w", cmp.Or(err, io.ErrUnexpectedEOF))
			}
			a.wholeComment(line)
			continue
		}
		switch {
		case err == io.EOF:
			return line, nil // the answer, on a last line
		case err != nil:
			return nil, err
		}
		rest, err := io.ReadAll(rd)
		return append(line, rest...), err
	}
}

// wholeComment reads one of the lines that open a whole answer.
func (a *attempt) wholeComment(line []byte) {
	if rest, ok := bytes.CutPrefix(line, []byte(protocol.AnswerComment)); ok {
		id, created, _ := bytes.Cut(bytes.TrimSpace(rest), []byte(" "))
		c, err := strconv.ParseInt(string(created), 10, 64)
		if len(id) == 0 || err != nil {
			a.outLost = true // no id to go on with
			return
		}
		a.answerID, a.created = string(id), c
		return
	}
	if id, s, comment, readable := tokenSeen(line); comment {
		a.outLost = a.outLost || !readable
		if readable {
			a.out, a.sampler = append(a.out, id), s
		}
	}
}

// tokenSeen reads a protocol.TokenComment line: comment says whether the
// line is one, readable whether its token and sampler state could be read.
func tokenSeen(line []byte) (id uint32, sampler uint64, comment, readable bool) {
	rest, comment := bytes.CutPrefix(line, []byte(protocol.TokenComment))
	if !comment {
		return 0, 0, false, false
	}
	idText, samplerText, _ := bytes.Cut(bytes.TrimSpace(rest), []byte(" "))
	i, err1 := strconv.ParseUint(string(idText), 10, 32)
	s, err2 := strconv.ParseUint(string(samplerText), 10, 64)
	if err1 != nil || err2 != nil {
		return 0, 0, true, false
	}
	return uint32(i), s, true, true
}

// noteAnswer takes the answer's id and creation time from its first
// event's data, which a continuation keeps.
func (a *attempt) noteAnswer(data []byte) {
	if a.answerID != "" {
		return
	}
	var m struct {
		ID      string `json:"id"`
		Created int64  `json:"created"`
	}
	if json.Unmarshal(data, &m) == nil {
		a.answerID, a.created = m.ID, m.Created
	}
}

// releaseHold takes (and drops) the KV an engine at url holds for the
// request (a prefill leg's, or a handed-over decode's).
func (a *attempt) releaseHold(url string, params json.RawMessage) {
	var p struct {
		ID string `json:"remote_request_id"`
	}
	if json.Unmarshal(params, &p) != nil || p.ID == "" {
		return
	}
	b, _ := json.Marshal(map[string]string{"remote_request_id": p.ID})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "POST", url+"/evolve/v1/kv/pull", bytes.NewReader(b))
	if err != nil {
		return
	}
	req.Header.Set("Content-Type", "application/json")
	if resp, err := a.o.http.Do(req); err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

// isHandOver says whether an answer, or a streamed event's data, is an
// engine's continuation (protocol.HandOver) rather than the answer.
func isHandOver(b []byte) bool { return bytes.HasPrefix(b, []byte(`{"evolve_handover":`)) }

// takeHandOver reads a continuation into a.handOver; it returns
// errHandedOver, or why the continuation cannot be read.
func (a *attempt) takeHandOver(b []byte) error {
	var m struct {
		H *protocol.HandOver `json:"evolve_handover"`
	}
	if err := json.Unmarshal(b, &m); err != nil || m.H == nil {
		return fmt.Errorf("the engine handed the request over in a continuation that cannot be read: %v", err)
	}
	a.handOver = m.H
	return errHandedOver
}
