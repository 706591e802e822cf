package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// A live local cluster, given a workload that shifts from prompt-heavy to
// output-heavy by evolve bench, moves a node from prefill to decode by
// itself (the online planner learns the engines' costs from their pass
// statistics, with no profile), with no failed request; evolve planner
// reports what it learned and why it moved.
func TestPlannerMovesANodeLiveWithoutFailures(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a cluster for 30 s")
	}
	c := upCluster(t, "--engines", "3", "--prefill", "2", "--profile", "tiny", "--speedup", "20")
	out, code := runBinOut(t, c.env, "bench", "--workload", "shift:computer-use>math:2m:1m:20m", "--agents", "24",
		"--duration", "30s", "--speedup", "20", "-o", "json")
	if code != 0 {
		t.Fatalf("bench: exit %d: %s", code, out)
	}
	var res struct {
		Requests int `json:"requests_completed"`
		Errors   int `json:"errors"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("bench -o json: %v\n%s", err, out)
	}
	if res.Requests < 20 || res.Errors != 0 {
		t.Fatalf("bench: %d requests, %d errors; want no failed request\n%s", res.Requests, res.Errors, out)
	}

	out, code = runBinOut(t, c.env, "planner", "-o", "json")
	if code != 0 {
		t.Fatalf("planner: exit %d: %s", code, out)
	}
	var st struct {
		State      string  `json:"state"`
		Speedup    float64 `json:"speedup"`
		DecodeCost struct {
			Ready bool `json:"ready"`
			Coefs []struct {
				Name  string  `json:"name"`
				Value float64 `json:"value"`
			} `json:"coefficients"`
		} `json:"decode_cost"`
		Decisions []struct {
			Action string `json:"action"`
			Reason string `json:"reason"`
			Moves  []struct {
				Node, From, To string
			} `json:"moves"`
		} `json:"decisions"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("planner -o json: %v\n%s", err, out)
	}
	// Engines at 20x: what the planner learned and predicts is wall time,
	// and its status says by how much modelled time runs faster.
	if st.Speedup != 20 {
		t.Fatalf("planner status speedup %v, want 20", st.Speedup)
	}
	if !st.DecodeCost.Ready || len(st.DecodeCost.Coefs) != 4 || st.DecodeCost.Coefs[0].Value <= 0 {
		t.Fatalf("decode cost not learned: %+v", st.DecodeCost)
	}
	toDecode := ""
	for _, d := range st.Decisions {
		for _, m := range d.Moves {
			if m.From == "prefill" && m.To == "decode" {
				toDecode = m.Node
			}
		}
	}
	if toDecode == "" {
		t.Fatalf("the planner moved no node to decode after the shift to math: %s", out)
	}
	// The node switched by the role protocol, is in auto mode still, and
	// its history says the planner did it.
	n := c.node(toDecode)
	hist, _ := n["history"].([]any)
	last := ""
	if len(hist) > 0 {
		last, _ = obj(hist[len(hist)-1])["reason"].(string)
	}
	if n["mode"] != "auto" || !strings.HasPrefix(last, "planner:") {
		t.Fatalf("node %s after the planner's move: %v", toDecode, n)
	}
	// The table form names the learned costs and the decision.
	out, _ = runBinOut(t, c.env, "planner")
	for _, want := range []string{"decode cost", "per_seq_us", "trusted", "decision", toDecode + "->decode", "engines run 20x"} {
		if !strings.Contains(out, want) {
			t.Fatalf("evolve planner lacks %q:\n%s", want, out)
		}
	}
}

// With the planner off, the command says so and exits non-zero.
func TestPlannerOff(t *testing.T) {
	c := upCluster(t, "--engines", "2", "--profile", "tiny", "--planner", "off")
	out, code := runBinOut(t, c.env, "planner")
	if code == 0 || !strings.Contains(out, "planner is off") {
		t.Fatalf("planner with --planner off: exit %d: %s", code, out)
	}
	for _, bad := range [][]string{{"up", "--planner", "sometimes"}, {"up", "--planner-interval", "-1s"}, {"up", "--planner-persistence", "-5s"},
		{"up", "--timeout", "-1s"}, {"up", "--duration", "-1s", "--agents", "2"}, {"orchestrator", "--planner-interval", "-1s"},
		{"up", "--planner-min-improvement", "1"}, {"orchestrator", "--planner-min-improvement", "-0.5"}} {
		flag := bad[1]
		if out, code := runBinOut(t, c.env, bad...); code != 2 || !strings.Contains(out, flag) {
			t.Errorf("%v: exit %d: %s", bad, code, out)
		}
	}
}
