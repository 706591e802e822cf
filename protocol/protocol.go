// Package protocol is the engine protocol: the NATS subjects and message
// schemas that engines and the orchestrator exchange, and the HTTP extensions
// engines serve beside the OpenAI API. Engines, the orchestrator and tests
// import it; it holds types and names, and the helpers of the engine token.
//
// # NATS subjects (JSON payloads)
//
//	evolve.engine.register            engine -> all    Registration, at start, on reconnect and on Announce
//	evolve.engine.announce            any -> engines   (empty) ask every engine to publish its Registration again
//	evolve.engine.<id>.heartbeat      engine -> all    Heartbeat, every heartbeat interval (1 s)
//	evolve.engine.<id>.kv             engine -> all    KVEventBatch; events carry a per-engine sequence from 1, without gaps
//	evolve.engine.<id>.stats          engine -> all    StatsBatch: one PassRecord per forward pass
//	evolve.engine.<id>.control        any -> engine    ControlRequest, answered with a ControlReply (request/reply)
//	evolve.engine.deregister          engine -> all    Deregistration, on clean shutdown
//
// An engine id is one NATS subject token: letters, digits, '-' and '_'.
//
// # HTTP extensions (beside /v1/...)
//
//	POST /evolve/v1/kv/pull    PullRequest -> PullReply: a decode engine takes the KV a prefill
//	                           leg holds (remote_request_id from kv_transfer_params); the hold ends
//	POST /evolve/v1/kv/lookup  LookupRequest -> LookupReply: how much of a block chain this engine
//	                           has on GPU and locally (GPU or host), before a peer fetches from it
//
// Responses of /v1/completions and /v1/chat/completions carry an "evolve"
// object (ResponseKV) saying where the prompt's KV came from.
//
// # The engine token
//
// An engine given a token (EngineToken: by default the event plane's, so
// that whoever may join the cluster may use its engines) answers /v1/ and
// /evolve/v1/ only with "Authorization: Bearer TOKEN", and 401 otherwise;
// /health and /metrics stay open. Routers and peer engines send it
// (BearerTransport); a vLLM engine's server gets it as its API key.
//
// # kv_transfer_params
//
// A prefill leg ({"do_remote_decode": true}) answers, as vLLM's
// NixlConnector does, with {"do_remote_prefill": true, "remote_engine_id",
// "remote_request_id", "remote_block_ids", "remote_host", "remote_port",
// "tp_size"}. For evolve's engines remote_host:remote_port is the prefill
// engine's HTTP address (where /evolve/v1/kv/pull is served) rather than a
// NIXL side channel, and remote_block_ids are the held blocks' hashes. A
// router treats the object as opaque and passes it to the decode engine.
//
// # Continuing an answer (routers only)
//
// A router sets HeaderHandOver on what it sends an engine. The engine then
// names each token it samples to the router (TokenComment lines: before
// each event of a stream; after an AnswerComment line, before the JSON of
// a whole answer), and, when told to hand its decodes over, may end the
// answer with a HandOver ("evolve_handover") instead of the rest. The
// router goes on with the answer elsewhere by sending the client's request
// again with "evolve_resume" (Resume): with the HandOver's
// kv_transfer_params, the peer pulls the KV of the prompt and the output so
// far; without, it recomputes what it lacks; as a prefill leg
// (do_remote_decode), an engine only computes and holds that KV for a
// decode engine to pull. The client reads one answer, with the id and the
// tokens the first engine would have written. Its client is mid-read, so
// an engine queues a leg with evolve_resume ahead of new arrivals, as it
// requeues a preempted sequence.
package protocol

import (
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/evolvellm/evolve/kv"
)

// Subjects.
const (
	SubjectRegister   = "evolve.engine.register"
	SubjectAnnounce   = "evolve.engine.announce"
	SubjectDeregister = "evolve.engine.deregister"
	// Wildcards for consumers of every engine.
	SubjectAllHeartbeats = "evolve.engine.*.heartbeat"
	SubjectAllKV         = "evolve.engine.*.kv"
	SubjectAllStats      = "evolve.engine.*.stats"
)

