package orchestrator

// A leg is what the router sends one engine for a request: the prefill
// leg of a split request, the decode leg, or the whole request, and the
// continuation of an answer elsewhere. This file posts a leg, reads what
// the engine says back and relays a streamed answer to the client.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/evolvellm/evolve/openaiapi"
	"github.com/evolvellm/evolve/protocol"
)

func (a *attempt) post(url string, body []byte) (*http.Response, error) {
	if url == "" {
		return nil, errors.New("node has no address")
	}
	path := a.path
	if a.legPath != "" {
		path = a.legPath
	}
	if a.body.Has(openaiapi.PromptTokensMember) && !a.o.readsPromptTokens(url) {
		body = a.withMessages(body)
	}
	ctx, leg := a.o.legs.begin(a.r.Context(), url)
	req, err := http.NewRequestWithContext(ctx, "POST", url+path, bytes.NewReader(body))
	if err != nil {
		a.o.legs.end(leg)
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", a.reqID)
	// This router continues an answer elsewhere: one handed over, or one
	// whose engine fails mid-stream.
	if url == a.stayURL {
		req.Header.Set(protocol.HeaderHandOver, protocol.HandOverNever)
	} else {
		req.Header.Set(protocol.HeaderHandOver, protocol.HandOverAllowed)
	}
	req.Header.Set(protocol.HeaderWholeTokens, "1") // readWhole keeps them
	resp, err := a.o.http.Do(req)
	if err != nil {
		if why := leg.endedWhy.Load(); why != nil {
			err = fmt.Errorf("%w: %w", *why, err)
		}
		a.o.legs.end(leg)
		return nil, err
	}
	resp.Body = &watchedBody{ReadCloser: resp.Body, w: a.o.legs, l: leg}
	return resp, nil
}

// readAnswer reads an engine's whole answer (at most limit bytes) and
// closes it; an answer other than 200 is an engineError.
func readAnswer(resp *http.Response, limit int64, what string) ([]byte, error) {
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, limit))
	if err != nil {
		return nil, fmt.Errorf("read %s answer: %w", what, err)
	}
	if resp.StatusCode != 200 {
		return nil, engineError(resp.StatusCode, b)
	}
	return b, nil
}

// clientError is an engine's refusal that is the client's fault: passed
// on to the client, not retried.
type clientError struct {
	status int
	body   []byte
}

func (e *clientError) Error() string { return fmt.Sprintf("engine answered %d: %s", e.status, e.body) }

