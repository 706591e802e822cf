package main

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A router that dies mid-run: evolve bench stops once it has refused
// connections for --unreachable-timeout rather than counting errors until
// --duration ends, prints what it measured (and when the router went), and
// exits 1 saying why.
func TestBenchStopsWhenTheRouterDies(t *testing.T) {
	c := upCluster(t, "--engines", "2", "--profile", "gb300-kimi-k2", "--speedup", "50")
	cmd := exec.Command(evolveBin, "bench", "--url", c.state.RouterURL, "--workload", "computer-use", "--agents", "2",
		"--duration", "10m", "--speedup", "50", "--unreachable-timeout", "2s", "-o", "json")
	cmd.Env = append(os.Environ(), c.env...)
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	waitFor(t, stderr, "t=5s/") // the first progress line: the agents are at work
	var errOut strings.Builder
	copied := make(chan struct{})
	go func() { io.Copy(&errOut, stderr); close(copied) }()
	if err := syscall.Kill(c.state.Orchestrator, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case <-exited:
	case <-time.After(time.Minute):
		t.Fatal("bench went on for a minute after its router died")
	}
	<-copied
	var res struct {
		Requests  int     `json:"requests_completed"`
		Errors    int     `json:"errors"`
		Retried   int     `json:"requests_retried"`
		Duration  float64 `json:"duration_s"`
		Gone      bool    `json:"stopped_router_unreachable"`
		GoneAt    float64 `json:"router_unreachable_since_s"`
		LastError string  `json:"last_error"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
		t.Fatalf("bench -o json: %v\n%s\nstderr:\n%s", err, stdout.String(), errOut.String())
	}
	code := cmd.ProcessState.ExitCode()
	// The calls the dead router cut or refused failed, or were sent again
	// until the run gave up (a call with no answer at all is retried).
	if code != 1 || !res.Gone || res.Requests < 1 || res.Errors+res.Retried < 1 || res.GoneAt < 4 || res.GoneAt > res.Duration-2 ||
		!strings.Contains(errOut.String(), "error: the router at "+c.state.RouterURL+" refused connections from ") ||
		!strings.Contains(errOut.String(), "--unreachable-timeout 0 keeps trying") {
		t.Fatalf("bench after its router died (%.1fs before it exited): exit %d, %+v\nstderr:\n%s", time.Since(killed).Seconds(), code, res, errOut.String())
	}
}