// HeartbeatSubject is where engine id publishes heartbeats.
func HeartbeatSubject(id string) string { return "evolve.engine." + id + ".heartbeat" }

// KVSubject is where engine id publishes KV events.
func KVSubject(id string) string { return "evolve.engine." + id + ".kv" }

// StatsSubject is where engine id publishes pass statistics.
func StatsSubject(id string) string { return "evolve.engine." + id + ".stats" }

// ControlSubject is where engine id answers control requests.
func ControlSubject(id string) string { return "evolve.engine." + id + ".control" }

// HeartbeatInterval is how often engines publish a heartbeat.
const HeartbeatInterval = time.Second

var idPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// ValidateEngineID checks that id can stand in a subject.
func ValidateEngineID(id string) error {
	if !idPattern.MatchString(id) {
		return fmt.Errorf("engine id %q: use 1 to 64 letters, digits, '-' or '_'", id)
	}
	return nil
}

// MaxBlockSize is the largest KV block, in tokens, a registration may
// give (vLLM's are 16 to 256).
const MaxBlockSize = 4096

// Validate checks what a router relies on in a registration: an id that
// can stand in a subject, an HTTP URL, a block size it can hash prompts
// by, and no negative size or rate. The event plane is open to every
// holder of its token; a bad registration is refused, not half-applied.
func (r Registration) Validate() error {
	if err := ValidateEngineID(r.ID); err != nil {
		return err
	}
	if u, err := url.Parse(r.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("engine %s: url %q is not an http(s) URL", r.ID, r.URL)
	}
	if r.BlockSize < 1 || r.BlockSize > MaxBlockSize {
		return fmt.Errorf("engine %s: block size %d: want 1 to %d tokens", r.ID, r.BlockSize, MaxBlockSize)
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"gpus", float64(r.GPUs)}, {"gpu_blocks", float64(r.GPUBlocks)}, {"host_blocks", float64(r.HostBlocks)},
		{"kv_bytes_per_token", float64(r.KVBytesPerToken)}, {"max_model_len", float64(r.MaxModelLen)},
		{"max_num_seqs", float64(r.MaxNumSeqs)}, {"max_num_batched_tokens", float64(r.MaxNumBatchedTokens)},
		{"speedup", r.Speedup}, {"prefill_us_per_token", r.PrefillUsPerToken}, {"host_gbps", r.HostGBps}, {"network_gbps", r.NetworkGBps}} {
		if f.v < 0 {
			return fmt.Errorf("engine %s: %s is %v, below 0", r.ID, f.name, f.v)
		}
	}
	return nil
}

