package traceview

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"strings"
	"testing"

	"github.com/evolvellm/evolve/workload"
)

func row(router, session string, unixMS, e2e, ttft float64, gap *float64, prefill, decode string) workload.TraceRecord {
	return workload.TraceRecord{InputLength: 600, OutputLength: 20, HashIDs: []int64{7, 8}, Session: session,
		Live: &workload.Live{Version: 1, UnixMS: unixMS, Router: router, RequestID: router + session, Outcome: "ok",
			E2ESec: e2e, TTFTSec: ttft, CachedGPU: 512, Computed: 88, PrefillNode: prefill, DecodeNode: decode, GapSec: gap}}
}

// Two routers' rows merge on one clock; the summary counts sessions,
// turns, tool time, reuse and each node's load; the timeline has a
// process per node and the sessions' turns joined by a flow.
func TestSummaryAndTimelineOfTwoRouters(t *testing.T) {
	g := 2.5
	a := []workload.TraceRecord{row("r1", "s1", 10_000, 1, 0.2, nil, "e0", "e1"), row("r1", "s1", 13_500, 1, 0.1, &g, "e0", "e1")}
	b := []workload.TraceRecord{row("r2", "s2", 11_000, 2, 0.3, nil, "e1", "e1")}
	recs := Merge(a, b)
	if recs[0].Timestamp != 0 || recs[1].Timestamp != 1000 || recs[2].Timestamp != 3500 || recs[1].Router != "r2" {
		t.Fatalf("merged: %v %v %v", recs[0].Timestamp, recs[1].Timestamp, recs[2].Timestamp)
	}
	s := Summarize(recs, FormatEvolve)
	if s.Requests != 3 || s.Sessions != 2 || s.ToolTime.N != 1 || s.ToolTime.Mean != 2.5 || len(s.Routers) != 2 ||
		s.Reuse["gpu"] < 0.85 || s.Reuse["computed"] < 0.14 || len(s.Nodes) != 2 || s.Nodes[0].Prefilled != 2 || s.Nodes[0].SplitRequests != 2 ||
		s.Nodes[1].Decoded != 3 || s.SpanSec != 4.5 {
		t.Fatalf("summary %+v", s)
	}
	var text bytes.Buffer
	s.WriteText(&text)
	for _, want := range []string{"3 requests over 4.50s", "from 2 router(s)", "tool time      mean 2.50s", "85% GPU hit"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("summary text has no %q:\n%s", want, text.String())
		}
	}
	var out bytes.Buffer
	if err := Perfetto(&out, recs); err != nil {
		t.Fatal(err)
	}
	var tr struct {
		TraceEvents []struct {
			Name, Ph string
			PID      int
			Args     map[string]any
		}
	}
	if err := json.Unmarshal(out.Bytes(), &tr); err != nil {
		t.Fatal(err)
	}
	names, phases := map[string]bool{}, map[string]int{}
	for _, e := range tr.TraceEvents {
		if e.Name == "process_name" {
			names[e.Args["name"].(string)] = true
		}
		phases[e.Name+"/"+e.Ph]++
	}
	if !names["node e0"] || !names["node e1"] || !names["sessions"] || phases["prefill/b"] != 3 || phases["decode/b"] != 3 ||
		phases["turn/X"] != 3 || phases["tool time/s"] != 1 || phases["tool time/f"] != 1 {
		t.Fatalf("timeline: processes %v, events %v", names, phases)
	}
}

// A gzipped recording cut short (still being written, or its router
// killed) gives the rows it holds whole, and says it was cut.
func TestReadACutRecording(t *testing.T) {
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	for i := 0; i < 50; i++ {
		r := row("r1", "s", float64(1000+i), 1, 0.1, nil, "e0", "e0")
		line, _ := json.Marshal(r)
		zw.Write(append(line, '\n'))
	}
	zw.Flush() // as the recorder does each second; no trailer yet
	cutAt := b.Len() - 7
	recs, format, cut, err := Read("live.jsonl.gz", bytes.NewReader(b.Bytes()[:cutAt]))
	if err != nil || !cut || format != FormatEvolve || len(recs) < 40 || len(recs) > 50 {
		t.Fatalf("a cut recording: %d rows, %q, cut %v, %v", len(recs), format, cut, err)
	}
	zw.Close()
	if recs, _, cut, err := Read("whole.jsonl.gz", bytes.NewReader(b.Bytes())); err != nil || cut || len(recs) != 50 {
		t.Fatalf("the whole recording: %d rows, cut %v, %v", len(recs), cut, err)
	}
}
