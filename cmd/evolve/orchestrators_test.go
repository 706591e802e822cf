package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/evolvellm/evolve/cluster"
	"github.com/evolvellm/evolve/controlapi"
	"github.com/evolvellm/evolve/internal/wait"
	"github.com/evolvellm/evolve/orchestrator"
)

// orchProc is an `evolve orchestrator` process a test started.
type orchProc struct {
	cmd   *exec.Cmd
	done  chan struct{}
	log   *lockedLog
	ready string // its ready file
	info  readyInfo
}

// launchOrchestrator starts `evolve orchestrator` on free ports with the
// planner off, extra flags after (and overriding) the usual ones; call
// waitReady before using it. It is stopped when the test ends.
func launchOrchestrator(t *testing.T, extra ...string) *orchProc {
	t.Helper()
	dir := t.TempDir()
	p := &orchProc{ready: filepath.Join(dir, "ready.json"), log: &lockedLog{}, done: make(chan struct{})}
	p.cmd = exec.Command(evolveBin, append([]string{"orchestrator", "--router-addr", "127.0.0.1:0", "--control-addr", "127.0.0.1:0",
		"--nats-listen", "127.0.0.1:0", "--data-dir", filepath.Join(dir, "data"), "--planner", "off", "--ready-file", p.ready}, extra...)...)
	p.cmd.Env = append(os.Environ(), "XDG_CONFIG_HOME="+dir)
	p.cmd.Stderr = p.log
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.cmd.Process.Signal(os.Interrupt)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("orchestrator %s log:\n%s", p.info.ControlURL, p.log.String())
		}
	})
	return p
}

func (p *orchProc) waitReady(t *testing.T, within time.Duration) readyInfo {
	t.Helper()
	wait.Until(t, within, "the orchestrator's ready file", func() bool {
		b, err := os.ReadFile(p.ready)
		return err == nil && json.Unmarshal(b, &p.info) == nil
	})
	return p.info
}

func (p *orchProc) status(t *testing.T) (orchestrator.ClusterStatus, error) {
	var st orchestrator.ClusterStatus
	out, err := exec.Command(evolveBin, "status", "--server", p.info.ControlURL, "-o", "json").Output()
	if err == nil {
		err = json.Unmarshal(out, &st)
	}
	return st, err
}

