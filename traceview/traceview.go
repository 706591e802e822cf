// Package traceview looks at recorded traffic: it reads the rows a
// router records (evolve orchestrator --record), and the traces evolve
// bench and sim write or Mooncake publishes, merges the files of several
// routers, and makes a summary of them (sessions, turns, lengths, tool
// times, KV reuse by source, the nodes' load) and a timeline Perfetto
// opens (ui.perfetto.dev: the Chrome trace event format).
package traceview

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/evolvellm/evolve/workload"
)

// Format names what a file holds.
const (
	FormatEvolve   = "evolve recording" // rows with live fields
	FormatMooncake = "mooncake trace"   // timestamps, lengths and hash ids only
)

// Read reads one file's rows (gzipped when its bytes say so), every row
// kept, failed ones too; name is for errors. It says which format it
// found. A gzipped file cut short (a recording still being written, or
// left by a router killed or out of disk) gives the rows it holds whole:
// cut says it was cut.
func Read(name string, r io.Reader) (recs []workload.TraceRecord, format string, cut bool, err error) {
	br := bufio.NewReader(r)
	var src io.Reader = br
	if head, _ := br.Peek(2); bytes.Equal(head, []byte{0x1f, 0x8b}) {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, "", false, fmt.Errorf("%s: %w", name, err)
		}
		defer zr.Close()
		b, err := io.ReadAll(zr)
		if errors.Is(err, io.ErrUnexpectedEOF) {
			cut = true
			if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
				b = b[:i+1] // its last row, cut, is left out
			} else {
				b = nil
			}
		} else if err != nil {
			return nil, "", false, fmt.Errorf("%s: %w", name, err)
		}
		src = bytes.NewReader(b)
	}
	recs, err = workload.ReadTraceAll(src)
	if err != nil {
		return nil, "", cut, fmt.Errorf("%s: %w", name, err)
	}
	format = FormatMooncake
	for _, r := range recs {
		if r.Live != nil {
			format = FormatEvolve
			break
		}
	}
	return recs, format, cut, nil
}

// Merge joins the rows of several routers' files into one trace: rows
// with live fields are put on one clock (their arrival's Unix time, the
// earliest at 0); others keep their timestamps. Rows come back by time.
func Merge(sets ...[]workload.TraceRecord) []workload.TraceRecord {
	var all []workload.TraceRecord
	first := -1.0
	for _, s := range sets {
		for _, r := range s {
			if r.Live != nil && (first < 0 || r.UnixMS < first) {
				first = r.UnixMS
			}
		}
		all = append(all, s...)
	}
	for i := range all {
		if all[i].Live != nil {
			all[i].Timestamp = all[i].UnixMS - first
		}
	}
	sort.SliceStable(all, func(i, j int) bool { return all[i].Timestamp < all[j].Timestamp })
	return all
}

// Summary is what a trace holds, for an operator sizing a cluster to it.
type Summary struct {
	Format    string         `json:"format"`
	Requests  int            `json:"requests"`
	Outcomes  map[string]int `json:"outcomes,omitempty"` // evolve recordings: ok, bad_request, failed...
	Routers   []string       `json:"routers,omitempty"`
	SpanSec   float64        `json:"span_s"`
	Sessions  int            `json:"sessions"`
	Turns     workload.Dist  `json:"turns_per_session"` // the _s fields are counts here
	Prompt    workload.Dist  `json:"prompt_tokens"`     // and token counts
	Output    workload.Dist  `json:"output_tokens"`
	ToolTime  workload.Dist  `json:"tool_time"` // seconds between a session's answer and its next request
	TTFT      workload.Dist  `json:"ttft"`
	E2E       workload.Dist  `json:"e2e"`
	ToolCalls int            `json:"tool_calls"`
	// Reuse is the prompt tokens by where their KV came from, as shares:
	// gpu, host, peer, computed (evolve recordings).
	Reuse map[string]float64 `json:"reuse,omitempty"`
	// Nodes is each node's load: requests prefilled and decoded, and the
	// prompt and output tokens.
	Nodes []NodeLoad `json:"nodes,omitempty"`
}

