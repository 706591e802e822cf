package stepmodel

import (
	"embed"
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

//go:embed profiles/*.yaml
var builtinProfiles embed.FS

// Profile describes the hardware and model of one simulated engine (a GPU or
// a tensor-parallel group) and the cost of its forward passes. Profiles are
// YAML files; the built-in ones cite the public figures they are fitted to.
type Profile struct {
	Name        string `yaml:"name"`
	Description string `yaml:"description"`
	Model       string `yaml:"model"` // served model name
	GPUs        int    `yaml:"gpus"`

	MaxModelLen     int `yaml:"max_model_len"`      // longest prompt + output, tokens
	BlockSize       int `yaml:"block_size"`         // tokens per KV block
	KVBytesPerToken int `yaml:"kv_bytes_per_token"` // whole engine, all layers
	GPUKVTokens     int `yaml:"gpu_kv_tokens"`      // KV capacity in device memory
	HostKVTokens    int `yaml:"host_kv_tokens"`     // host pool; 0 means 4x GPUKVTokens

	HBMGBps     float64 `yaml:"hbm_gbps"`     // device memory bandwidth, GB/s (engine total)
	HostGBps    float64 `yaml:"host_gbps"`    // GPU <-> host copy bandwidth, GB/s
	NetworkGBps float64 `yaml:"network_gbps"` // engine <-> engine KV transfer, GB/s

	MaxNumSeqs          int `yaml:"max_num_seqs"`           // 0: scheduler default
	MaxNumBatchedTokens int `yaml:"max_num_batched_tokens"` // 0: scheduler default

	Prefill PrefillCost `yaml:"prefill"`
	Decode  DecodeCost  `yaml:"decode"`

	// Sparse, when its top_k is set, makes attention sparse: each query
	// attends to the top_k keys an indexer picks, and the indexer scores
	// every key of the context at a smaller cost per pair.
	Sparse SparseAttention `yaml:"sparse_attention"`

	// MoE, when its experts are set, makes the decode step read the
	// weights of the routed experts its tokens touch (see ExpertShare).
	MoE MoE `yaml:"moe"`

	// Checks are the public measurements the costs above are fitted to or
	// checked against; go test ./engine/stepmodel runs each on the model and
	// fails when one is off by more than CheckTolerance.
	Checks []Check `yaml:"checks"`
}

// MoE describes a mixture-of-experts model's routed experts.
type MoE struct {
	Experts         int `yaml:"experts"`           // routed experts per layer
	ExpertsPerToken int `yaml:"experts_per_token"` // experts each token is routed to (top-k)
}

// ExpertShare is the share of the routed experts that a pass over tokens
// tokens reads: 1-(1-k/E)^tokens with E experts and k per token, as if
// routing were uniform. With 256 experts and top-8 it is 22% at 8 tokens,
// 40% at 16, 64% at 32 and 87% at 64; 1 for a dense model.
func (p *Profile) ExpertShare(tokens int) float64 {
	e, k := p.MoE.Experts, p.MoE.ExpertsPerToken
	if e <= 0 || k <= 0 || k >= e {
		return 1
	}
	if tokens <= 0 {
		return 0
	}
	return 1 - math.Pow(1-float64(k)/float64(e), float64(tokens))
}

// CheckTolerance is how far a profile's model may be from each of its
// Checks: 25% of the public figure.
const CheckTolerance = 0.25

// Check is one public measurement and the point at which the model is run
// to compare with it. Exactly one figure is set:
//   - step_ms: a decode step of batch sequences of context tokens each;
//   - decode_tok_per_gpu_s: the output rate of such steps, per GPU;
//   - prefill_tok_per_gpu_s: prompts of prompt tokens in full passes;
//   - ttft_s: one prompt of prompt tokens alone, from arrival to first token;
//   - duration_s: a flood, as serving benchmarks run one: requests
//     prompts of prompt tokens, each answered with output tokens, all
//     sent at once (distinct prompts: no prefix shared), from the first
//     arrival to the last token. It runs prefill and decode together,
//     under the engine's KV capacity and batch limits.
type Check struct {
	Source   string `yaml:"source"`   // the measurement and where it is published
	Batch    int    `yaml:"batch"`    // decode: sequences in the step
	Context  int    `yaml:"context"`  // decode: context of each sequence, tokens
	Prompt   int    `yaml:"prompt"`   // prefill and flood: prompt length, tokens
	Requests int    `yaml:"requests"` // flood: requests sent at once
	Output   int    `yaml:"output"`   // flood: output tokens of each

	StepMs            float64 `yaml:"step_ms"`
	DecodeTokPerGPUs  float64 `yaml:"decode_tok_per_gpu_s"`
	PrefillTokPerGPUs float64 `yaml:"prefill_tok_per_gpu_s"`
	TTFTSec           float64 `yaml:"ttft_s"`
	DurationS         float64 `yaml:"duration_s"`
}

// IsDecode reports whether the check runs decode steps (batch and
// context), not a prefill (prompt).
func (c *Check) IsDecode() bool { return c.StepMs > 0 || c.DecodeTokPerGPUs > 0 }

// Want is the check's public figure.
func (c *Check) Want() float64 {
	return c.StepMs + c.DecodeTokPerGPUs + c.PrefillTokPerGPUs + c.TTFTSec + c.DurationS
}

func (c *Check) validate() error {
	set := 0
	for _, v := range []float64{c.StepMs, c.DecodeTokPerGPUs, c.PrefillTokPerGPUs, c.TTFTSec, c.DurationS} {
		switch {
		case v < 0 || math.IsNaN(v) || math.IsInf(v, 0):
			return fmt.Errorf("check %q: figures must be finite and positive", c.Source)
		case v > 0:
			set++
		}
	}
	switch {
	case set != 1:
		return fmt.Errorf("check %q: set exactly one of step_ms, decode_tok_per_gpu_s, prefill_tok_per_gpu_s, ttft_s, duration_s", c.Source)
	case c.DurationS > 0 && (c.Requests < 1 || c.Output < 1):
		return fmt.Errorf("check %q: a flood (duration_s) needs requests and output", c.Source)
	case c.IsDecode() && (c.Batch < 1 || c.Context < 1):
		return fmt.Errorf("check %q: a decode check needs batch and context", c.Source)
	case !c.IsDecode() && c.Prompt < 1:
		return fmt.Errorf("check %q: a prefill check needs prompt", c.Source)
	}
	return nil
}

// SparseAttention describes DeepSeek Sparse Attention (DSA), which
// DeepSeek-V3.2 and GLM-5 use: a lightweight indexer scores every key of a
// query's context, and the attention proper reads only the top_k it picks.
// Prefill then costs per_token_context_ns per pair within each token's top_k
// plus indexer_pair_cost of that per pair over the whole context; a decode
// step reads selected_kv_bytes_per_token for at most top_k tokens and the
// rest of kv_bytes_per_token (the indexer's keys) for every token.
type SparseAttention struct {
	TopK                    int     `yaml:"top_k"`                       // keys each query attends to; 0: dense attention
	SelectedKVBytesPerToken int     `yaml:"selected_kv_bytes_per_token"` // of kv_bytes_per_token, the part read only for selected keys
	IndexerPairCost         float64 `yaml:"indexer_pair_cost"`           // an indexer pair's cost, as a share of a dense attention pair's
	// PerTokenUs is the sparse path's own work per new prefill token
	// beyond the dense per_token_us (the indexer's projections, each
	// query's top-k selection, kernels less mature than dense ones).
	PerTokenUs float64 `yaml:"per_token_us"`
}

// IsSparse reports whether attention is sparse (top_k set).
func (p *Profile) IsSparse() bool { return p.Sparse.TopK > 0 }

// PrefillPairs returns the query-key pairs of n new tokens that follow c
// computed ones: all of them (each token attends to everything before it,
// counted at the chunk's midpoint, n * (c + n/2)), and those within each
// token's top_k keys (the same for dense attention).
func (p *Profile) PrefillPairs(c, n int) (all, topK float64) {
	fc, fn := float64(c), float64(n)
	all = fn * (fc + fn/2)
	k := p.Sparse.TopK
	switch {
	case k <= 0 || c+n <= k:
		return all, all
	case c >= k:
		return all, fn * float64(k)
	default: // the chunk crosses top_k: the integral of min(x, k) over [c, c+n)
		fk := float64(k)
		return all, (fk*fk-fc*fc)/2 + (fc+fn-fk)*fk
	}
}

// DecodeTopK is how many of a decode step's ctx context tokens the
// attention proper reads: min(ctx, top_k), or ctx for dense attention.
func (p *Profile) DecodeTopK(ctx int) int {
	if k := p.Sparse.TopK; k > 0 && ctx > k {
		return k
	}
	return ctx
}

// PrefillTokenSec is the per-token time of n new prefill tokens, before
// attention: prefill.per_token_us, and the sparse path's own per_token_us.
func (p *Profile) PrefillTokenSec(n int) float64 {
	us := p.Prefill.PerTokenUs
	if p.IsSparse() {
		us += p.Sparse.PerTokenUs
	}
	return us * 1e-6 * float64(n)
}

// DecodeBaseSec is a decode step's cost before its per-sequence terms:
// decode.base_ms and the share of decode.expert_read_ms that tokens
// routed tokens touch (see ExpertShare).
func (p *Profile) DecodeBaseSec(tokens int) float64 {
	return (p.Decode.BaseMs + p.Decode.ExpertReadMs*p.ExpertShare(tokens)) * 1e-3
}

// DecodeStepSec is the modelled duration of a decode step of batch
// sequences of ctx context tokens each, and nothing else.
func (p *Profile) DecodeStepSec(batch int, ctx float64) float64 {
	b := float64(batch)
	return p.DecodeBaseSec(batch) + p.Decode.PerSeqUs*1e-6*b + p.DecodeReadSec(b*ctx, b*float64(p.DecodeTopK(int(ctx))))
}

// PrefillAttentionSec is the attention time of a prefill whose pairs are
// all and, within each token's top_k, topK (see PrefillPairs).
func (p *Profile) PrefillAttentionSec(all, topK float64) float64 {
	pair := p.Prefill.PerTokenContextNs * 1e-9
	if !p.IsSparse() {
		return pair * all
	}
	return pair * (topK + p.Sparse.IndexerPairCost*all)
}

// DecodeReadSec is the time a decode step spends reading the KV of ctx
// context tokens, topK of them selected (see DecodeTopK).
func (p *Profile) DecodeReadSec(ctx, topK float64) float64 {
	bytes := ctx * float64(p.KVBytesPerToken)
	if p.IsSparse() {
		sel := float64(p.Sparse.SelectedKVBytesPerToken)
		bytes = topK*sel + ctx*(float64(p.KVBytesPerToken)-sel)
	}
	return bytes / (p.HBMGBps * 1e9 * p.Decode.KVReadEfficiency)
}

// PrefillCost is the prefill part of a pass:
// base + per_token * new + per_token_context * sum(new_i * context_i),
// where context_i is the average number of tokens the chunk's tokens attend to.
type PrefillCost struct {
	BaseMs            float64 `yaml:"base_ms"`
	PerTokenUs        float64 `yaml:"per_token_us"`
	PerTokenContextNs float64 `yaml:"per_token_context_ns"`
}

// DecodeCost is the decode part of a pass:
// base + expert_read * ExpertShare(tokens) + per_seq * batch +
// sum(context) * kv_bytes_per_token / (hbm * kv_read_efficiency).
type DecodeCost struct {
	BaseMs           float64 `yaml:"base_ms"`
	PerSeqUs         float64 `yaml:"per_seq_us"`
	KVReadEfficiency float64 `yaml:"kv_read_efficiency"` // share of HBM bandwidth attention reads reach
	// ExpertReadMs is what reading every routed expert's weights adds to a
	// step; a step pays the share its tokens touch (MoE, ExpertShare).
	ExpertReadMs float64 `yaml:"expert_read_ms"`
}

// GPUBlocks is the GPU KV capacity in blocks.
func (p *Profile) GPUBlocks() int { return p.GPUKVTokens / p.BlockSize }

// HostBlocks is the host KV capacity in blocks.
func (p *Profile) HostBlocks() int {
	if p.HostKVTokens == 0 {
		return 4 * p.GPUBlocks()
	}
	return p.HostKVTokens / p.BlockSize
}

// WithBlockSize returns a copy of the profile that models KV in blocks
// of tokens tokens: a power-of-two multiple of its own block size. A
// simulation runs faster on coarser blocks (fewer blocks to look up,
// reference, evict and move per request) at the cost of prefix hits and
// transfers rounded down to whole coarse blocks; capacities, bandwidths
// and pass costs are unchanged, since they are counted in tokens and
// bytes. The engines it stands for still use the profile's block size.
func (p *Profile) WithBlockSize(tokens int) (*Profile, error) {
	switch {
	case tokens < p.BlockSize || tokens&(tokens-1) != 0:
		return nil, fmt.Errorf("%d-token blocks: want a power of two of at least %d, the block size of profile %q", tokens, p.BlockSize, p.Name)
	case tokens > p.MaxModelLen || tokens > p.GPUKVTokens:
		return nil, fmt.Errorf("%d-token blocks: want at most %d, the context and KV capacity of profile %q", tokens, min(p.MaxModelLen, p.GPUKVTokens), p.Name)
	}
	c := *p
	c.BlockSize = tokens
	return &c, nil
}

// BlockBytes is the size of one KV block.
func (p *Profile) BlockBytes() float64 { return float64(p.BlockSize * p.KVBytesPerToken) }

// TransferTime is the time to move n blocks at gbps GB/s.
func (p *Profile) TransferTime(blocks int, gbps float64) time.Duration {
	if blocks <= 0 || gbps <= 0 {
		return 0
	}
	return seconds(float64(blocks) * p.BlockBytes() / (gbps * 1e9))
}

// Validate reports the first field that makes the profile unusable.
func (p *Profile) Validate() error {
	checks := []struct {
		ok   bool
		what string
	}{
		{p.Name != "", "name is empty"},
		{p.GPUs > 0, "gpus must be positive"},
		{p.BlockSize > 0 && p.BlockSize&(p.BlockSize-1) == 0, "block_size must be a power of two (vLLM takes 8 to 128)"},
		{p.MaxModelLen >= p.BlockSize, "max_model_len must hold at least one block"},
		{p.KVBytesPerToken > 0, "kv_bytes_per_token must be positive"},
		{p.GPUKVTokens >= p.BlockSize, "gpu_kv_tokens must hold at least one block"},
		{p.HostKVTokens >= 0, "host_kv_tokens must not be negative"},
		{p.HBMGBps > 0, "hbm_gbps must be positive"},
		{p.HostGBps > 0, "host_gbps must be positive"},
		{p.NetworkGBps > 0, "network_gbps must be positive"},
		{p.MaxNumSeqs >= 0 && p.MaxNumBatchedTokens >= 0, "max_num_seqs and max_num_batched_tokens must not be negative"},
		{p.Prefill.BaseMs >= 0 && p.Prefill.PerTokenUs > 0 && p.Prefill.PerTokenContextNs >= 0, "prefill costs: base_ms >= 0, per_token_us > 0, per_token_context_ns >= 0"},
		{p.Decode.BaseMs > 0 && p.Decode.PerSeqUs >= 0 && p.Decode.KVReadEfficiency > 0 && p.Decode.KVReadEfficiency <= 1, "decode costs: base_ms > 0, per_seq_us >= 0, 0 < kv_read_efficiency <= 1"},
		{p.Sparse.TopK >= 0, "sparse_attention.top_k must not be negative"},
		{!p.IsSparse() || p.Sparse.SelectedKVBytesPerToken > 0 && p.Sparse.SelectedKVBytesPerToken <= p.KVBytesPerToken,
			"sparse_attention.selected_kv_bytes_per_token must be positive and at most kv_bytes_per_token"},
		{!p.IsSparse() || p.Sparse.IndexerPairCost >= 0 && p.Sparse.IndexerPairCost <= 1, "sparse_attention.indexer_pair_cost must be between 0 and 1"},
		{p.Sparse.PerTokenUs >= 0 && p.Decode.ExpertReadMs >= 0, "sparse_attention.per_token_us and decode.expert_read_ms must not be negative"},
		{p.MoE.Experts >= 0 && p.MoE.ExpertsPerToken >= 0 && p.MoE.ExpertsPerToken <= p.MoE.Experts, "moe: experts and experts_per_token must not be negative, and a token takes at most every expert"},
	}
	for _, c := range checks {
		if !c.ok {
			return fmt.Errorf("profile %q: %s", p.Name, c.what)
		}
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"hbm_gbps", p.HBMGBps}, {"host_gbps", p.HostGBps}, {"network_gbps", p.NetworkGBps},
		{"prefill.base_ms", p.Prefill.BaseMs}, {"prefill.per_token_us", p.Prefill.PerTokenUs}, {"prefill.per_token_context_ns", p.Prefill.PerTokenContextNs},
		{"decode.base_ms", p.Decode.BaseMs}, {"decode.per_seq_us", p.Decode.PerSeqUs}, {"decode.expert_read_ms", p.Decode.ExpertReadMs},
		{"sparse_attention.indexer_pair_cost", p.Sparse.IndexerPairCost}, {"sparse_attention.per_token_us", p.Sparse.PerTokenUs}} {
		if math.IsInf(f.v, 0) || math.IsNaN(f.v) {
			return fmt.Errorf("profile %q: %s must be a finite number, not %v", p.Name, f.name, f.v)
		}
	}
	for i := range p.Checks {
		if err := p.Checks[i].validate(); err != nil {
			return fmt.Errorf("profile %q: %w", p.Name, err)
		}
	}
	return nil
}

