package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/evolvellm/evolve/cluster"
	"github.com/evolvellm/evolve/controlapi"
	"github.com/evolvellm/evolve/loadgen"
	"github.com/evolvellm/evolve/tokenizer"
	"github.com/evolvellm/evolve/workload"
	"github.com/spf13/cobra"
)

func newBenchCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Run closed-loop simulated agents against a router and report latency",
		Long: `Run a fleet of simulated agents against an OpenAI-compatible router (an
evolve cluster by default). Each agent runs sessions as real agents do: it
sends a call, waits for the answer, waits for its tool, and sends the next
call with the grown context. Workloads: ` + strings.Join(workload.Names(), ", ") + `,
mix:coding=3,math=1, or shift:A>B:T1:T2:T3.

Progress goes to stderr; the summary (mean and P50/P95/P99 of end-to-end
latency, time to first token and inter-token latency, requests and sessions
completed, tokens/s, prompt tokens by where their KV came from, errors) to
stdout, as a table or with -o json. Latencies are wall seconds: with engines
at --speedup X, multiply by X for modelled time (pass the same --speedup so
that think and tool times shrink to match).

A router that refuses connections for --unreachable-timeout (no answer of
any status between) ends the run early: the summary covers what ran until
then, says when the router went, and the exit status is 1. A call that
gets no answer at all (refused, or cut before its answer began), or whose
answer breaks off without an error (its router died while it streamed), is
sent again after 0.5 s, doubling up to 8 s, four times at most, as agents'
clients do (counted in requests_retried; the broken-off ones also in
requests_cut_and_resent): a router back within that time (a restart) loses
no call.
Requests ask for ignore_eos, so that answers are as long as the workload
draws them, on evolve's engines as on vLLM's.`,
		Example: `  evolve bench --workload coding --agents 32 --duration 10m
  evolve bench --url http://10.0.0.5:8000 --workload mix:coding=3,math=1 -o json
  evolve bench --workload coding --agents 8 --duration 5m --record fleet.jsonl
  evolve bench --trace conversation_trace.jsonl --playback 60`,
		Args: noArgs,
		RunE: runBench,
	}
	f := cmd.Flags()
	f.String("url", "", "router base URL, with or without /v1, or several routers' comma-separated: each session goes to one, and a call that gets no answer or is cut short goes to the next (default: the local cluster's routers, else http://127.0.0.1:8000)")
	f.String("api-key", "", "API key the router requires, sent as a bearer token (default: the local cluster's, when evolve up gave it keys; or $EVOLVE_BENCH_API_KEY)")
	f.Int("vocab-size", 0, fmt.Sprintf("against vLLM: the model's vocab_size (its config.json's); prompt token ids at or above it are folded below it, the same id to the same one (0: evolve's ids as they are, up to %d, which a smaller vocabulary refuses as out of vocabulary)", tokenizer.VocabSize))
	f.String("workload", "coding", "agent workload")
	f.Int("agents", 8, "concurrent agents")
	f.Duration("duration", time.Minute, "how long to run (0: until Ctrl-C)")
	f.Float64("speedup", 1, "divide think and tool times by this (match the engines' --speedup); against the local cluster, its engines' speedup unless given")
	f.Int64("seed", 1, "random seed of the agents")
	f.String("trace", "", "replay this JSONL trace (Mooncake format, or one recorded with --record; .gz read as gzip) instead of running agents")
	f.Float64("playback", 1, "with --trace: replay this many times faster than recorded")
	f.String("record", "", "record every call of the agents to this JSONL trace (gzipped if it ends in .gz)")
	f.Duration("unreachable-timeout", loadgen.DefaultUnreachable, "stop early, with the summary so far and exit status 1, once the router has refused connections this long with no answer between (0: never; keep trying through a long router restart)")
	addOutputFlag(cmd, "table or json")
	return cmd
}

// servedNothing is a load run's failure when no request was answered:
// every one failed, or none could be sent; nil otherwise.
func servedNothing(res loadgen.Result) error {
	if res.Requests == 0 && res.Errors > 0 {
		return fmt.Errorf("every request failed; last error: %s", res.LastError)
	}
	if res.Requests == 0 && res.OverContext > 0 {
		return fmt.Errorf("no request was sent: %d sessions ended because their prompts exceed the model's context (max_model_len %d); "+
			"run the cluster with a longer-context profile (evolve up --profile gb300-kimi-k2) or another --workload", res.OverContext, res.MaxContext)
	}
	return nil
}