// NodeLoad is a node's share of a recording.
type NodeLoad struct {
	Node          string `json:"node"`
	Prefilled     int    `json:"prefilled"`
	Decoded       int    `json:"decoded"`
	PromptTokens  int64  `json:"prompt_tokens"`
	ComputedToks  int64  `json:"computed_tokens"`
	OutputTokens  int64  `json:"output_tokens"`
	SplitRequests int    `json:"split_requests"` // prefilled here, decoded elsewhere
}

// Summarize makes the summary of recs (Merge's), of format.
func Summarize(recs []workload.TraceRecord, format string) Summary {
	s := Summary{Format: format, Requests: len(recs), Outcomes: map[string]int{}, Reuse: map[string]float64{}}
	turns := map[string]int{}
	var prompt, output, gaps, ttft, e2e []float64
	routers := map[string]bool{}
	nodes := map[string]*NodeLoad{}
	node := func(id string) *NodeLoad {
		if nodes[id] == nil {
			nodes[id] = &NodeLoad{Node: id}
		}
		return nodes[id]
	}
	var src [4]int64
	end := 0.0
	for _, r := range recs {
		prompt = append(prompt, float64(r.InputLength))
		output = append(output, float64(r.OutputLength))
		if r.Session != "" {
			turns[r.Session]++
		}
		stop := r.Timestamp
		if l := r.Live; l != nil {
			s.Outcomes[l.Outcome]++
			routers[l.Router] = true
			stop += l.E2ESec * 1000
			if l.Outcome == "ok" {
				e2e = append(e2e, l.E2ESec)
				if l.TTFTSec > 0 {
					ttft = append(ttft, l.TTFTSec)
				}
			}
			if l.GapSec != nil {
				gaps = append(gaps, *l.GapSec)
			}
			s.ToolCalls += l.ToolCalls
			src[0], src[1], src[2], src[3] = src[0]+int64(l.CachedGPU), src[1]+int64(l.CachedHost), src[2]+int64(l.CachedPeer), src[3]+int64(l.Computed)
			if l.PrefillNode != "" {
				n := node(l.PrefillNode)
				n.Prefilled++
				n.PromptTokens += int64(r.InputLength)
				n.ComputedToks += int64(l.Computed)
				if l.DecodeNode != l.PrefillNode {
					n.SplitRequests++
				}
			}
			if l.DecodeNode != "" {
				n := node(l.DecodeNode)
				n.Decoded++
				n.OutputTokens += int64(r.OutputLength)
			}
		}
		end = max(end, stop)
	}
	if len(recs) > 0 {
		s.SpanSec = (end - recs[0].Timestamp) / 1000
	}
	var perSession []float64
	for _, n := range turns {
		perSession = append(perSession, float64(n))
	}
	s.Sessions = len(turns)
	s.Turns, s.Prompt, s.Output = workload.Summarize(perSession), workload.Summarize(prompt), workload.Summarize(output)
	s.ToolTime, s.TTFT, s.E2E = workload.Summarize(gaps), workload.Summarize(ttft), workload.Summarize(e2e)
	if total := src[0] + src[1] + src[2] + src[3]; total > 0 {
		for i, k := range []string{"gpu", "host", "peer", "computed"} {
			s.Reuse[k] = float64(src[i]) / float64(total)
		}
	}
	for r := range routers {
		s.Routers = append(s.Routers, r)
	}
	sort.Strings(s.Routers)
	for _, n := range nodes {
		s.Nodes = append(s.Nodes, *n)
	}
	sort.Slice(s.Nodes, func(i, j int) bool { return s.Nodes[i].Node < s.Nodes[j].Node })
	if len(s.Outcomes) == 0 {
		s.Outcomes = nil
	}
	if len(s.Reuse) == 0 {
		s.Reuse = nil
	}
	return s
}