// Registration announces an engine and what it can hold.
type Registration struct {
	ID              string  `json:"id"`
	URL             string  `json:"url"` // base URL of its HTTP API, e.g. http://10.0.0.5:8000
	Backend         string  `json:"backend"`
	Model           string  `json:"model"`
	Profile         string  `json:"profile,omitempty"`
	GPUs            int     `json:"gpus"`
	Role            string  `json:"role"`
	BlockSize       int     `json:"block_size"`
	GPUBlocks       int     `json:"gpu_blocks"`
	HostBlocks      int     `json:"host_blocks"`
	KVBytesPerToken int     `json:"kv_bytes_per_token"`
	MaxModelLen     int     `json:"max_model_len"`
	Speedup         float64 `json:"speedup"`
	// Cost hints from the engine's profile, until the planner has learned
	// better: prefill time per uncached token, and KV copy bandwidths.
	PrefillUsPerToken float64 `json:"prefill_us_per_token,omitempty"`
	HostGBps          float64 `json:"host_gbps,omitempty"`
	NetworkGBps       float64 `json:"network_gbps,omitempty"`
	MaxNumSeqs        int     `json:"max_num_seqs,omitempty"`
	// MaxNumBatchedTokens is the engine's token budget per pass (vLLM's
	// --max-num-batched-tokens); 0: not known.
	MaxNumBatchedTokens int `json:"max_num_batched_tokens,omitempty"`
	// Tokenizer says where a router gets the token ids this engine's KV
	// events are hashed over: "" for evolve's tokenizer package, "engine"
	// for the engine's own POST /tokenize (vLLM's), since a real model's
	// vocabulary is not evolve's.
	Tokenizer string `json:"tokenizer,omitempty"`
	// SelfManagedKV says the engine manages its own KV tiers: it reports
	// KV events but takes no offload, fetch or eviction-hint requests.
	SelfManagedKV bool `json:"self_managed_kv,omitempty"`
	// CanHandOver says the engine takes OpHandOver (a switching decode
	// engine hands its running decodes to peers instead of finishing
	// them) and continues an answer given a Resume, with or without the
	// KV of the output so far: a router may send it an answer whose
	// engine failed mid-stream.
	CanHandOver bool `json:"can_hand_over,omitempty"`
	// PromptTokens says the engine reads a chat request's prompt as the
	// token ids a router gives in openaiapi.PromptTokensMember, in place
	// of its messages (the router tokenized them with evolve's tokenizer).
	PromptTokens bool `json:"prompt_tokens,omitempty"`
	// PriorityScheduling says the engine orders its waiting queue by the
	// request's "priority", lower first (vLLM's --scheduling-policy
	// priority; vLLM refuses a priority otherwise): a router sends the
	// continuation of an answer whose engine failed ahead of the client's
	// priority, as evolve's engines queue it ahead of new arrivals.
	PriorityScheduling bool `json:"priority_scheduling,omitempty"`
	// TokenRequired says the engine's HTTP API answers /v1/ only with the
	// engine token; false: anyone who reaches its port may use it.
	TokenRequired bool      `json:"token_required,omitempty"`
	Version       string    `json:"version"`
	StartedAt     time.Time `json:"started_at"`
	// LastKVSeq is the sequence of the last KV event published, so that a
	// consumer joining late knows where the stream stands.
	LastKVSeq uint64 `json:"last_kv_seq"`
}

// Deregistration says an engine is shutting down cleanly.
type Deregistration struct {
	ID string `json:"id"`
}

// Heartbeat is an engine's periodic sign of life with its current load.
type Heartbeat struct {
	ID          string    `json:"id"`
	Time        time.Time `json:"time"` // wall clock
	Role        string    `json:"role"`
	Draining    bool      `json:"draining"`
	Waiting     int       `json:"waiting"`
	Running     int       `json:"running"`
	Held        int       `json:"held"`
	GPUKVUsage  float64   `json:"gpu_kv_usage"`  // 0..1, blocks in use by sequences
	HostKVUsage float64   `json:"host_kv_usage"` // 0..1
	LastKVSeq   uint64    `json:"last_kv_seq"`
	// KVBlocksLeftOut counts the blocks whose KV events the engine could
	// not pass on (a vLLM engine's: blocks of adapters, with extra keys,
	// or whose parent was never stored), and KVLeftOutWhy says why the
	// last one was left out: they are missing from the directory.
	KVBlocksLeftOut uint64 `json:"kv_blocks_left_out,omitempty"`
	KVLeftOutWhy    string `json:"kv_left_out_why,omitempty"`
	// TokensTotal counts the tokens processed since the engine started
	// (prompt tokens computed and tokens generated), for engines that
	// publish no pass records (vLLM); 0 when not reported.
	TokensTotal uint64 `json:"tokens_total,omitempty"`
}

// KVEventBatch carries consecutive KV events of one engine.
type KVEventBatch struct {
	Engine string     `json:"engine"`
	Events []kv.Event `json:"events"`
}

