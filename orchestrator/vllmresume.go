package orchestrator

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/evolvellm/evolve/openaiapi"
	"github.com/evolvellm/evolve/orchestrator/routing"
	"github.com/evolvellm/evolve/roles"
)

// A vLLM engine cannot be handed an answer to go on with (it takes no
// protocol.Resume), but it can say which tokens it streamed: a stream sent
// to it asks for return_token_ids, and its chunks then carry the ids of
// the text they bring (choices[].token_ids). Should the engine die
// mid-stream, the router has the prompt's ids (it tokenized the prompt
// with vLLM's own /tokenize, chat template applied) and the output's, and
// sends their concatenation as a completions prompt to another vLLM
// engine, which writes the rest of the answer. The client reads one
// answer: the continuation's chunks are rewritten into the first
// engine's (its id, its creation time, a chat chunk's shape), and the
// usage counts the client's prompt and the whole output.
//
// A chat answer that may call tools goes on as a chat instead: its tool
// parser must see the rest. The continuation is the client's request with
// the answer's text so far as a last assistant message that vLLM
// continues (continue_final_message), and its chunks keep the first
// engine's id and creation time. Before vLLM has streamed a tool call,
// the text the client has read is the whole answer so far (a parser holds
// back what may open a call, and the continuation writes it again).
//
// What neither can carry on is refused, and the stream ends with an
// error as before: an answer in which vLLM has parsed a tool call or
// reasoning (the parser's state would start over), one whose output a
// grammar constrains (it would start over too), several choices, chat log
// probabilities (their shape differs), and a chat with tools that itself
// continues an assistant message.

// vllmStream is what the router keeps of a stream from a vLLM engine.
type vllmStream struct {
	backend string // the engine's registered backend: only engines of the same one go on with it
	// clientIDs: the client asked for return_token_ids itself, so the
	// chunks keep their ids.
	clientIDs bool
	// refused says why the answer cannot go on elsewhere ("" if it can).
	refused string
	// base is the output the first legs wrote before the current
	// continuation began: its usage counts them too.
	base int
	// cont: the current leg is a continuation, a stream to rewrite into
	// the client's answer.
	cont bool
	// asChat: the answer goes on as a chat (it may call tools), from
	// text, the content the client has read.
	asChat bool
	text   strings.Builder
}

// chatParsed are the chat request members that make an answer's rest
// depend on server-side state no continuation has.
var chatParsed = []string{"response_format", "guided_json", "guided_regex", "guided_choice",
	"guided_grammar", "structured_outputs", "logprobs", "top_logprobs"}

// chatTools are the chat request members that offer tools: vLLM's tool
// parser must see the rest of such an answer.
var chatTools = []string{"tools", "functions"}

// completionParsed are those of a completions request.
var completionParsed = []string{"response_format", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
	"structured_outputs", "best_of"}

// vllmContinued are the chat members a completions continuation keeps:
// sampling and stopping, which a completions request takes as they are.
var vllmContinued = []string{"model", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids",
	"presence_penalty", "frequency_penalty", "repetition_penalty", "ignore_eos", "skip_special_tokens",
	"spaces_between_special_tokens", "include_stop_str_in_output", "bad_words", "logit_bias", "allowed_token_ids",
	"stream_options", "user", "truncate_prompt_tokens"}

// watchVLLM readies the attempt to keep the token ids of a stream its
// decode node, a vLLM engine, writes; it returns the member to add to the
// body that asks for them, or nil when the node is not vLLM's or the
// answer is no stream.
func (a *attempt) watchVLLM() map[string]json.RawMessage {
	if !a.p.Req.Stream {
		return nil
	}
	a.o.c.mu.Lock()
	n := a.o.c.nodes[a.decode]
	backend, vllm := "", false
	if n != nil {
		backend, vllm = n.reg.Backend, n.reg.Tokenizer == "engine" && !n.reg.CanHandOver
	}
	a.o.c.mu.Unlock()
	if !vllm {
		return nil
	}
	v := &vllmStream{backend: backend, clientIDs: string(bytes.TrimSpace(a.client.Members["return_token_ids"])) == "true"}
	parsed := completionParsed
	if a.p.Chat {
		parsed = chatParsed
	}
	for _, k := range parsed {
		if m, ok := a.client.Members[k]; ok && !jsonEmpty(m) {
			v.refused = "the request has " + k
			break
		}
	}
	for _, k := range chatTools {
		if m, ok := a.client.Members[k]; a.p.Chat && ok && !jsonEmpty(m) && !toolsOff(a.client.Members["tool_choice"]) {
			v.asChat = true
		}
	}
	if v.asChat && a.p.Req.ContinueFinalMessage {
		v.refused = "the request has tools and continues an assistant message"
	}
	if n := a.p.Req.N; n != nil && *n > 1 {
		v.refused = "the request asks for several choices"
	}
	a.vllm = v
	return map[string]json.RawMessage{"return_token_ids": json.RawMessage("true")}
}