// Three orchestrators and four engines on loopback, under load through
// every router: the leader is killed with -9. Every request through the
// other routers succeeds (agents' calls cut by the dead router are not
// counted: they went through it), another orchestrator leads within 10 s
// and moves a node when asked, and the pin set before is kept.
func TestKilledLeaderOrchestrator(t *testing.T) {
	var cl [3]string
	for i := range cl {
		cl[i] = freePort(t)
	}
	var orchs [3]*orchProc
	for i := range orchs {
		var peers []string
		for j := range cl {
			if j != i {
				peers = append(peers, cl[j])
			}
		}
		orchs[i] = launchOrchestrator(t, "--name", fmt.Sprint("orch-", i), "--cluster-listen", cl[i], "--cluster-peers", strings.Join(peers, ","))
	}
	var natsURLs []string
	for _, o := range orchs {
		natsURLs = append(natsURLs, o.waitReady(t, 60*time.Second).NATSURL)
	}
	for i := range 4 {
		startEngine(t, "--nats", strings.Join(natsURLs, ","), "--id", fmt.Sprint("e", i), "--profile", "gb300-kimi-k2", "--speedup", "20",
			"--role", []string{"prefill", "decode", "decode", "decode"}[i])
	}
	lead := -1
	wait.Until(t, 30*time.Second, "every orchestrator sees four engines and names one leader", func() bool {
		leader := ""
		for _, o := range orchs {
			st, err := o.status(t)
			if err != nil || st.ByState[orchestrator.StateServing] != 4 || st.Leader == "" || (leader != "" && st.Leader != leader) {
				return false
			}
			leader = st.Leader
		}
		fmt.Sscanf(leader, "orch-%d", &lead)
		return true
	})
	leader, leaderName := orchs[lead], fmt.Sprint("orch-", lead)
	follower := orchs[(lead+1)%3]

	// A pin made through a follower, kept by the leader.
	if out, err := exec.Command(evolveBin, "role", "set", "e3", "prefill", "--pin", "--server", follower.info.ControlURL).CombinedOutput(); err != nil {
		t.Fatalf("evolve role through a follower: %v\n%s", err, out)
	}
	wait.Until(t, 15*time.Second, "e3 pinned prefill", func() bool {
		var n controlapi.Node
		getJSON(t, leader.info.ControlURL+"/api/v1/nodes/e3", &n)
		return n.Role == "prefill" && n.Mode == orchestrator.ModePinned && n.State == orchestrator.StateServing
	})

	// A leader paused (SIGSTOP: a stalled VM) loses its lease; resumed,
	// it follows the one that took it: one leader, never two.
	leader.cmd.Process.Signal(syscall.SIGSTOP)
	wait.Until(t, 10*time.Second, "a leader while the first is paused", func() bool {
		st, err := follower.status(t)
		return err == nil && st.Leader != "" && st.Leader != leaderName
	})
	leader.cmd.Process.Signal(syscall.SIGCONT)
	wait.Until(t, 10*time.Second, "the resumed leader following the new one", func() bool {
		var names []string
		for _, o := range orchs {
			st, err := o.status(t)
			if err != nil || st.Leader == "" || st.Leader == leaderName {
				return false
			}
			names = append(names, st.Leader)
		}
		return names[0] == names[1] && names[1] == names[2]
	})
	st, _ := follower.status(t)
	fmt.Sscanf(st.Leader, "orch-%d", &lead)
	leader, leaderName = orchs[lead], st.Leader
	follower = orchs[(lead+1)%3]

	// Load through every router, and through all three as a client
	// behind a load balancer sees them (the fourth).
	var all []string
	for _, o := range orchs {
		all = append(all, o.info.RouterURL)
	}
	benches := make([]*exec.Cmd, 4)
	outs, errs := make([]*bytes.Buffer, 4), make([]*lockedLog, 4)
	for i := range benches {
		url := strings.Join(all, ",")
		if i < 3 {
			url = orchs[i].info.RouterURL
		}
		outs[i], errs[i] = &bytes.Buffer{}, &lockedLog{}
		benches[i] = exec.Command(evolveBin, "bench", "--url", url, "--agents", "6", "--duration", "25s",
			"--speedup", "20", "--workload", "coding", "--seed", fmt.Sprint(i+1), "--unreachable-timeout", "0", "-o", "json")
		benches[i].Stdout, benches[i].Stderr = outs[i], errs[i]
		if err := benches[i].Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { benches[i].Process.Kill() })
	}
	wait.Until(t, 30*time.Second, "load under way through every router", func() bool {
		for _, o := range orchs {
			if routedRequests(t, o.info.RouterURL) < 10 {
				return false
			}
		}
		return true
	})
	leader.cmd.Process.Signal(syscall.SIGKILL)
	<-leader.done
	killed := time.Now()

	// Right after the kill nobody leads: a role change through a survivor
	// is answered 503 with Retry-After, and evolve role waits and asks
	// again until the next leader carries it out.
	raw := make(chan *http.Response, 1)
	go func() {
		resp, err := http.Post(follower.info.ControlURL+"/api/v1/nodes/e2/role", "application/json", strings.NewReader(`{"role": "decode"}`))
		if err == nil {
			resp.Body.Close()
		}
		raw <- resp
	}()
	type result struct {
		out []byte
		err error
	}
	roleSet := make(chan result, 1)
	go func() {
		out, err := exec.Command(evolveBin, "role", "set", "e1", "prefill", "--server", follower.info.ControlURL).CombinedOutput()
		roleSet <- result{out, err}
	}()

	// Another leads, and acts: it moves e1 as asked through a survivor.
	var next *orchProc
	wait.Until(t, 10*time.Second, "a new leader", func() bool {
		st, err := follower.status(t)
		i := -1
		if err != nil || st.Leader == "" || st.Leader == leaderName {
			return false
		}
		fmt.Sscanf(st.Leader, "orch-%d", &i)
		next = orchs[i]
		return true
	})
	t.Logf("a new leader %s after %s", time.Since(killed).Round(100*time.Millisecond), next.info.ControlURL)
	if resp := <-raw; resp == nil || resp.StatusCode != 503 || resp.Header.Get("Retry-After") != "2" {
		t.Fatalf("a role change while nobody leads: %v, want 503 with Retry-After: 2", resp)
	}
	if r := <-roleSet; r.err != nil || !strings.Contains(string(r.out), "no orchestrator leads the planner now") || !strings.Contains(string(r.out), "trying again in 2s") {
		t.Fatalf("evolve role right after the leader died: %v\n%s", r.err, r.out)
	}
	wait.Until(t, 15*time.Second, "e1 prefill, moved by the new leader", func() bool {
		var n controlapi.Node
		getJSON(t, next.info.ControlURL+"/api/v1/nodes/e1", &n)
		return n.Role == "prefill" && n.State == orchestrator.StateServing
	})
	var n controlapi.Node
	getJSON(t, next.info.ControlURL+"/api/v1/nodes/e3", &n)
	if n.Mode != orchestrator.ModePinned || n.Role != "prefill" {
		t.Fatalf("e3 after the leader died: %s %s", n.Role, n.Mode)
	}

	for i, b := range benches {
		err := b.Wait()
		if i == lead {
			continue // its router died under it
		}
		var res struct {
			Requests int `json:"requests_completed"`
			Errors   int `json:"errors"`
			Cut      int `json:"requests_cut_and_resent"`
		}
		if jerr := json.Unmarshal(outs[i].Bytes(), &res); jerr != nil || err != nil {
			t.Fatalf("bench through orch-%d: %v %v\n%s\n%s", i, err, jerr, outs[i].String(), errs[i].String())
		}
		if res.Errors != 0 || res.Requests == 0 {
			t.Fatalf("bench through orch-%d (which lived): %d completed, %d errors\n%s", i, res.Requests, res.Errors, outs[i].String())
		}
		t.Logf("through %s: %d calls completed, 0 errors, %d cut and sent again", map[bool]string{true: fmt.Sprint("orch-", i), false: "all three"}[i < 3], res.Requests, res.Cut)
	}
}

