package engine

import (
	"time"

	"github.com/evolvellm/evolve/engine/stepmodel"
	"github.com/evolvellm/evolve/roles"
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the engine's Prometheus metrics, named as vLLM names them
// where vLLM has one, so that dashboards and planners built for vLLM work.
// Latencies are modelled seconds.
type metrics struct {
	reg     *prometheus.Registry
	ttft    prometheus.Histogram
	itl     prometheus.Histogram
	e2e     prometheus.Histogram
	queue   prometheus.Histogram
	pass    prometheus.Histogram
	aborted prometheus.Counter
	// handedOver counts decodes this engine handed to peers (OpHandOver).
	handedOver prometheus.Counter
	role       *prometheus.GaugeVec
	xfer       prometheus.Counter
}

var latencyBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 320, 640}

func newMetrics(e *Simulated) *metrics {
	labels := prometheus.Labels{"model_name": e.cfg.ServedModelName, "engine": e.cfg.ID}
	reg := prometheus.NewRegistry()
	m := &metrics{reg: reg}
	hist := func(name, help string, buckets []float64) prometheus.Histogram {
		h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets, ConstLabels: labels})
		reg.MustRegister(h)
		return h
	}
	m.ttft = hist("vllm:time_to_first_token_seconds", "Time to first token (modelled).", latencyBuckets)
	m.itl = hist("vllm:inter_token_latency_seconds", "Time between output tokens (modelled).", latencyBuckets)
	m.e2e = hist("vllm:e2e_request_latency_seconds", "Request latency, arrival to last token (modelled).", latencyBuckets)
	m.queue = hist("vllm:request_queue_time_seconds", "Time waiting before first scheduled (modelled).", latencyBuckets)
	m.pass = hist("evolve_engine_pass_seconds", "Forward pass duration (modelled).", latencyBuckets)
	m.aborted = prometheus.NewCounter(prometheus.CounterOpts{Name: "evolve_engine_aborted_requests_total", Help: "Requests aborted by their client.", ConstLabels: labels})
	m.xfer = prometheus.NewCounter(prometheus.CounterOpts{Name: "vllm:nixl_bytes_transferred", Help: "KV bytes pulled from peers.", ConstLabels: labels})
	m.role = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "evolve_engine_role", Help: "1 for the engine's current role.", ConstLabels: labels}, []string{"role"})
	m.handedOver = prometheus.NewCounter(prometheus.CounterOpts{Name: "evolve_engine_handed_over_requests_total", Help: "Running decodes handed to a peer engine before a role switch.", ConstLabels: labels})
	reg.MustRegister(m.aborted, m.handedOver, m.xfer, m.role)
	m.setRole(e.cfg.Role)

	gauge := func(name, help string, f func(s *snapshot) float64) {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels}, func() float64 {
			e.mu.Lock()
			defer e.mu.Unlock()
			return f(&e.snap)
		}))
	}
	counter := func(name, help string, f func(c *stepmodel.Counters) float64) {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels}, func() float64 {
			e.mu.Lock()
			defer e.mu.Unlock()
			return f(&e.snap.counters)
		}))
	}
	gauge("vllm:num_requests_running", "Requests in the running batch.", func(s *snapshot) float64 { return float64(s.stats.Running) })
	gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.", func(s *snapshot) float64 { return float64(s.stats.Waiting) })
	gauge("vllm:kv_cache_usage_perc", "GPU KV blocks in use by requests, 0 to 1.", func(s *snapshot) float64 {
		return ratio(s.stats.GPUBlocksUsed, s.stats.GPUBlocks)
	})
	gauge("evolve_engine_host_kv_usage_perc", "Host-tier KV blocks held, 0 to 1.", func(s *snapshot) float64 {
		return ratio(s.stats.HostBlocksUsed, s.stats.HostBlocks)
	})
	gauge("evolve_engine_held_requests", "Prefill legs holding KV for a decode peer.", func(s *snapshot) float64 { return float64(s.stats.Held) })
	counter("vllm:prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.", func(c *stepmodel.Counters) float64 { return float64(c.PrefixQueries) })
	counter("vllm:prefix_cache_hits_total", "Prompt tokens found in the prefix cache (GPU, host or transferred).", func(c *stepmodel.Counters) float64 { return float64(c.PrefixHits) })
	counter("vllm:num_preemptions_total", "Preemptions.", func(c *stepmodel.Counters) float64 { return float64(c.Preemptions) })
	counter("vllm:prompt_tokens_total", "Prompt tokens of finished requests.", func(c *stepmodel.Counters) float64 { return float64(c.PromptTokens) })
	counter("vllm:generation_tokens_total", "Tokens generated.", func(c *stepmodel.Counters) float64 { return float64(c.GenerationTokens) })
	counter("evolve_engine_offloaded_blocks_total", "KV blocks copied GPU to host.", func(c *stepmodel.Counters) float64 { return float64(c.OffloadedBlocks) })
	counter("evolve_engine_fetched_blocks_total", "KV blocks fetched from peers into host.", func(c *stepmodel.Counters) float64 { return float64(c.FetchedBlocks) })
	counter("evolve_engine_busy_seconds_total", "Modelled time spent in forward passes.", func(c *stepmodel.Counters) float64 { return c.BusyTime.Seconds() })
	return m
}

func (m *metrics) setRole(r roles.Role) {
	for _, x := range []roles.Role{roles.Both, roles.Prefill, roles.Decode} {
		v := 0.0
		if x == r {
			v = 1
		}
		m.role.WithLabelValues(x.String()).Set(v)
	}
}

func (m *metrics) observePass(d time.Duration) { m.pass.Observe(d.Seconds()) }

func (m *metrics) observeFinished(f *stepmodel.Finished) {
	u := &f.Usage
	if !u.FirstToken.IsZero() {
		m.ttft.Observe(u.FirstToken.Sub(u.Arrival).Seconds())
	}
	if !u.FirstScheduled.IsZero() {
		m.queue.Observe(u.FirstScheduled.Sub(u.Arrival).Seconds())
	}
	m.e2e.Observe(u.Finish.Sub(u.Arrival).Seconds())
}