// PassRecord is one forward pass, for the planner's cost models. Times are
// the engine's modelled (virtual) time.
type PassRecord struct {
	Start           time.Time `json:"start"`
	DurationSec     float64   `json:"duration_s"`
	PrefillTokens   int       `json:"prefill_tokens"`
	PrefillAttended float64   `json:"prefill_attended"` // sum of new tokens x context attended
	DecodeSeqs      int       `json:"decode_seqs"`
	DecodeContext   int       `json:"decode_context"`
	HostLoadBlocks  int       `json:"host_load_blocks"`
	OffloadBlocks   int       `json:"offload_blocks"`
	Preemptions     int       `json:"preemptions"`
	Waiting         int       `json:"waiting"`
	Running         int       `json:"running"`
	GPUKVUsage      float64   `json:"gpu_kv_usage"`
	HostKVUsage     float64   `json:"host_kv_usage"`
}

// StatsBatch carries consecutive pass records of one engine.
type StatsBatch struct {
	Engine string       `json:"engine"`
	Passes []PassRecord `json:"passes"`
}

// Control operations.
const (
	OpStatus  = "status"   // report state
	OpSetRole = "set_role" // Role: prefill | decode | both; ends a drain
	OpDrain   = "drain"    // refuse new requests (503) until resume or set_role
	OpResume  = "resume"   // take requests again
	OpOffload = "offload"  // copy all GPU KV to the host tier
	OpFetch   = "fetch"    // pull Blocks[From:] from Peer into the host tier
	OpHints   = "hints"    // eviction priorities for blocks
	OpResync  = "resync"   // publish AllBlocksCleared then every resident block again
	// OpRegistered tells an engine how its registration was judged:
	// Reason is why it was rejected, "" when it was accepted.
	OpRegistered = "registered"
	// OpHandOver: until set_role, drain or resume, the engine ends every
	// request that allows it (HandOverAllowed) as soon as it has output,
	// with a HandOver for a peer to continue it. It still takes requests:
	// those a router sent before it stopped routing there move on too.
	OpHandOver = "hand_over"
)

// Hint is an eviction priority for a block: lower goes first, 0 clears.
type Hint struct {
	Hash     kv.BlockHash `json:"hash"`
	Priority int8         `json:"priority"`
}

// RoleOp says whether op is one of the role commands only the planner's
// leader sends (set_role, drain, resume, offload, hand_over): an engine
// refuses them with a Fence older than one it has seen.
func RoleOp(op string) bool {
	switch op {
	case OpSetRole, OpDrain, OpResume, OpOffload, OpHandOver:
		return true
	}
	return false
}

// Fence is the leadership term a role command was sent under. Lease names
// the lease store (orchestrators sharing one event plane share it); Term
// grows with every new leader of that store. An engine keeps the highest
// Term it has seen of a Lease and refuses role commands of a lower one: a
// deposed leader's late command is not applied. A command of another
// Lease (the store was created again) starts its count afresh.
type Fence struct {
	Lease  string `json:"lease"`
	Term   uint64 `json:"term"`
	Holder string `json:"holder,omitempty"` // the leading orchestrator's name, for errors
}

// ControlRequest asks an engine to do one thing.
type ControlRequest struct {
	// Fence: the leadership term of a role command (RoleOp); nil from
	// an orchestrator that does not lead through a lease.
	Fence  *Fence         `json:"fence,omitempty"`
	Op     string         `json:"op"`
	Role   string         `json:"role,omitempty"`
	Peer   string         `json:"peer,omitempty"` // base URL of the engine to fetch from
	Blocks []kv.BlockHash `json:"blocks,omitempty"`
	From   int            `json:"from,omitempty"`
	Hints  []Hint         `json:"hints,omitempty"`
	Reason string         `json:"reason,omitempty"` // OpRegistered's
}

// ControlReply answers a ControlRequest.
type ControlReply struct {
	OK       bool    `json:"ok"`
	Error    string  `json:"error,omitempty"`
	Role     string  `json:"role"`
	Draining bool    `json:"draining"`
	InFlight int     `json:"in_flight"`
	Blocks   int     `json:"blocks,omitempty"`  // blocks moved (offload, fetch)
	Seconds  float64 `json:"seconds,omitempty"` // modelled time the move takes
	// Seq is, for a resync, the sequence number of the last KV event it
	// published: the orchestrator asks the next engine once its directory
	// has applied that far. 0: not known.
	Seq uint64 `json:"seq,omitempty"`
}