// evolve up --orchestrators 3 starts three orchestrators that share the
// event plane and name one leader; with the leader killed, the cluster
// serves on through another's router and another leads; evolve down
// stops every process and removes every data directory.
func TestUpThreeOrchestrators(t *testing.T) {
	c := upCluster(t, "--orchestrators", "3", "--engines", "2")
	if n := len(c.state.Orchestrators); n != 3 {
		t.Fatalf("the local state records %d orchestrators: %+v", n, c.state.Orchestrators)
	}
	status := func(control string) orchestrator.ClusterStatus {
		out, code := runBinOut(t, c.env, "status", "-o", "json", "--server", control)
		var st orchestrator.ClusterStatus
		if code != 0 || json.Unmarshal([]byte(out), &st) != nil {
			return orchestrator.ClusterStatus{}
		}
		return st
	}
	var leader cluster.LocalOrchestrator
	wait.Until(t, 20*time.Second, "three orchestrators and a leader", func() bool {
		st := status(c.state.ControlURL)
		for _, o := range c.state.Orchestrators {
			if o.Name == st.Leader {
				leader = o
			}
		}
		return len(st.Orchestrators) == 3 && leader.PID != 0
	})
	syscall.Kill(leader.PID, syscall.SIGKILL)
	var other cluster.LocalOrchestrator // not the leader, nor the first
	for _, o := range c.state.Orchestrators {
		if o.PID != leader.PID && (other.PID == 0 || other.Name == "orchestrator-0") {
			other = o
		}
	}
	wait.Until(t, 10*time.Second, "another leader", func() bool {
		st := status(other.ControlURL)
		return st.Leader != "" && st.Leader != leader.Name
	})
	if code, _, body := post(t, other.RouterURL+"/v1/completions", map[string]any{"prompt": "still there?", "max_tokens": 3}); code != 200 {
		t.Fatalf("a request through %s after the leader died: %d %v", other.Name, code, body)
	}
	// The commands find a live orchestrator by themselves, whichever
	// died: the first one too.
	if first := c.state.Orchestrators[0]; cluster.Alive(first.PID) {
		syscall.Kill(first.PID, syscall.SIGKILL)
		wait.Until(t, 5*time.Second, "the first orchestrator gone", func() bool { return !cluster.Ours(first.PID) })
	}
	if out, code := runBinOut(t, c.env, "nodes", "-o", "json"); code != 0 || !strings.Contains(out, "engine-1") {
		t.Fatalf("evolve nodes after %s died: %d %s", leader.Name, code, out)
	}
	// A second evolve up refuses while any of them runs.
	if out, code := runBin(t, c.env, "up", "--detach", "--router-addr", "127.0.0.1:0", "--control-addr", "127.0.0.1:0"); code == 0 || !strings.Contains(out, "already running") {
		t.Fatalf("a second evolve up: %d %s", code, out)
	}

	out, code := runBin(t, c.env, "down")
	if code != 0 || !strings.Contains(out, "3 orchestrators") {
		t.Fatalf("evolve down: %d\n%s", code, out)
	}
	for _, o := range c.state.Orchestrators {
		if cluster.Alive(o.PID) {
			t.Errorf("%s (pid %d) still runs after evolve down", o.Name, o.PID)
		}
		if _, err := os.Stat(o.DataDir); !os.IsNotExist(err) {
			t.Errorf("%s's data directory %s is left: %v", o.Name, o.DataDir, err)
		}
	}
}

