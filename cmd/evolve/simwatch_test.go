package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/evolvellm/evolve/internal/wait"
)

// evolve sim --live serves each policy's simulated cluster through the
// control API while it runs; evolve top reads it; the final state stays
// served after the table until the operator interrupts.
func TestSimLiveServesTopUntilInterrupted(t *testing.T) {
	cmd := exec.Command(evolveBin, "sim", "--gpus", "12", "--workload", "coding", "--agents", "6", "--warmup", "0",
		"--duration", "3m", "--policies", "static:1:2,evolve", "--live", "127.0.0.1:0", "--pace", "60", "-o", "json")
	stdoutPipe, _ := cmd.StdoutPipe()
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var outMu sync.Mutex
	var stdout bytes.Buffer
	go func() {
		buf := make([]byte, 1<<16)
		for {
			n, err := stdoutPipe.Read(buf)
			outMu.Lock()
			stdout.Write(buf[:n])
			outMu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	defer cmd.Process.Kill()
	var mu sync.Mutex
	var errLines []string
	base := make(chan string, 1)
	done := make(chan struct{}, 1)
	go func() {
		re := regexp.MustCompile(`live at (http://[0-9.:]+)/`)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			mu.Lock()
			errLines = append(errLines, sc.Text())
			mu.Unlock()
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				base <- m[1]
			}
			if strings.Contains(sc.Text(), "simulations done") {
				done <- struct{}{}
			}
		}
	}()
	defer func() {
		if t.Failed() {
			mu.Lock()
			t.Logf("stderr:\n%s", strings.Join(errLines, "\n"))
			mu.Unlock()
		}
	}()
	var url string
	select {
	case url = <-base:
	case <-time.After(20 * time.Second):
		t.Fatal("no live address announced")
	}

	// Mid-run: evolve top reads the simulated cluster.
	var snap struct {
		Cluster struct {
			Policy     string
			Simulation struct {
				ElapsedSec float64 `json:"elapsed_s"`
				Done       bool
			}
		}
		Nodes []struct{ ID, Role, State string }
	}
	wait.Until(t, 20*time.Second, "evolve top --once sees the simulation move", func() bool {
		out, err := exec.Command(evolveBin, "top", "--once", "-o", "json", "--server", url+"/evolve").Output()
		return err == nil && json.Unmarshal(out, &snap) == nil && snap.Cluster.Simulation.ElapsedSec > 0 && len(snap.Nodes) == 3
	})
	if snap.Cluster.Policy != "evolve" || snap.Nodes[0].Role != "prefill" {
		t.Fatalf("snapshot %+v", snap)
	}
	resp, err := http.Post(url+"/evolve/api/v1/nodes/e0/role", "application/json", strings.NewReader(`{"role":"decode"}`))
	if err != nil || resp.StatusCode != 403 {
		t.Fatalf("switching a simulated node: %v %v", resp.Status, err)
	}
	resp.Body.Close()

	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("the simulations did not finish")
	}
	var res struct {
		Results []struct {
			Policy   string
			Requests int `json:"requests_completed"`
		}
	}
	wait.Until(t, 5*time.Second, "the table on stdout", func() bool {
		outMu.Lock()
		defer outMu.Unlock()
		return json.Unmarshal(stdout.Bytes(), &res) == nil
	})
	if len(res.Results) != 2 || res.Results[1].Policy != "evolve" || res.Results[1].Requests == 0 {
		t.Fatalf("results %+v", res)
	}
	// Still served, marked done, until interrupted.
	out, err := exec.Command(evolveBin, "top", "--once", "-o", "json", "--server", url+"/static:1:2").Output()
	if err != nil || json.Unmarshal(out, &snap) != nil || !snap.Cluster.Simulation.Done || snap.Cluster.Simulation.ElapsedSec < 170 {
		t.Fatalf("after the run: %v %s", err, out)
	}
	cmd.Process.Signal(syscall.SIGINT)
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("exit after Ctrl-C: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("still running 10 s after SIGINT")
	}
}

func TestSimLiveRefusesSweeps(t *testing.T) {
	out, err := exec.Command(evolveBin, "sim", "--gpus", "12", "--agents", "2", "--duration", "1m", "--warmup", "0",
		"--policies", "static:best", "--live", "127.0.0.1:0").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "name its split") {
		t.Fatalf("--live with static:best: %v\n%s", err, out)
	}
}