// progressLine is a load run's line every few seconds: with a known
// total, a bar and the share done first.
func progressLine(w io.Writer, s loadgen.Snapshot, total time.Duration, extra string) {
	at := "t=" + s.Elapsed.Round(time.Second).String()
	if total > 0 {
		frac := min(1, float64(s.Elapsed)/float64(total))
		at = fmt.Sprintf("%s/%s %s %3.0f%%", at, total.Round(time.Second), bar(frac, 10), 100*frac)
	}
	interval := "no answer finished" // long answers: not a latency of 0
	if s.TTFT.N > 0 || s.E2E.N > 0 {
		interval = "TTFT " + percentiles(s.TTFT) + ", E2E " + percentiles(s.E2E)
	}
	sessions := strconv.Itoa(s.Sessions)
	if s.OverContext > 0 {
		sessions += fmt.Sprintf(" (%d ended past the context)", s.OverContext)
	}
	fmt.Fprintf(w, "%-8s requests %d (%d errors), sessions %s | last interval: %s%s\n",
		at, s.Requests, s.Errors, sessions, interval, extra)
}

// percentiles is a progress line's p50 and p95 of d, or - without samples.
func percentiles(d workload.Dist) string {
	if d.N == 0 {
		return "-"
	}
	return fmt.Sprintf("p50 %.3fs p95 %.3fs", d.P50, d.P95)
}

// bar draws frac (0..1) in n cells, to the eighth of a cell.
func bar(frac float64, n int) string {
	eighths := int(frac*float64(n*8) + 0.5)
	full, part := eighths/8, eighths%8
	b := strings.Repeat("█", min(full, n))
	if full < n {
		if part > 0 {
			b += string([]rune(" ▏▎▍▌▋▊▉")[part])
			full++
		}
		b += strings.Repeat(" ", n-full)
	}
	return "[" + b + "]"
}

func printBench(cmd *cobra.Command, res loadgen.Result) error {
	return output(cmd, res, func(w *tabwriter.Writer, _ bool) {
		if res.Agents > 0 {
			fmt.Fprintf(w, "workload\t%s, %s, %.0f s\n", res.Workload, counted(res.Agents, "agent"), res.DurationSec)
		} else {
			fmt.Fprintf(w, "workload\t%s replay, %.0f s\n", res.Workload, res.DurationSec) // a trace: no agents of its own
		}
		fmt.Fprintf(w, "requests\t%d completed, %d errors; %d sessions completed\n", res.Requests, res.Errors, res.Sessions)
		if res.OverContext > 0 {
			fmt.Fprintf(w, "\t%s ended early: their prompts outgrew the model's context (max_model_len %d)\n", counted(res.OverContext, "session"), res.MaxContext)
			if res.GaveUp {
				fmt.Fprintln(w, "\tstopped early: no session's first prompt fits the model's context")
			}
		}
		if res.Retried > 0 {
			fmt.Fprintf(w, "\t%s again: the router asked to retry later (429 or 503 with Retry-After: an API key at its max-concurrency, an engine draining), gave no answer, or cut %d answers short (a router restarting)\n",
				counted(res.Retried, "request")+" sent", res.Cut)
		}
		fmt.Fprintln(w, "\tmean\tp50\tp95\tp99")
		for _, r := range []struct {
			name string
			d    workload.Dist
		}{{"e2e (s)", res.E2E}, {"ttft (s)", res.TTFT}, {"itl (s)", res.ITL}} {
			if r.d.N == 0 { // nothing measured: not a latency of 0
				fmt.Fprintf(w, "%s\t-\t-\t-\t-\n", r.name)
				continue
			}
			fmt.Fprintf(w, "%s\t%.3f\t%.3f\t%.3f\t%.3f\n", r.name, r.d.Mean, r.d.P50, r.d.P95, r.d.P99)
		}
		fmt.Fprintf(w, "throughput\t%.0f output tokens/s\n", res.TokensPerSec)
		if res.PromptTokens > 0 {
			p := float64(res.PromptTokens)
			switch {
			case res.GPUHitTokens+res.HostHitTokens+res.TransferredTokens+res.ComputedTokens > 0:
				fmt.Fprintf(w, "prompt KV\t%.1f%% GPU hit, %.1f%% host hit, %.1f%% computed; %.1f%% moved from prefill to decode engines\n",
					100*float64(res.GPUHitTokens)/p, 100*float64(res.HostHitTokens)/p, 100*float64(res.ComputedTokens)/p, 100*float64(res.TransferredTokens)/p)
				if res.Preemptions > 0 {
					fmt.Fprintf(w, "preemptions\t%d: engines ran out of KV and recomputed what those requests had (counted as computed)\n", res.Preemptions)
				}
			case res.CachedTokens > 0: // engines without evolve's breakdown (vLLM)
				fmt.Fprintf(w, "prompt KV\t%.1f%% cached, as the engines report it (no breakdown by tier)\n", 100*float64(res.CachedTokens)/p)
			default:
				fmt.Fprintln(w, "prompt KV\tnot reported by the engines (vLLM: --enable-prompt-tokens-details)")
			}
		}
		if res.HandedOver > 0 {
			fmt.Fprintf(w, "moved\t%s continued on another engine mid-answer (a decode node switched role, or an engine stopped or failed)\n", counted(res.HandedOver, "request"))
		}
		if res.RouterGone {
			fmt.Fprintf(w, "stopped\tearly: the router refused connections from %.1fs on\n", res.RouterGoneAtS)
		}
		if res.Errors > 1 {
			fmt.Fprintf(w, "first error\tat %.1fs: %s\n", res.FirstErrorAtS, res.FirstError)
		}
		if res.LastError != "" {
			fmt.Fprintf(w, "last error\tat %.1fs: %s\n", res.LastErrorAtS, res.LastError)
		}
	})
}

