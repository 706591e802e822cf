package main

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/evolvellm/evolve/cluster"
	"github.com/evolvellm/evolve/internal/wait"
)

// streamAnswer starts a streamed completion of maxTokens through the
// router and returns its reader once the first token has come.
func streamAnswer(t *testing.T, router string, maxTokens int) (*bufio.Scanner, func()) {
	t.Helper()
	body := fmt.Sprintf(`{"prompt": "Explain the scheduler, step by step.", "max_tokens": %d, "ignore_eos": true, "stream": true}`, maxTokens)
	resp, err := http.Post(router+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("stream: %v %v", resp, err)
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() && !strings.HasPrefix(sc.Text(), "data: {") {
	}
	return sc, func() { resp.Body.Close() }
}

// An orchestrator told to stop takes no new connection but lets the
// answers it is writing finish, up to --shutdown-grace, then exits; a
// second signal stops it at once. Its engines, stopped when the test ends,
// must stop at once too, with their event plane gone (the helper fails a
// test whose engine takes more than a few seconds).
func TestOrchestratorLetsItsAnswersFinishBeforeItStops(t *testing.T) {
	orch, log := startOrchestratorLog(t, "--shutdown-grace", "1m")
	startEngine(t, "--profile", "tiny", "--speedup", "1", "--nats", orch.NATSURL)
	wait.Until(t, 10*time.Second, "the engine serving", func() bool { return servingNodes(t, orch.ControlURL) == 1 })

	sc, done := streamAnswer(t, orch.RouterURL, 600) // about 2 s of decoding
	defer done()
	if err := syscall.Kill(orch.PID, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	routerAddr := strings.TrimPrefix(orch.RouterURL, "http://")
	wait.Until(t, 5*time.Second, "the router refusing new connections", func() bool {
		c, err := net.DialTimeout("tcp", routerAddr, time.Second)
		if err == nil {
			c.Close()
		}
		return err != nil
	})
	chunks, finished := 0, false
	for sc.Scan() {
		line := sc.Text()
		if line == "data: [DONE]" {
			finished = true
			break
		}
		if strings.HasPrefix(line, "data: {") {
			chunks++
		}
	}
	if !finished || chunks < 590 {
		t.Fatalf("the answer in flight ended after %d more chunks (finished %v): want the whole answer", chunks, finished)
	}
	wait.Until(t, 10*time.Second, "the orchestrator gone once its answer ended", func() bool { return !cluster.Alive(orch.PID) })
	if !strings.Contains(log.String(), "waiting for the answers in flight") || !strings.Contains(log.String(), "in_flight=1") {
		t.Fatalf("the log does not say what the shutdown waits for:\n%s", log.String())
	}

	// A second signal does not wait. (Its engine, stopped when the test
	// ends, may have handed the stream over to the dying router and hold
	// that KV for a peer that never comes: a short grace bounds its stop.)
	orch2, log2 := startOrchestratorLog(t, "--shutdown-grace", "1m")
	startEngine(t, "--profile", "tiny", "--speedup", "0.1", "--shutdown-grace", "2s", "--nats", orch2.NATSURL)
	wait.Until(t, 10*time.Second, "the engine serving", func() bool { return servingNodes(t, orch2.ControlURL) == 1 })
	_, done2 := streamAnswer(t, orch2.RouterURL, 2000) // minutes at a tenth of real time
	defer done2()
	syscall.Kill(orch2.PID, syscall.SIGTERM)
	wait.Until(t, 5*time.Second, "the first signal taken", func() bool { return strings.Contains(log2.String(), "waiting for the answers in flight") })
	syscall.Kill(orch2.PID, syscall.SIGTERM)
	wait.Until(t, 5*time.Second, "the orchestrator gone at the second signal", func() bool { return !cluster.Alive(orch2.PID) })
}
