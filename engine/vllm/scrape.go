package vllm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Load is what a scrape of vLLM's /metrics says about the engine now.
type Load struct {
	Running, Waiting int
	GPUKVUsage       float64 // 0..1
	// From vllm:cache_config_info, when vLLM exports it (0 otherwise).
	BlockSize, GPUBlocks, CPUBlocks int
	// Running sums since vLLM started, for the prefill cost: seconds
	// requests spent in prefill, and the prompt tokens those prefills
	// computed (vllm:request_prefill_kv_computed_tokens, else the prompt
	// tokens less the prefix cache's hits).
	PrefillSeconds, PrefillTokens float64
	// GeneratedTokens is vllm:generation_tokens_total.
	GeneratedTokens float64
}

// ScrapeMetrics reads vLLM's Prometheus metrics at base+"/metrics". Series
// of several model names or engines are summed (usage: the mean).
func ScrapeMetrics(ctx context.Context, hc *http.Client, base string) (Load, error) {
	var l Load
	req, err := http.NewRequestWithContext(ctx, "GET", base+"/metrics", nil)
	if err != nil {
		return l, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return l, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return l, fmt.Errorf("GET %s/metrics: %s: %s", base, resp.Status, b)
	}
	return ParseMetrics(resp.Body)
}

// ParseMetrics reads vLLM's metrics from Prometheus's text format.
func ParseMetrics(r io.Reader) (Load, error) {
	var l Load
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return l, fmt.Errorf("parse vLLM metrics: %w", err)
	}
	sum := func(names ...string) (float64, int) {
		for _, name := range names {
			if f := fams[name]; f != nil {
				t, n := 0.0, 0
				for _, m := range f.GetMetric() {
					t += value(m)
					n++
				}
				return t, n
			}
		}
		return 0, 0
	}
	run, _ := sum("vllm:num_requests_running")
	wait, _ := sum("vllm:num_requests_waiting")
	l.Running, l.Waiting = int(run), int(wait)
	if u, n := sum("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"); n > 0 {
		l.GPUKVUsage = u / float64(n)
	}
	hsum := func(name string) (float64, bool) {
		f := fams[name]
		if f == nil {
			return 0, false
		}
		t := 0.0
		for _, m := range f.GetMetric() {
			if h := m.GetHistogram(); h != nil {
				t += h.GetSampleSum()
			}
		}
		return t, true
	}
	l.PrefillSeconds, _ = hsum("vllm:request_prefill_time_seconds")
	if t, ok := hsum("vllm:request_prefill_kv_computed_tokens"); ok {
		l.PrefillTokens = t
	} else {
		// Servers without it (older vLLM, llm-d-inference-sim): the
		// prompt tokens less those found in the prefix cache, which a
		// prefill does not compute (all of them would make it look 10x
		// cheaper on an agent's cached contexts).
		prompt, _ := sum("vllm:prompt_tokens_total")
		hits, _ := sum("vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits_total")
		l.PrefillTokens = max(0, prompt-hits)
	}
	l.GeneratedTokens, _ = sum("vllm:generation_tokens_total")
	if f := fams["vllm:cache_config_info"]; f != nil && len(f.GetMetric()) > 0 {
		for _, lp := range f.GetMetric()[0].GetLabel() {
			n, err := strconv.Atoi(lp.GetValue())
			if err != nil {
				continue // "None" before the cache is sized
			}
			switch lp.GetName() {
			case "block_size":
				l.BlockSize = n
			case "num_gpu_blocks":
				l.GPUBlocks = n
			case "num_cpu_blocks":
				l.CPUBlocks = n
			}
		}
	}
	return l, nil
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Untyped != nil:
		return m.Untyped.GetValue()
	}
	return 0
}

// ModelInfo is what vLLM's /v1/models says of the model it serves.
type ModelInfo struct {
	ID          string
	MaxModelLen int
}

// ErrUnauthorized is vLLM refusing the engine token: it runs with another
// API key, or with one while the engine has no token.
var ErrUnauthorized = errors.New("vLLM refused the engine token (401): start it with VLLM_API_KEY (or --api-key) set to the engine token " +
	"(the TOKEN of the engine's --nats nats://TOKEN@..., or its --token), or without a key")

// Models reads the first model vLLM serves from base+"/v1/models".
func Models(ctx context.Context, hc *http.Client, base string) (ModelInfo, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", base+"/v1/models", nil)
	if err != nil {
		return ModelInfo{}, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return ModelInfo{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusUnauthorized {
		return ModelInfo{}, fmt.Errorf("GET %s/v1/models: %w", base, ErrUnauthorized)
	}
	if resp.StatusCode != 200 {
		return ModelInfo{}, fmt.Errorf("GET %s/v1/models: %s", base, resp.Status)
	}
	var out struct {
		Data []struct {
			ID          string `json:"id"`
			MaxModelLen int    `json:"max_model_len"`
		} `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&out); err != nil {
		return ModelInfo{}, fmt.Errorf("GET %s/v1/models: %w", base, err)
	}
	if len(out.Data) == 0 {
		return ModelInfo{}, fmt.Errorf("GET %s/v1/models: no model served", base)
	}
	return ModelInfo{ID: out.Data[0].ID, MaxModelLen: out.Data[0].MaxModelLen}, nil
}