// jsonEmpty says whether a member's value asks for nothing: null, false,
// an empty list or object.
func jsonEmpty(v json.RawMessage) bool {
	switch string(bytes.TrimSpace(v)) {
	case "", "null", "false", "[]", "{}", "0":
		return true
	}
	return false
}

// jsonInt is an integer member's value (0 if it is none).
func jsonInt(v json.RawMessage) int {
	n, _ := strconv.Atoi(string(bytes.TrimSpace(v)))
	return n
}

// warnNoTokenIDs says, once per node, that a vLLM engine streams without
// the token ids the router asked for: the first stream tells, where the
// engine's death would (an older vLLM, or a server that speaks its
// protocol without return_token_ids, as llm-d-inference-sim).
func (o *Orchestrator) warnNoTokenIDs(node string) {
	if _, seen := o.noTokenIDs.LoadOrStore(node, true); seen {
		return
	}
	o.log.Warn("engine streams without token ids (return_token_ids): an answer it fails mid-stream cannot go on on another engine, and its client gets an error; vLLM 0.10.2 or later has them",
		"node", node)
}

// toolsOff says whether a tool_choice lets the model call no tool.
func toolsOff(choice json.RawMessage) bool { return string(bytes.TrimSpace(choice)) == `"none"` }

// vllmChoice is a choice of a stream chunk from vLLM, as far as the
// router reads it.
type vllmChoice struct {
	Index    int
	TokenIDs []uint32 // nil when the chunk names none
	Text     string
	Delta    *struct {
		Content          string          `json:"content"`
		ToolCalls        json.RawMessage `json:"tool_calls"`
		ReasoningContent json.RawMessage `json:"reasoning_content"`
		Reasoning        json.RawMessage `json:"reasoning"`
	}
}

// readChoice reads a choice's members.
func readChoice(ch map[string]json.RawMessage) (c vllmChoice, err error) {
	fields := [...]struct {
		name string
		dst  any
	}{{"index", &c.Index}, {"token_ids", &c.TokenIDs}, {"text", &c.Text}, {"delta", &c.Delta}}
	for _, f := range fields {
		if raw, ok := ch[f.name]; ok {
			if err := json.Unmarshal(raw, f.dst); err != nil {
				return c, err
			}
		}
	}
	return c, nil
}

// vllmData reads one data line's JSON from a vLLM stream: it returns the
// token ids it carries and the line to send the client: the ids taken
// out unless the client asked for them, and a continuation's chunk made
// one of the client's answer. The chunk is parsed once: every chunk of
// every vLLM stream comes through here.
func (a *attempt) vllmData(data []byte) (ids []uint32, out []byte) {
	v := a.vllm
	var m map[string]json.RawMessage
	var choices []map[string]json.RawMessage
	if err := json.Unmarshal(data, &m); err != nil {
		v.refused = "a chunk could not be read"
		return nil, data
	}
	if raw, ok := m["choices"]; ok && json.Unmarshal(raw, &choices) != nil {
		v.refused = "a chunk could not be read"
		return nil, data
	}
	for _, raw := range choices {
		ch, err := readChoice(raw)
		if err != nil {
			v.refused = "a chunk could not be read"
			return nil, data
		}
		if ch.Index != 0 {
			v.refused = "the answer has several choices"
		}
		ids = append(ids, ch.TokenIDs...)
		text := ch.Text
		if d := ch.Delta; d != nil {
			text += d.Content
			v.text.WriteString(d.Content)
			if !jsonEmpty(d.ToolCalls) || !jsonEmpty(d.ReasoningContent) || !jsonEmpty(d.Reasoning) {
				v.refused = "the server parsed tool calls or reasoning from the answer"
			}
		}
		if text != "" && ch.TokenIDs == nil && v.refused == "" {
			v.refused = "vLLM streamed text without its token ids (return_token_ids needs vLLM 0.10.2 or later)"
			if a.o != nil {
				a.o.warnNoTokenIDs(a.decode)
			}
		}
	}
	switch {
	case v.cont && v.asChat:
		return ids, a.continuedChatChunk(data)
	case v.cont:
		return ids, a.continuedChunk(data)
	case v.clientIDs || !bytes.Contains(data, []byte(`token_ids"`)):
		return ids, data
	}
	dropIDs(m, choices)
	if b, err := marshalText(m); err == nil {
		return ids, b
	}
	return ids, data
}