// localEngineSpeedup is the speedup of the local cluster's engines, from
// its control API (0 when there is none, or it does not say).
func localEngineSpeedup(cmd *cobra.Command) float64 {
	if _, err := cluster.ReadLocalState(localDir()); err != nil {
		return 0
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), 2*time.Second)
	defer cancel()
	var st controlapi.Cluster
	if err := newControlClient(cmd).do(ctx, "GET", "/api/v1/cluster", nil, &st); err != nil {
		return 0
	}
	return st.Speedup
}

// localRouters is every router of the local cluster, comma-separated.
func localRouters(st *cluster.LocalState) string {
	if len(st.Orchestrators) < 2 {
		return st.RouterURL
	}
	var urls []string
	for _, o := range st.Orchestrators {
		urls = append(urls, o.RouterURL)
	}
	return strings.Join(urls, ",")
}

// routerBases is serverBase of each of a comma-separated list of routers.
func routerBases(urls string) string {
	var out []string
	for _, u := range strings.Split(urls, ",") {
		if u = strings.TrimSpace(u); u != "" {
			out = append(out, serverBase(u))
		}
	}
	return strings.Join(out, ",")
}

// runBench is evolve bench: agents (or a trace) against a router, then
// their summary.
func runBench(cmd *cobra.Command, _ []string) error {
	k := func(s string) string { return cfgKey(cmd) + "." + s }
	warnOnCommandLine(cmd, "api-key", "$EVOLVE_BENCH_API_KEY")
	url, apiKey := config.GetString(k("url")), config.GetString(k("api-key"))
	if url == "" {
		url = "http://127.0.0.1:8000"
		st, err := cluster.ReadLocalState(localDir())
		var damaged *cluster.DamagedStateError
		switch {
		case err == nil:
			url = localRouters(st)
			apiKey = cmp.Or(apiKey, st.APIKey)
		case errors.As(err, &damaged):
			// Not the default URL, which may be another user's router.
			return fmt.Errorf("%w: pass the router's URL with --url, or remove the file if no local cluster runs", err)
		}
	}
	switch {
	case config.GetDuration(k("duration")) < 0:
		return usageError{cmd: cmd.CommandPath(), err: fmt.Errorf("--duration must not be negative (0 runs until Ctrl-C)")}
	case config.GetDuration(k("unreachable-timeout")) < 0:
		return usageError{cmd: cmd.CommandPath(), err: fmt.Errorf("--unreachable-timeout must not be negative (0 never stops for an unreachable router)")}
	case config.GetFloat64(k("speedup")) <= 0:
		return usageError{cmd: cmd.CommandPath(), err: fmt.Errorf("--speedup must be positive")}
	case config.GetFloat64(k("playback")) <= 0:
		return usageError{cmd: cmd.CommandPath(), err: fmt.Errorf("--playback must be positive (2 replays twice as fast as recorded)")}
	case config.GetInt(k("vocab-size")) != 0 && config.GetInt(k("vocab-size")) < loadgen.MinVocabSize:
		return usageError{cmd: cmd.CommandPath(), err: fmt.Errorf("--vocab-size must be at least %d (a model's vocab_size; 0 leaves the ids as they are)", loadgen.MinVocabSize)}
	}
	// Ctrl-C, a closed terminal or a dead pipe (| head) end the run
	// with its summary and recording, rather than killing it.
	ctx, stop := notifyInterrupt(cmd.Context())
	defer stop()
	errw := cmd.ErrOrStderr()
	base := loadgen.BenchConfig{URL: routerBases(url), Duration: config.GetDuration(k("duration")),
		Speedup: config.GetFloat64(k("speedup")), Seed: uint64(config.GetInt64(k("seed"))), APIKey: apiKey,
		VocabSize: config.GetInt(k("vocab-size")), Unreachable: config.GetDuration(k("unreachable-timeout"))}
	trace := config.GetString(k("trace"))
	local := 0.0 // the local cluster's engine speedup, when bench runs against it
	if config.GetString(k("url")) == "" {
		local = localEngineSpeedup(cmd)
	}
	switch {
	case local <= 0 || local == 1:
	case trace == "" && !cmd.Flags().Changed("speedup") && base.Speedup == 1:
		// Against the local cluster, think and tool times follow its
		// engines' clock unless told otherwise.
		base.Speedup = local
		fmt.Fprintf(errw, "the local cluster's engines run %gx: think and tool times shrink to match (--speedup %g); latencies are wall-clock\n", local, local)
	case trace != "" && !cmd.Flags().Changed("playback"):
		fmt.Fprintf(errw, "the local cluster's engines run %gx: --playback %g replays the trace in their time\n", local, local)
	}
	total := base.Duration // what the progress bar fills up to (0: until Ctrl-C)
	base.Progress = func(s loadgen.Snapshot) { progressLine(errw, s, total, "") }
	var res loadgen.Result
	if trace != "" {
		recs, err := readTraceFile(trace)
		if err != nil {
			return usageError{cmd: cmd.CommandPath(), err: fmt.Errorf("--trace: %w", err)}
		}
		playback := config.GetFloat64(k("playback"))
		// A replay ends with its last request or --duration.
		if span := workload.TraceSpan(recs, playback); len(recs) > 0 && (total == 0 || span < total) {
			total = span
		}
		fmt.Fprintf(errw, "replaying %d requests from %s at %gx\n", len(recs), trace, playback)
		var skipped int
		res, skipped, err = loadgen.Replay(ctx, loadgen.ReplayConfig{BenchConfig: base, Records: recs, Playback: playback})
		if err != nil {
			return err
		}
		if skipped > 0 {
			fmt.Fprintf(errw, "%d requests skipped: their prompts exceed the model's context\n", skipped)
		}
	} else {
		agents := config.GetInt(k("agents"))
		if agents < 1 {
			return usageError{cmd: cmd.CommandPath(), err: fmt.Errorf("--agents must be at least 1")}
		}
		model, err := workload.New(config.GetString(k("workload")), agents)
		if err != nil {
			return usageError{cmd: cmd.CommandPath(), err: err}
		}
		base.Model, base.Agents = model, agents
		var rec *recording
		if path := config.GetString(k("record")); path != "" {
			// Written beside path, and put there at the end (a
			// Ctrl-C included).
			if rec, err = startRecording(path); err != nil {
				return usageError{cmd: cmd.CommandPath(), err: fmt.Errorf("--record: %w", err)}
			}
			defer rec.discard() // nothing left once kept
			base.Record = rec.w
		}
		if res, err = loadgen.Bench(ctx, base); err != nil {
			return err
		}
		if rec != nil {
			if err := rec.keep(); err != nil {
				return err
			}
		}
	}
	if err := printBench(cmd, res); err != nil {
		return err
	}
	if res.RouterGone {
		return fmt.Errorf("the router at %s refused connections from %.1fs on for %s, so the run stopped early; the summary covers what ran until then (--unreachable-timeout 0 keeps trying)",
			base.URL, res.RouterGoneAtS, base.Unreachable)
	}
	return servedNothing(res)
}