// ProfileNames lists the built-in profiles.
func ProfileNames() []string {
	entries, _ := builtinProfiles.ReadDir("profiles")
	var names []string
	for _, e := range entries {
		names = append(names, strings.TrimSuffix(e.Name(), ".yaml"))
	}
	sort.Strings(names)
	return names
}

// BuiltinProfile returns the built-in profile of that name. Reading a
// profile from a file is the caller's (ParseProfile parses its bytes):
// this package does no I/O.
func BuiltinProfile(name string) (*Profile, error) {
	data, err := builtinProfiles.ReadFile("profiles/" + name + ".yaml")
	if err != nil {
		return nil, fmt.Errorf("unknown profile %q (built in: %s; or give a path to a YAML file)", name, strings.Join(ProfileNames(), ", "))
	}
	return ParseProfile(data)
}

// IsProfileFile reports whether nameOrPath names a YAML file rather than
// a built-in profile: it contains a path separator or ends in .yaml or
// .yml.
func IsProfileFile(nameOrPath string) bool {
	return strings.ContainsAny(nameOrPath, `/\`) || strings.HasSuffix(nameOrPath, ".yaml") || strings.HasSuffix(nameOrPath, ".yml")
}

// ParseProfile reads a profile from YAML; unknown fields are errors.
func ParseProfile(data []byte) (*Profile, error) {
	var p Profile
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	dec.KnownFields(true)
	if err := dec.Decode(&p); err != nil {
		return nil, fmt.Errorf("parse profile: %w", err)
	}
	if p.Model == "" {
		p.Model = p.Name
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return &p, nil
}

// MaxPass is the longest a modelled pass or transfer lasts: a profile's
// costs are checked to be finite, but large ones multiplied together could
// still pass time.Duration's range and run time backwards.
const MaxPass = 1000 * time.Hour

// seconds converts a modelled time to a Duration: at least 1 ns when
// positive, so that time always moves, and at most MaxPass.
func seconds(s float64) time.Duration {
	switch {
	case !(s > 0): // zero, negative or NaN
		return 0
	case s >= MaxPass.Seconds():
		return MaxPass
	}
	return max(time.Duration(s*float64(time.Second)), 1)
}