// dropIDs takes the token ids the router asked for out of a chunk (m, its
// choices parsed): the choices' token_ids, and prompt_token_ids where
// vLLM adds them (the first chunk: at the top of a chat chunk, in the
// choice of a completion).
func dropIDs(m map[string]json.RawMessage, choices []map[string]json.RawMessage) {
	delete(m, "prompt_token_ids")
	if choices == nil {
		return
	}
	for _, ch := range choices {
		delete(ch, "token_ids")
		delete(ch, "prompt_token_ids")
	}
	m["choices"], _ = marshalText(choices)
}

// withoutIDs is a chunk without the token ids the router asked for
// (dropIDs).
func withoutIDs(data []byte) []byte {
	if !bytes.Contains(data, []byte(`token_ids"`)) {
		return data
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(data, &m) != nil {
		return data
	}
	var choices []map[string]json.RawMessage
	json.Unmarshal(m["choices"], &choices)
	dropIDs(m, choices)
	b, err := marshalText(m)
	if err != nil {
		return data
	}
	return b
}

// marshalText is json.Marshal without HTML escaping: a model's "<think>"
// reaches the client as the engine wrote it.
func marshalText(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimRight(buf.Bytes(), "\n"), nil
}

// continuedChunk rewrites a chunk of a completions continuation into one
// of the client's answer: the first engine's id and creation time, a chat
// chunk's delta for a chat answer, and usage that counts the client's
// prompt and the whole output.
func (a *attempt) continuedChunk(data []byte) []byte {
	var c struct {
		Model   string `json:"model"`
		Choices []struct {
			Index        int             `json:"index"`
			Text         string          `json:"text"`
			Logprobs     json.RawMessage `json:"logprobs"`
			FinishReason json.RawMessage `json:"finish_reason"`
			StopReason   json.RawMessage `json:"stop_reason"`
			TokenIDs     json.RawMessage `json:"token_ids"`
		} `json:"choices"`
		Usage map[string]json.RawMessage `json:"usage"`
	}
	if json.Unmarshal(data, &c) != nil {
		return data
	}
	object := "text_completion"
	if a.p.Chat {
		object = "chat.completion.chunk"
	}
	choices := make([]map[string]any, 0, len(c.Choices))
	for _, ch := range c.Choices {
		m := map[string]any{"index": ch.Index, "logprobs": ch.Logprobs, "finish_reason": ch.FinishReason}
		if a.p.Chat {
			m["delta"] = map[string]string{"content": ch.Text}
			m["logprobs"] = nil
		} else {
			m["text"] = ch.Text
		}
		if len(ch.StopReason) > 0 {
			m["stop_reason"] = ch.StopReason
		}
		if a.vllm.clientIDs && len(ch.TokenIDs) > 0 {
			m["token_ids"] = ch.TokenIDs
		}
		choices = append(choices, m)
	}
	out := map[string]any{"id": a.answerID, "object": object, "created": a.created, "model": c.Model, "choices": choices}
	if c.Usage != nil {
		out["usage"] = a.continuedUsage(c.Usage)
	}
	b, err := marshalText(out)
	if err != nil {
		return data
	}
	return b
}

// continuedChatChunk is a chunk of a chat continuation as one of the
// client's answer: the first engine's id and creation time, usage for the
// client's prompt and the whole output, and no ids the client did not ask
// for.
func (a *attempt) continuedChatChunk(data []byte) []byte {
	var m map[string]json.RawMessage
	if json.Unmarshal(data, &m) != nil {
		return data
	}
	if !a.vllm.clientIDs {
		var choices []map[string]json.RawMessage
		json.Unmarshal(m["choices"], &choices)
		dropIDs(m, choices)
	}
	m["id"], _ = json.Marshal(a.answerID)
	m["created"] = json.RawMessage(strconv.FormatInt(a.created, 10))
	var u map[string]json.RawMessage
	if json.Unmarshal(m["usage"], &u) == nil && u != nil {
		m["usage"], _ = marshalText(a.continuedUsage(u))
	}
	b, err := marshalText(m)
	if err != nil {
		return data
	}
	return b
}

// continuedUsage is a continuation's usage as the client's answer counts
// it: the continuation's prompt is the client's and the output so far.
func (a *attempt) continuedUsage(u map[string]json.RawMessage) map[string]json.RawMessage {
	prompt, completion := len(a.p.Tokens), a.vllm.base+jsonInt(u["completion_tokens"])
	u["prompt_tokens"] = json.RawMessage(strconv.Itoa(prompt))
	u["completion_tokens"] = json.RawMessage(strconv.Itoa(completion))
	u["total_tokens"] = json.RawMessage(strconv.Itoa(prompt + completion))
	var d map[string]json.RawMessage
	if json.Unmarshal(u["prompt_tokens_details"], &d) == nil && d != nil {
		d["cached_tokens"] = json.RawMessage(strconv.Itoa(min(jsonInt(d["cached_tokens"]), prompt)))
		u["prompt_tokens_details"], _ = json.Marshal(d)
	}
	return u
}

// vllmContinuation is the request that writes the rest of the answer: a
// completions request of the prompt's ids and the output's so far, or,
// for a chat that offers tools, the chat with the text so far as an
// assistant message to continue. It fails when nothing is left to write.
func (a *attempt) vllmContinuation() ([]byte, error) {
	k := len(a.out)
	prompt := make([]uint32, 0, len(a.p.Tokens)+k)
	prompt = append(append(prompt, a.p.Tokens...), a.out...)
	pb, _ := json.Marshal(prompt)
	set := map[string]json.RawMessage{"prompt": pb, "stream": json.RawMessage("true"),
		"return_token_ids": json.RawMessage("true")}
	if a.vllm.asChat {
		// The client's chat, its answer so far the message to go on.
		var msgs []json.RawMessage
		if err := json.Unmarshal(a.client.Members["messages"], &msgs); err != nil {
			return nil, fmt.Errorf("read the request's messages: %w", err)
		}
		last, _ := json.Marshal(map[string]string{"role": "assistant", "content": a.vllm.text.String()})
		mb, _ := json.Marshal(append(msgs, last))
		delete(set, "prompt")
		set["messages"], set["kv_transfer_params"] = mb, nil
		set["continue_final_message"], set["add_generation_prompt"] = json.RawMessage("true"), json.RawMessage("false")
	}
	asked := a.client.Members["max_tokens"]
	if a.p.Chat && a.client.Has("max_completion_tokens") {
		asked = a.client.Members["max_completion_tokens"]
	}
	switch {
	case !jsonEmpty(asked) || !a.p.Chat:
		// Completions default to 16 tokens, as vLLM's; a chat answer
		// without a limit runs to the context's end, as its rest does.
		left := a.p.MaxTokens - k
		if left < 1 {
			return nil, errors.New("the answer had all its tokens but not its end")
		}
		set["max_tokens"] = json.RawMessage(strconv.Itoa(left))
		if a.vllm.asChat && a.client.Has("max_completion_tokens") {
			set["max_completion_tokens"], set["max_tokens"] = set["max_tokens"], nil
		}
	}
	if m := a.client.Members["min_tokens"]; !jsonEmpty(m) {
		set["min_tokens"] = json.RawMessage(strconv.Itoa(max(0, jsonInt(m)-k)))
	}
	switch {
	case a.vllm.asChat:
		return a.client.With(set), nil
	case !a.p.Chat:
		// The client's completions request, its prompt the whole
		// context: echo and a prefill leg's params do not carry on.
		set["echo"], set["kv_transfer_params"], set["max_completion_tokens"] = nil, nil, nil
		return a.client.With(set), nil
	}
	members := map[string]json.RawMessage{}
	for _, k := range vllmContinued {
		if v, ok := a.client.Members[k]; ok {
			members[k] = v
		}
	}
	for k, v := range set {
		members[k] = v
	}
	b, err := json.Marshal(members)
	if err != nil {
		return nil, fmt.Errorf("encode the continuation: %w", err)
	}
	return b, nil
}

// canResumeVLLM says whether a stream from a vLLM engine can go on
// elsewhere should the engine fail now: once its first chunk named the
// answer, even before a token (a chat stream opens with the role alone).
func (a *attempt) canResumeVLLM() bool {
	v := a.vllm
	return v != nil && v.refused == "" && !a.outLost && a.answerID != "" && a.resumes < maxAttempts
}

// resumeVLLM goes on with a stream whose vLLM engine failed mid-way on
// another engine of the same backend, from the prompt's ids and the
// output's (vllmContinuation). Where vLLM engines prefill for others, a
// decode engine goes on, the one holding most of the prompt's KV, and
// when it would recompute more than routing.DefaultLocalPrefillTokens of
// the prompt and the output, a prefill engine computes that KV and the
// decode engine pulls it (vllmResumePrefill), as a split request's legs
// do: the recompute stalls none of the streams it decodes. Otherwise the
// engine holding most of the prompt goes on, whatever its role (a vLLM
// engine fetches nothing from peers itself). When none goes on, the
// client is told so in its stream.
func (a *attempt) resumeVLLM(cause error) error {
	a.resumes++
	err := cause
	if a.resumes <= maxAttempts {
		for try := 0; try < maxAttempts; try++ {
			body, berr := a.vllmContinuation()
			if berr != nil {
				err = berr
				break
			}
			split := a.o.vllmPrefillServes(a.failed, a.vllm.backend)
			var to, url string
			held := 0
			if split {
				to, url, held = a.o.claimVLLMResumer(a.failed, a.chain, a.vllm.backend, roles.Decode)
			}
			if to == "" {
				split = false
				to, url, held = a.o.claimVLLMResumer(a.failed, a.chain, a.vllm.backend)
			}
			if to == "" {
				err = fmt.Errorf("%w; no other vLLM engine serves", err)
				break
			}
			a.urls[to], a.decode = url, to
			a.vllm.base, a.vllm.cont = len(a.out), true
			a.legPath = "/v1/completions"
			if a.vllm.asChat {
				a.legPath = a.path
			}
			var after func()
			leg := body
			if recompute := len(a.p.Tokens) - held + len(a.out); split && recompute > routing.DefaultLocalPrefillTokens {
				if b, ok := a.vllmResumePrefill(to, body, recompute); ok {
					leg, after = b, a.dropResumePrefill
				}
			}
			done, ferr := a.continueOn(to, url, a.prioritised(to, leg), resumeEngineFailed, after)
			if done {
				return ferr
			}
			err = ferr
		}
	}
	a.o.met.resumed.WithLabelValues(resumeEngineFailed, "failed").Inc()
	a.o.interrupted(a.interruptedOn, true)
	err = fmt.Errorf("no node could continue the answer (%v)", err)
	a.streamError(err)
	return err
}

// prioritised is body, the continuation of an answer whose engine
// failed, as sent to node: ahead of the client's priority (one less: vLLM
// schedules lower values first) when node orders its queue by priority
// (protocol.Registration.PriorityScheduling), so that the answer the
// client is reading does not wait behind requests that came after it.
// Otherwise it is body itself: vLLM refuses a priority it does not
// schedule by.
func (a *attempt) prioritised(node string, body []byte) []byte {
	pr, ok := a.priorityOn(node)
	if !ok {
		return body
	}
	b, err := openaiapi.ParseObject(body)
	if err != nil {
		return body
	}
	return b.With(map[string]json.RawMessage{"priority": pr})
}

// priorityOn is the priority of a continuation sent to node, and whether
// node schedules by priority (prioritised).
func (a *attempt) priorityOn(node string) (json.RawMessage, bool) {
	a.o.c.mu.Lock()
	n := a.o.c.nodes[node]
	by := n != nil && n.reg.PriorityScheduling
	a.o.c.mu.Unlock()
	if !by {
		return nil, false
	}
	return json.RawMessage(strconv.Itoa(jsonInt(a.client.Members["priority"]) - 1)), true
}

// vllmResumePrefill has a serving vLLM prefill engine, the one holding
// most of the prompt, compute the KV of a continuation (body) for decode
// engine to (prefillForResume), and returns the continuation with the
// kv_transfer_params that pull it; false when none did (to then computes
// that KV itself).
func (a *attempt) vllmResumePrefill(to string, body []byte, recompute int) ([]byte, bool) {
	cont, err := openaiapi.ParseObject(body)
	if err != nil {
		return nil, false
	}
	p, url, _ := a.o.claimVLLMResumer(a.failedAnd(to), a.chain, a.vllm.backend, roles.Prefill)
	if p == "" {
		return nil, false
	}
	a.urls[p] = url
	leg := cont
	if pr, ok := a.priorityOn(p); ok {
		leg = cont.Set(map[string]json.RawMessage{"priority": pr})
	}
	kvp, ok := a.prefillForResume(p, url, to, leg, nil, recompute)
	if !ok {
		return nil, false
	}
	return cont.With(map[string]json.RawMessage{"kv_transfer_params": kvp}), true
}