// PullRequest takes the KV held by a prefill leg.
type PullRequest struct {
	RemoteRequestID string `json:"remote_request_id"`
}

// PullReply lists the held block chain; the hold has ended.
type PullReply struct {
	Engine string         `json:"engine"`
	Blocks []kv.BlockHash `json:"blocks"`
}

// LookupRequest asks how much of a chain an engine has.
type LookupRequest struct {
	Blocks []kv.BlockHash `json:"blocks"`
}

// LookupReply gives the prefix lengths, in blocks.
type LookupReply struct {
	Engine string `json:"engine"`
	GPU    int    `json:"gpu"`
	Local  int    `json:"local"` // GPU or host
}

// ResponseKV is the "evolve" object of an engine's completion response.
type ResponseKV struct {
	Engine            string  `json:"engine"`
	GPUHitTokens      int     `json:"gpu_hit_tokens"`
	HostHitTokens     int     `json:"host_hit_tokens"`
	TransferredTokens int     `json:"transferred_tokens"`
	ComputedTokens    int     `json:"computed_tokens"`
	Preemptions       int     `json:"preemptions"`
	QueueSec          float64 `json:"queue_s"` // modelled
	TTFTSec           float64 `json:"ttft_s"`  // modelled
	E2ESec            float64 `json:"e2e_s"`   // modelled
	PullError         string  `json:"pull_error,omitempty"`
	// HandedOver is how often the request's decode moved to another
	// engine (a role switch's handover, or its engine failing mid-stream);
	// the fields above then tell the whole request: the prompt's KV as its
	// first decode engine found it, computed tokens and preemptions
	// summed, E2E summed over the legs. After a failure, the first legs'
	// story is lost with their engine: the fields tell the last leg's,
	// which found or pulled what it could of the prompt's KV and
	// recomputed the rest and the output so far.
	HandedOver int `json:"handed_over,omitempty"`
	// Prefill is the prefill leg's object when a router split the request
	// between a prefill and a decode engine: where the prompt's KV came
	// from is its story (the decode leg's transferred tokens are the
	// handoff). After a failure whose resume the router split, it is the
	// leg that computed the KV of the prompt and the output so far.
	// Routers add it; engines never set it.
	Prefill *ResponseKV `json:"prefill,omitempty"`
}

// HeaderHandOver, set on a request by a router, says that the client can
// continue the answer on another engine: a streamed answer then carries
// TokenComment lines, and a whole one (other than a prefill leg's) opens
// with AnswerComment and TokenComment lines when the router also sets
// HeaderWholeTokens. With HandOverAllowed the engine may also end the
// answer with a HandOver when it is told to hand its decodes over
// (OpHandOver); with HandOverNever the answer ends where it is (a router
// sends a handed-over answer that no peer took back to the engine that
// holds its KV). Without the header the request runs to its end where it
// is and its stream is plain: a client that is not a router never sees a
// handover.
const HeaderHandOver = "X-Evolve-Hand-Over"

// Values of HeaderHandOver.
const (
	HandOverAllowed = "1"
	HandOverNever   = "stay"
)

// TokenComment begins the line `: evolve-token ID SAMPLER` (decimal)
// that precedes each token's event in a stream sent with HeaderHandOver:
// the token's id and the sampler's state after it (Resume.Sampler). It is
// an SSE comment, which clients ignore; a router reads it so that, should
// the engine die mid-stream, it can continue the answer elsewhere with a
// Resume (and no kv_transfer_params: that engine recomputes the prompt
// and the output so far), the same tokens as the dead engine would have
// written.
const TokenComment = ": evolve-token "

// HeaderWholeTokens, set to "1" by a router beside HeaderHandOver, says
// that it reads the lines that open a whole answer (AnswerComment): an
// engine writes them only then, so that a router from before them never
// passes them on to its client.
const HeaderWholeTokens = "X-Evolve-Whole-Tokens"