// engineError is an engine's refusal; a 4xx other than 429 is the client's
// fault and is passed on, not retried, but for a 401 or 403: the engine
// refused the router's engine token, the cluster's fault.
func engineError(status int, body []byte) error {
	if status == http.StatusUnauthorized || status == http.StatusForbidden {
		return fmt.Errorf("engine refused the router's engine token (%d): give the engine and the orchestrator the same token "+
			"(by default the event plane's: the engine's --nats nats://TOKEN@host and the orchestrator's --nats-token; else --token and --engine-token): %s",
			status, bytes.TrimSpace(body))
	}
	if status >= 400 && status < 500 && status != 429 {
		return &clientError{status: status, body: body}
	}
	if status == http.StatusServiceUnavailable {
		var e struct {
			Error struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		if json.Unmarshal(body, &e) == nil && (e.Error.Code == "wrong_role" || e.Error.Code == "engine_draining") {
			return &legRefused{code: e.Error.Code, msg: string(bytes.TrimSpace(body))}
		}
	}
	return fmt.Errorf("engine answered %d: %s", status, bytes.TrimSpace(body))
}

// legRefused is an engine's refusal of a leg for its role or its draining,
// before any work: the node began a switch or a shutdown after the router
// chose it. The request is sound and may go elsewhere at once.
type legRefused struct{ code, msg string }

func (e *legRefused) Error() string { return "engine refused the leg (" + e.code + "): " + e.msg }

// forward sends body to the node and passes its answer to the client as it
// arrives. Whole answers are read first, so a failure can still be retried.
func (a *attempt) forward(url string, body []byte) error {
	a.legAnswered = false
	resp, err := a.post(url, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		err := engineError(resp.StatusCode, b)
		var ce *clientError
		if errors.As(err, &ce) && a.moves == 0 && a.resumes == 0 { // a node refusing a continuation is not the client's fault
			a.clientHasBytes = true
			a.answerHeaders("application/json")
			a.w.WriteHeader(ce.status)
			a.w.Write(ce.body)
		}
		return err
	}
	if !a.p.Req.Stream {
		b, err := a.readWhole(resp.Body)
		if err != nil {
			err = fmt.Errorf("read answer: %w", err)
			if a.r.Context().Err() == nil && a.canResume() {
				return &errFailedMidStream{err: err}
			}
			return err
		}
		a.legAnswers()
		if isHandOver(b) {
			return a.takeHandOver(b)
		}
		a.countUsage(b)
		a.noteFinish(b)
		b = withPrefillKV(a.trueUsage(b), a.prefillKV)
		a.clientHasBytes = true
		a.answerHeaders("application/json")
		a.w.WriteHeader(200)
		a.w.Write(b)
		return nil
	}
	if !a.clientHasBytes {
		a.answerHeaders("text/event-stream")
		a.w.Header().Set("Cache-Control", "no-cache")
	}
	done, handedOver, skipBlank := false, false, false
	// delivered: the client has [DONE], whole; a client that closes then
	// (as many do at once) got its answer.
	delivered := false
	// open: the client has an event's data line, not yet its end; toks
	// are the tokens that event carries (protocol.TokenComment, or a vLLM
	// chunk's token_ids), if named.
	open, named := false, false
	var toks []uint32
	var tokSampler uint64
	seen := func() { // the client has the named tokens' whole event
		if open && named {
			a.out, a.sampler = append(a.out, toks...), tokSampler
		}
		open, named = false, false
	}
	var herr error
	werr, rerr := relaySSE(bufio.NewReader(resp.Body), a.w, a.flush, func(line []byte) []byte {
		blank := len(bytes.TrimSpace(line)) == 0
		if skipBlank && blank {
			skipBlank = false
			return nil // the end of the continuation's event
		}
		if id, s, comment, readable := tokenSeen(line); comment {
			// The router's alone. One it cannot read leaves the output it
			// keeps incomplete: the answer can no longer go on elsewhere.
			toks, tokSampler, named = append(toks[:0], id), s, readable
			a.outLost = a.outLost || !readable
			return nil
		}
		if !a.clientHasBytes {
			a.clientHasBytes = true
			a.w.WriteHeader(200)
		}
		if blank {
			seen()
			// The [DONE] line was written (a failed write ends the relay).
			delivered = delivered || done
			return line
		}
		if data, ok := bytes.CutPrefix(line, []byte("data: ")); ok {
			open = true
			a.noteAnswer(data)
			a.legAnswers()
			if isHandOver(data) {
				// The client never sees it: the answer goes on elsewhere.
				handedOver, skipBlank = true, true
				herr = a.takeHandOver(data)
				return nil
			}
			if bytes.HasPrefix(line, []byte("data: [DONE]")) {
				done = true
			} else {
				if a.vllm != nil {
					var ids []uint32
					ids, data = a.vllmData(bytes.TrimRight(data, "\r\n"))
					toks, named = append(toks[:0], ids...), true
					line = append(append([]byte("data: "), data...), '\n')
				}
				a.countChunk(line[len("data: "):])
				a.noteFinish(line[len("data: "):])
				usage := bytes.Contains(line, []byte(`"usage":{`))
				if usage || a.prefillKV != nil && bytes.Contains(line, []byte(`"evolve":`)) {
					ext := bytes.TrimRight(line[len("data: "):], "\r\n")
					if usage {
						ext = a.trueUsage(ext)
					}
					ext = withPrefillKV(ext, a.prefillKV)
					line = append(append([]byte("data: "), ext...), '\n')
				}
			}
		}
		return line
	})
	switch {
	case delivered, done && errors.Is(rerr, io.EOF) && werr == nil:
		return nil
	case werr != nil:
		return fmt.Errorf("client went away: %w", werr)
	case handedOver && errors.Is(rerr, io.EOF):
		if !errors.Is(herr, errHandedOver) {
			a.streamError(herr)
		}
		return herr
	}
	if cerr := a.r.Context().Err(); cerr != nil {
		return fmt.Errorf("client went away: %w", cerr) // the engine did not fail
	}
	if open {
		// The client has the last event's data: end the event, so that it
		// reads it and what follows as separate events.
		a.w.Write([]byte("\n"))
		a.flush()
		seen()
	}
	err = fmt.Errorf("the engine serving this request failed mid-stream: %v", rerr)
	if a.clientHasBytes {
		if a.canResume() {
			return &errFailedMidStream{err: err}
		}
		if a.vllm != nil && a.vllm.refused != "" {
			a.o.log.Warn("a vLLM engine failed mid-stream, and its answer cannot go on elsewhere", "request", a.reqID,
				"node", a.decode, "why", a.vllm.refused)
		}
		a.streamError(err)
	}
	return fmt.Errorf("stream from engine: %w", rerr)
}

// flush sends what was written to the client.
func (a *attempt) flush() {
	if f, ok := a.w.(http.Flusher); ok {
		f.Flush()
	}
}

// streamError ends a stream the client is reading with an error event:
// mid-stream, the client is told in the stream and never left hanging.
func (a *attempt) streamError(err error) {
	// The cause (an engine's address, a dial error) is the operator's:
	// the log keeps it, and the agent gets the request id to match.
	a.o.log.Error("answer cut: its engine failed and no node went on with it", "request", a.reqID, "node", a.decode, "err", err)
	e := openaiapi.Unavailable("engine_failed", "the engine writing this answer failed and no other could go on with it (request %s)", a.reqID)
	b, _ := json.Marshal(e.Body())
	fmt.Fprintf(a.w, "data: %s\n\ndata: [DONE]\n\n", b)
	a.flush()
}

// legAnswers notes the current leg's first byte: the prefill is over,
// and a node that handed the request over, or its prefill node, holds
// nothing of it any more (the engine pulled the KV before answering).
func (a *attempt) legAnswers() {
	a.legAnswered = true
	a.firstToken()
	a.freePrefill()
	a.dropResumePrefill()
	if a.resuming != "" {
		a.o.met.resumed.WithLabelValues(a.resuming, "continued").Inc()
		a.resuming = ""
	}
	if a.leaving != "" {
		// The peer went on with the answer it was handed.
		a.o.met.handOvers.WithLabelValues("continued").Inc()
		a.o.handedOver(a.leaving)
		a.o.release(a.leaving)
		a.leaving = ""
	}
}

// relaySSE copies server-sent events from rd to w line by line until rd
// ends, writing what seen makes of each line, and flushing at the
// end of each event, unless the next event is already buffered whole (the
// relay fell behind), so that one write carries both. It returns the
// first error writing (the client went away) or else reading (io.EOF
// when the stream ended); whatever was written is flushed, and nothing is
// flushed when nothing was written.
func relaySSE(rd *bufio.Reader, w io.Writer, flush func(), seen func(line []byte) []byte) (werr, rerr error) {
	dirty := false // written since the last flush; a relay that wrote nothing flushes nothing, so a failure can be retried
	for {
		line, err := readLine(rd, maxSSELine)
		// A line cut short by the stream's end is never passed on: the
		// client would join it to whatever follows.
		if len(line) > 0 && line[len(line)-1] == '\n' {
			// A line seen drops is not written at all: an empty write
			// would still send the answer's header.
			if line = seen(line); len(line) > 0 {
				if _, werr := w.Write(line); werr != nil {
					return werr, nil
				}
				dirty = true
				if len(bytes.TrimSpace(line)) == 0 && !eventBuffered(rd) {
					flush()
					dirty = false
				}
			}
		}
		if err != nil {
			if dirty {
				flush()
			}
			return nil, err
		}
	}
}

// maxSSELine bounds one line of an engine's stream: a token's event is a
// few hundred bytes, its last (usage, the evolve object) a few KiB; an
// engine sending more without a newline is broken or hostile, and the
// router would hold all of it in memory.
const maxSSELine = 4 << 20

// errLineTooLong ends a stream whose line passed maxSSELine.
var errLineTooLong = errors.New("a line of the engine's stream is too long")

// readLine is rd.ReadBytes('\n') that gives up past max bytes.
func readLine(rd *bufio.Reader, max int) ([]byte, error) {
	var line []byte
	for {
		frag, err := rd.ReadSlice('\n')
		if len(line)+len(frag) > max {
			return nil, errLineTooLong
		}
		line = append(line, frag...)
		if err != bufio.ErrBufferFull {
			return line, err
		}
	}
}

// eventBuffered reports whether rd holds a whole server-sent event, ended
// by a blank line, without reading.
func eventBuffered(rd *bufio.Reader) bool {
	if rd.Buffered() == 0 {
		return false
	}
	b, _ := rd.Peek(rd.Buffered())
	return bytes.Contains(b, []byte("\n\n"))
}