// An engine given one orchestrator's NATS URL, with the event plane's
// token in it, goes on through another when that orchestrator is killed:
// it reconnects to a server it learned of from the cluster, whose URL has
// no token of its own, and is heard again.
func TestEngineReconnectsThroughALearnedServerWithItsToken(t *testing.T) {
	if !hasNonLoopbackAddress() {
		t.Skip("this machine has no address but loopback: a NATS server on 0.0.0.0 advertises none to learn")
	}
	const token = "s3cret-token"
	cl := []string{freePort(t), freePort(t)}
	var orchs [2]*orchProc
	for i := range orchs {
		orchs[i] = launchOrchestrator(t, "--name", fmt.Sprint("orch-", i), "--nats-listen", "0.0.0.0:0", "--nats-token", token,
			"--cluster-listen", cl[i], "--cluster-peers", cl[1-i])
	}
	for _, o := range orchs {
		o.waitReady(t, 60*time.Second)
	}
	_, portA, _ := net.SplitHostPort(strings.TrimPrefix(orchs[0].info.NATSURL, "nats://"))
	eng := startEngine(t, "--nats", fmt.Sprintf("nats://%s@127.0.0.1:%s", token, portA), "--id", "e0", "--profile", "tiny")
	serving := func(o *orchProc, after time.Time) bool {
		var n controlapi.Node
		getJSON(t, o.info.ControlURL+"/api/v1/nodes/e0", &n)
		return n.State == orchestrator.StateServing && n.LastSeen.After(after)
	}
	wait.Until(t, 20*time.Second, "orch-1 sees e0 serving", func() bool { return serving(orchs[1], time.Time{}) })
	orchs[0].cmd.Process.Signal(syscall.SIGKILL)
	<-orchs[0].done
	killed := time.Now()
	wait.Until(t, 15*time.Second, "e0 heard by orch-1 again, 5 s after orch-0 died", func() bool {
		return serving(orchs[1], killed.Add(5*time.Second))
	})
	if log := eng.logText(); strings.Contains(log, "connection closed") || strings.Contains(log, "authorization violation") {
		t.Fatalf("the engine's NATS connection failed on the way:\n%s", log)
	}
}

// hasNonLoopbackAddress says whether this machine has an IP address off
// loopback (a NATS server on 0.0.0.0 advertises those to its clients).
func hasNonLoopbackAddress() bool {
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if ip, ok := a.(*net.IPNet); ok && !ip.IP.IsLoopback() && ip.IP.To4() != nil {
			return true
		}
	}
	return false
}

// routedRequests is how many requests the router at base has answered,
// whatever their outcome (0 before its first).
func routedRequests(t *testing.T, base string) float64 {
	t.Helper()
	n := 0.0
	for _, line := range scrape(t, http.DefaultClient, base) {
		if strings.HasPrefix(line, "evolve_router_requests_total{") {
			n += sampleValue(line)
		}
	}
	return n
}
