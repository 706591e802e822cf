package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// evolve up --record DIR records what a local cluster's router serves;
// once the cluster is down, evolve trace reads the recording (a summary
// and a timeline) and evolve sim replays it.
func TestUpRecordsWhatItServes(t *testing.T) {
	rec := filepath.Join(t.TempDir(), "rec")
	c := upCluster(t, "--engines", "3", "--prefill", "1", "--profile", "gb300-kimi-k2", "--speedup", "50", "--record", rec)
	if c.up["record_dir"] != rec {
		t.Fatalf("evolve up -o json: record_dir %v, want %s", c.up["record_dir"], rec)
	}
	out, code := runBinOut(t, c.env, "bench", "--workload", "coding", "--agents", "3", "--duration", "4s", "--speedup", "50", "-o", "json")
	var bench struct {
		Requests int `json:"requests_completed"`
		Errors   int `json:"errors"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &bench) != nil || bench.Requests < 3 || bench.Errors != 0 {
		t.Fatalf("bench: exit %d, %+v\n%s", code, bench, out)
	}
	// Down flushes the router's last rows.
	if out, code := runBinOut(t, c.env, "down"); code != 0 {
		t.Fatalf("evolve down: exit %d\n%s", code, out)
	}

	out, code = runBinOut(t, nil, "trace", "summary", rec, "-o", "json")
	var sum struct {
		Format   string         `json:"format"`
		Requests int            `json:"requests"`
		Outcomes map[string]int `json:"outcomes"`
		Sessions int            `json:"sessions"`
		Tool     struct {
			N int `json:"n"`
		} `json:"tool_time"`
		Nodes []struct {
			Node string `json:"node"`
		} `json:"nodes"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &sum) != nil {
		t.Fatalf("evolve trace summary: exit %d\n%s", code, out)
	}
	// Every answer the agents read is a row (a request cut by bench's end
	// may add one), each agent a session with its tool times between turns.
	if !strings.Contains(sum.Format, "evolve") || sum.Outcomes["ok"] < bench.Requests || sum.Sessions != 3 ||
		sum.Tool.N < bench.Requests-3 || len(sum.Nodes) < 2 {
		t.Fatalf("summary of a run of %d requests: %+v\n%s", bench.Requests, sum, out)
	}

	run := filepath.Join(t.TempDir(), "run.json")
	if out, code := runBinOut(t, nil, "trace", "perfetto", rec, "-o", run); code != 0 {
		t.Fatalf("evolve trace perfetto: exit %d\n%s", code, out)
	}
	b, err := os.ReadFile(run)
	if err != nil {
		t.Fatal(err)
	}
	var tl struct {
		Events []struct {
			Ph string `json:"ph"`
		} `json:"traceEvents"`
	}
	if err := json.Unmarshal(b, &tl); err != nil || len(tl.Events) < 2*bench.Requests {
		t.Fatalf("perfetto timeline: %v, %d events for %d requests", err, len(tl.Events), bench.Requests)
	}

	out, code = runBinOut(t, nil, "sim", "--trace", rec, "--gpus", "8", "--policies", "static:1:1", "-o", "json")
	var res struct {
		Scenario struct {
			Requests int `json:"trace_requests"`
		} `json:"scenario"`
		Results []struct {
			Requests int `json:"requests_completed"`
		} `json:"results"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &res) != nil || res.Scenario.Requests < bench.Requests || len(res.Results) != 1 || res.Results[0].Requests == 0 {
		t.Fatalf("evolve sim --trace of the recording: exit %d, %+v\n%s", code, res, out)
	}

	// A file where the directory should be is refused before anything starts.
	file := filepath.Join(t.TempDir(), "afile")
	os.WriteFile(file, []byte("x"), 0o600)
	if out, code := runBinOut(t, []string{"XDG_STATE_HOME=" + t.TempDir()}, "up", "--detach", "--router-addr", "127.0.0.1:0", "--control-addr", "127.0.0.1:0", "--record", file); code != 2 ||
		!strings.Contains(out, "a file, not a directory") {
		t.Fatalf("evolve up --record FILE: exit %d\n%s", code, out)
	}
}