// AnswerComment begins the line `: evolve-answer ID CREATED` that opens
// the body of a whole (not streamed) answer an engine writes for a
// router (HeaderHandOver and HeaderWholeTokens): the answer's id and creation time (Unix
// seconds). TokenComment lines follow, one per token as the engine
// samples it, then the answer's JSON on the next line. Should the engine
// die before the JSON, the router continues the answer elsewhere from the
// tokens named, as in a stream; a client that is not a router gets the
// plain JSON.
const AnswerComment = ": evolve-answer "

// HandOver ends an answer whose decode an engine handed over: in a
// stream, the event `data: {"evolve_handover": {...}}` in place of the
// rest of the answer (no finish, usage or [DONE]); otherwise a 200 answer
// whose body is {"object": "evolve.handover", "evolve_handover": {...}}.
// A router sends the client's request again to a peer decode engine with
// KVTransferParams and Resume as its kv_transfer_params and evolve_resume
// members, and passes the peer's answer on: the client gets one answer,
// as if nothing had moved.
type HandOver struct {
	// KVTransferParams name the engine that holds the request's KV
	// (prompt and output so far), as a prefill leg's answer does.
	KVTransferParams map[string]any `json:"kv_transfer_params"`
	Resume           Resume         `json:"evolve_resume"`
}

// Resume is how an engine continues another's answer: the output so
// far, the state of its sampler, and the answer's identity and story.
// Sent with a prefill leg's kv_transfer_params (do_remote_decode), it
// asks the engine only to compute and hold the KV of the prompt and the
// output so far, for a decode engine that then goes on with the answer
// from that KV: a router splits a resume so when much is to be
// recomputed.
type Resume struct {
	ID      string   `json:"id"`      // the answer's id, kept
	Created int64    `json:"created"` // and its creation time
	Output  []uint32 `json:"output_token_ids"`
	// Sampler is the output stream's state: the continuation is the
	// output the first engine would have written.
	Sampler uint64 `json:"sampler_state"`
	// Prior is the "evolve" object of the answer so far.
	Prior ResponseKV `json:"prior"`
}

// EngineToken is the engine token that goes with an event plane's URL:
// the token of nats://TOKEN@host:port (or tls://), "" when the URL carries
// none (no user information, or a user and password). Of a list of
// servers (comma-separated, as NATS takes them), the first's.
func EngineToken(natsURL string) string {
	first, _, _ := strings.Cut(natsURL, ",")
	u, err := url.Parse(strings.TrimSpace(first))
	if err != nil || u.User == nil {
		return ""
	}
	if _, hasPassword := u.User.Password(); hasPassword {
		return ""
	}
	return u.User.Username()
}

// BearerToken is the token of an Authorization header of the bearer
// scheme ("Bearer TOKEN", the scheme in any case, as RFC 7235 has it:
// "bearer TOKEN" is the same), and whether the header is one.
func BearerToken(authorization string) (string, bool) {
	scheme, token, ok := strings.Cut(authorization, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimLeft(token, " ")
	return token, token != ""
}

// BearerTransport sends the engine token with every request that carries
// no Authorization of its own. A nil Base is http.DefaultTransport; an
// empty Token sends nothing.
type BearerTransport struct {
	Token string
	Base  http.RoundTripper
}

// RoundTrip implements http.RoundTripper.
func (t *BearerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	if t.Token == "" || r.Header.Get("Authorization") != "" {
		return base.RoundTrip(r)
	}
	r = r.Clone(r.Context()) // a RoundTripper must not change the caller's request
	r.Header.Set("Authorization", "Bearer "+t.Token)
	return base.RoundTrip(r)
}

// ControlRealm is the realm of the control API's 401 answers
// (WWW-Authenticate: Bearer realm="evolve-control"), by which a client
// pointed at it as if it were the router knows what it reached.
const ControlRealm = "evolve-control"