// WriteText writes the summary for people.
func (s Summary) WriteText(w io.Writer) {
	fmt.Fprintf(w, "%s: %d requests over %s", s.Format, s.Requests, seconds(s.SpanSec))
	if len(s.Routers) > 0 {
		fmt.Fprintf(w, ", from %d router(s) (%s)", len(s.Routers), strings.Join(s.Routers, ", "))
	}
	fmt.Fprintln(w)
	if len(s.Outcomes) > 0 {
		var parts []string
		for _, k := range sortedKeys(s.Outcomes) {
			parts = append(parts, fmt.Sprintf("%s %d", k, s.Outcomes[k]))
		}
		fmt.Fprintf(w, "outcomes       %s\n", strings.Join(parts, ", "))
	}
	if s.Sessions > 0 {
		fmt.Fprintf(w, "sessions       %d; turns per session mean %.1f, p50 %.0f, p95 %.0f\n", s.Sessions, s.Turns.Mean, s.Turns.P50, s.Turns.P95)
	} else {
		fmt.Fprintln(w, "sessions       none named")
	}
	fmt.Fprintf(w, "prompt tokens  mean %.0f, p50 %.0f, p95 %.0f\n", s.Prompt.Mean, s.Prompt.P50, s.Prompt.P95)
	fmt.Fprintf(w, "output tokens  mean %.0f, p50 %.0f, p95 %.0f\n", s.Output.Mean, s.Output.P50, s.Output.P95)
	if s.ToolTime.N > 0 {
		fmt.Fprintf(w, "tool time      mean %s, p50 %s, p95 %s (%d gaps between a session's answer and its next request)\n",
			seconds(s.ToolTime.Mean), seconds(s.ToolTime.P50), seconds(s.ToolTime.P95), s.ToolTime.N)
	}
	if s.E2E.N > 0 {
		fmt.Fprintf(w, "latency        TTFT p50 %s, p95 %s; end to end mean %s, p95 %s\n", seconds(s.TTFT.P50), seconds(s.TTFT.P95), seconds(s.E2E.Mean), seconds(s.E2E.P95))
	}
	if s.ToolCalls > 0 {
		fmt.Fprintf(w, "tool calls     %d in the answers\n", s.ToolCalls)
	}
	if len(s.Reuse) > 0 {
		fmt.Fprintf(w, "prompt KV      %.0f%% GPU hit, %.0f%% host hit, %.0f%% fetched from a peer, %.0f%% computed\n",
			100*s.Reuse["gpu"], 100*s.Reuse["host"], 100*s.Reuse["peer"], 100*s.Reuse["computed"])
	}
	if len(s.Nodes) > 0 {
		fmt.Fprintf(w, "\n%-16s %9s %8s %8s %14s %14s\n", "NODE", "PREFILLED", "SPLIT", "DECODED", "PROMPT-TOK", "OUTPUT-TOK")
		for _, n := range s.Nodes {
			fmt.Fprintf(w, "%-16s %9d %8d %8d %14d %14d\n", n.Node, n.Prefilled, n.SplitRequests, n.Decoded, n.PromptTokens, n.OutputTokens)
		}
	}
}

func seconds(s float64) string {
	switch {
	case s >= 3600:
		return fmt.Sprintf("%.1fh", s/3600)
	case s >= 60:
		return fmt.Sprintf("%.1fm", s/60)
	case s >= 1:
		return fmt.Sprintf("%.2fs", s)
	}
	return fmt.Sprintf("%.0fms", s*1000)
}

