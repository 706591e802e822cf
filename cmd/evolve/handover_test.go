package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/evolvellm/evolve/cluster"
	"github.com/evolvellm/evolve/internal/wait"
)

// reasoningLoad brings up three tiny engines (one prefill) at 10x with the
// planner off, runs eight math agents against them for d, and waits until
// node id's heartbeat shows it decoding (the
// router's in-flight count also holds requests still waiting for their
// first token). finish waits for the agents and returns what they
// measured; metrics is the router's metrics then.
func reasoningLoad(t *testing.T, d, id string) (c *localCluster, finish func() (res loadResult, metrics string)) {
	t.Helper()
	c = upCluster(t, "--engines", "3", "--prefill", "1", "--profile", "tiny", "--speedup", "10", "--planner", "off")
	bench, out := startBin(t, c.env, "bench", "--workload", "math", "--agents", "8", "--duration", d, "--speedup", "10", "-o", "json")
	wait.Until(t, 12*time.Second, id+" decoding", func() bool {
		n, _ := c.node(id)["running"].(float64)
		return n >= 1
	})
	return c, func() (loadResult, string) {
		t.Helper()
		if err := bench.Wait(); err != nil {
			t.Fatalf("bench: %v\n%s", err, out.String())
		}
		var res loadResult
		if err := json.Unmarshal([]byte(out.String()[strings.Index(out.String(), "{"):]), &res); err != nil {
			t.Fatalf("bench -o json: %v\n%s", err, out.String())
		}
		resp, err := http.Get(c.state.RouterURL + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return res, string(b)
	}
}

// loadResult is what evolve bench -o json says that these tests read.
type loadResult struct {
	Requests   int    `json:"requests_completed"`
	Errors     int    `json:"errors"`
	FirstError string `json:"first_error"`
	Moved      int    `json:"requests_handed_over"`
}

// An operator switches a decode node to prefill while reasoning agents
// stream long answers from it: the node hands its decodes over to the
// other decode node and serves as prefill at once, and no agent sees a
// failure; evolve bench counts the answers that moved, and the router's
// metrics the handovers.
func TestRoleSwitchHandsDecodesOverUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a cluster for 16 s")
	}
	c, finish := reasoningLoad(t, "16s", "engine-1")
	sw, code := runBin(t, c.env, "role", "set", "engine-1", "prefill")
	if code != 0 {
		t.Fatalf("role set: exit %d %s", code, sw)
	}
	// It says what moved; the node's history keeps it.
	said := regexp.MustCompile(`engine-1: now prefill \(auto\); (\d+) answers? handed over to peer decode nodes on the way`).FindStringSubmatch(sw)
	if said == nil {
		t.Fatalf("role set said:\n%s", sw)
	}
	n := c.node("engine-1")
	hist, _ := n["history"].([]any)
	if n["role"] != "prefill" || n["state"] != "serving" || len(hist) == 0 || fmt.Sprint(obj(hist[len(hist)-1])["handed_over"]) != said[1] {
		t.Fatalf("after role set (%s handed over): %v", said[1], n)
	}
	res, b := finish()
	if res.Errors != 0 || res.Moved >= res.Requests {
		t.Fatalf("bench: %d requests, %d handed over, %d errors (%s)", res.Requests, res.Moved, res.Errors, res.FirstError)
	}
	m := regexp.MustCompile(`(?m)^evolve_router_handovers_total\{outcome="continued"\} (\d+)$`).FindStringSubmatch(b)
	if m == nil {
		t.Fatalf("no handovers in the router's metrics:\n%s", b)
	}
	// The agents count only the moved answers that finished before the
	// run's end; the router counts every one, as role set did.
	if n, _ := strconv.Atoi(m[1]); n < 1 || n < res.Moved || strconv.Itoa(n) != said[1] {
		t.Fatalf("the router counted %d handovers; bench saw %d answers move, role set said %s", n, res.Moved, said[1])
	}
	if regexp.MustCompile(`outcome="failed"\} [1-9]`).MatchString(b) {
		t.Fatalf("a handover failed:\n%s", b)
	}
}

// An engine is killed (SIGKILL) while reasoning agents stream long answers
// from it: requests it had not begun answering are routed again, answers
// it was streaming go on on the other decode node from what the agents
// had read, and no agent sees a failure.
func TestEngineKilledUnderLoadFailsNoAgent(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a cluster for 14 s")
	}
	c, finish := reasoningLoad(t, "14s", "engine-2")
	time.Sleep(200 * time.Millisecond) // 2 s of their output, at 10x
	syscall.Kill(c.state.Engines[2], syscall.SIGKILL)
	res, b := finish()
	resumed := metric(t, c.state.RouterURL, `evolve_router_resumed_answers_total{cause="engine_failed",outcome="continued"}`)
	// The agents count only the moved answers that finished before the
	// run's end: long reasoning answers resumed may not have.
	if res.Errors != 0 || resumed < 1 || res.Moved > int(resumed) {
		t.Fatalf("bench: %d requests, %d errors (%s), %d moved; the router resumed %v answers", res.Requests, res.Errors, res.FirstError, res.Moved, resumed)
	}
	if regexp.MustCompile(`outcome="failed"\} [1-9]`).MatchString(b) {
		t.Fatalf("the router failed requests:\n%s", b)
	}
	// The node's record says what became of the answers it was streaming
	// (counted when it failed; those the bench's end cut short before
	// they went on are not among the router's resumed).
	n := c.node("engine-2")
	if cut, _ := n["answers_interrupted"].(float64); n["state"] != "down" || cut < resumed || n["answers_lost"] != nil {
		t.Fatalf("engine-2 after the kill: %v", n)
	}
}

// A decode engine stopped with SIGTERM (maintenance, a restart) while
// reasoning agents stream long answers from it hands them over to the
// other decode node instead of finishing them: it stops well within its
// grace, and no agent sees a failure.
func TestEngineStoppedUnderLoadHandsItsAnswersOver(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a cluster for 14 s")
	}
	c, finish := reasoningLoad(t, "14s", "engine-2")
	pid := c.state.Engines[2]
	syscall.Kill(pid, syscall.SIGTERM)
	wait.Until(t, 30*time.Second, "engine-2 stops", func() bool { return !cluster.Alive(pid) })
	res, b := finish()
	// The agents count only the moved answers that finished before the
	// run's end; the router counts every one.
	if v := metric(t, c.state.RouterURL, `evolve_router_handovers_total{outcome="continued"}`); res.Errors != 0 || v < 1 || res.Moved > int(v) {
		t.Fatalf("bench: %d requests, %d errors (%s), %d moved; the router moved %v", res.Requests, res.Errors, res.FirstError, res.Moved, v)
	}
	if regexp.MustCompile(`outcome="failed"\} [1-9]`).MatchString(b) {
		t.Fatalf("the router failed requests:\n%s", b)
	}
	// Nothing was left for its grace to cut short.
	logs, _ := os.ReadFile(filepath.Join(c.state.LogDir, "engine-2.log"))
	if strings.Contains(string(logs), "shutdown grace over") || !strings.Contains(string(logs), "engine stopping") {
		t.Fatalf("engine-2's log:\n%s", logs)
	}
}
