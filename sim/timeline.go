package sim

import (
	"encoding/csv"
	"fmt"
	"io"
	"strconv"

	"github.com/evolvellm/evolve/workload"
)

// WriteTimeline writes each result's timeline as CSV, one row per policy
// and minute: the serving prefill/decode split and requests queued on
// engines at the minute's end; the requests that arrived in the minute and
// their mean and P95 end-to-end latency and TTFT; and the output tokens per
// second of the requests that finished in it; for a policy with evolve's
// planner, the split it recommended at the minute's end and the TTFT it
// predicted for the split it had (empty otherwise).
func WriteTimeline(w io.Writer, results []Result) error {
	cw := csv.NewWriter(w)
	cw.Write([]string{"policy", "minute", "prefill", "decode", "waiting", "requests", "mean_e2e_s", "p95_e2e_s", "mean_ttft_s", "p95_ttft_s", "output_tok_s",
		"planner_recommended_prefill", "planner_predicted_ttft_s"})
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', 3, 64) }
	for _, r := range results {
		for _, win := range r.Timeline {
			rec, pred := plannerColumns(win)
			e2e, ttft := workload.Summarize(append([]float64(nil), win.e2e...)), workload.Summarize(append([]float64(nil), win.ttft...))
			cw.Write([]string{r.Policy, strconv.Itoa(int(win.Start.Minutes())), strconv.Itoa(win.Prefill), strconv.Itoa(win.Decode),
				strconv.Itoa(win.Waiting), strconv.Itoa(win.Requests), f(e2e.Mean), f(e2e.P95), f(ttft.Mean), f(ttft.P95),
				f(float64(win.OutputTokens) / 60), rec, pred})
		}
	}
	cw.Flush()
	if err := cw.Error(); err != nil {
		return fmt.Errorf("write timeline: %w", err)
	}
	return nil
}

// plannerColumns formats the planner's columns: empty for a window of a
// policy without evolve's planner.
func plannerColumns(w Window) (recommended, predictedTTFT string) {
	if !w.planned {
		return "", ""
	}
	return strconv.Itoa(w.Recommended), strconv.FormatFloat(w.PredictedTTFT, 'f', 3, 64)
}

// MeanE2E is the mean end-to-end latency, in seconds, of the requests that
// arrived in the window (0 when none did).
func (w Window) MeanE2E() float64 {
	if len(w.e2e) == 0 {
		return 0
	}
	sum := 0.0
	for _, x := range w.e2e {
		sum += x
	}
	return sum / float64(len(w.e2e))
}