func sortedKeys(m map[string]int) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Perfetto writes recs as a timeline in the Chrome trace event format,
// which ui.perfetto.dev (and chrome://tracing) open: a process per node
// with a request's phases as slices on it (queued and prefilling on its
// prefill node, decoding on its decode node), and a process of the
// sessions, a track each, whose turns are slices joined by flow arrows
// from an answer to the session's next request. Rows without live fields
// (a Mooncake trace) show as their sessions' turns only.
func Perfetto(w io.Writer, recs []workload.TraceRecord) error {
	type event struct {
		Name string         `json:"name"`
		Cat  string         `json:"cat,omitempty"`
		Ph   string         `json:"ph"`
		TS   float64        `json:"ts"` // microseconds
		Dur  float64        `json:"dur,omitempty"`
		PID  int            `json:"pid"`
		TID  int            `json:"tid"`
		ID   string         `json:"id,omitempty"`
		BP   string         `json:"bp,omitempty"`
		Args map[string]any `json:"args,omitempty"`
	}
	var evs []event
	pids := map[string]int{}
	pid := func(node string) int {
		if p, ok := pids[node]; ok {
			return p
		}
		p := len(pids) + 2 // 1 is the sessions'
		pids[node] = p
		name := "node " + node
		if strings.HasPrefix(node, "(") {
			name = node
		}
		evs = append(evs, event{Name: "process_name", Ph: "M", PID: p, Args: map[string]any{"name": name}})
		return p
	}
	evs = append(evs, event{Name: "process_name", Ph: "M", PID: 1, Args: map[string]any{"name": "sessions"}})
	tids := map[string]int{}
	lastEnd := map[string]float64{}
	lastID := map[string]int{}
	for i, r := range recs {
		start := r.Timestamp * 1000 // us
		dur := 1.0
		args := map[string]any{"prompt_tokens": r.InputLength, "output_tokens": r.OutputLength}
		name := fmt.Sprintf("request %d", i)
		if l := r.Live; l != nil {
			name = l.RequestID
			dur = max(l.E2ESec*1e6, 1)
			args["outcome"], args["cached_gpu"], args["cached_host"], args["cached_peer"], args["computed"] = l.Outcome, l.CachedGPU, l.CachedHost, l.CachedPeer, l.Computed
			if l.Finish != "" {
				args["finish_reason"] = l.Finish
			}
			queued, first := l.QueueSec*1e6, l.TTFTSec*1e6
			if first <= 0 {
				first = dur
			}
			id := fmt.Sprint(i)
			if l.PrefillNode != "" {
				p := pid(l.PrefillNode)
				if queued > 0 {
					evs = append(evs, event{Name: "queued", Cat: "request", Ph: "b", TS: start, PID: p, TID: p, ID: id, Args: map[string]any{"request": name}},
						event{Name: "queued", Cat: "request", Ph: "e", TS: start + queued, PID: p, TID: p, ID: id})
				}
				evs = append(evs, event{Name: "prefill", Cat: "request", Ph: "b", TS: start + queued, PID: p, TID: p, ID: id, Args: map[string]any{"request": name, "computed": l.Computed}},
					event{Name: "prefill", Cat: "request", Ph: "e", TS: start + first, PID: p, TID: p, ID: id})
			}
			if l.DecodeNode != "" && dur > first {
				p := pid(l.DecodeNode)
				evs = append(evs, event{Name: "decode", Cat: "request", Ph: "b", TS: start + first, PID: p, TID: p, ID: id, Args: map[string]any{"request": name, "output_tokens": r.OutputLength}},
					event{Name: "decode", Cat: "request", Ph: "e", TS: start + dur, PID: p, TID: p, ID: id})
			}
		}
		if r.Live == nil {
			// A trace's request: its arrival, on a track of its own.
			p := pid("(arrivals, no node recorded)")
			evs = append(evs, event{Name: "arrival", Cat: "request", Ph: "i", TS: start, PID: p, TID: p, Args: args})
		}
		if r.Session == "" {
			continue
		}
		tid, ok := tids[r.Session]
		if !ok {
			tid = len(tids) + 1
			tids[r.Session] = tid
			evs = append(evs, event{Name: "thread_name", Ph: "M", PID: 1, TID: tid, Args: map[string]any{"name": "session " + r.Session}})
		}
		sargs := map[string]any{"branch": r.Branch, "request": name}
		evs = append(evs, event{Name: "turn", Cat: "session", Ph: "X", TS: start, Dur: dur, PID: 1, TID: tid, Args: sargs})
		if prev, ok := lastEnd[r.Session]; ok && prev <= start {
			flow := fmt.Sprintf("%s/%d", r.Session, lastID[r.Session])
			evs = append(evs, event{Name: "tool time", Cat: "session", Ph: "s", TS: prev - 1, PID: 1, TID: tid, ID: flow},
				event{Name: "tool time", Cat: "session", Ph: "f", BP: "e", TS: start, PID: 1, TID: tid, ID: flow})
		}
		lastEnd[r.Session], lastID[r.Session] = start+dur, i
	}
	enc := json.NewEncoder(w)
	return enc.Encode(map[string]any{"traceEvents": evs, "displayTimeUnit": "ms"})
}
