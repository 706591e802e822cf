package orchestrator

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/evolvellm/evolve/engine/stepmodel"
	"github.com/evolvellm/evolve/internal/wait"
	"github.com/evolvellm/evolve/protocol"
	"github.com/evolvellm/evolve/roles"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// freeAddr is a loopback address free a moment ago: peers must know
// each other's cluster addresses before any of them listens.
func freeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// orchestratorTrio starts three orchestrators whose embedded NATS
// servers form a cluster; stop[i] stops the i-th.
type orchestratorTrio struct {
	o    [3]*Orchestrator
	stop [3]func()
}

func startTrio(t testing.TB) *orchestratorTrio {
	return startOrchestrators(t, 3)
}

// startOrchestrators starts n orchestrators (1 to 3) on one NATS cluster.
func startOrchestrators(t testing.TB, n int) *orchestratorTrio {
	t.Helper()
	cl := make([]string, n)
	for i := range cl {
		cl[i] = freeAddr(t)
	}
	var cfgs []Config
	for i := range n {
		var peers []string
		for j := range n {
			if j != i {
				peers = append(peers, cl[j])
			}
		}
		cfg := Config{Name: fmt.Sprint("orch-", i), RouterAddr: "127.0.0.1:0", ControlAddr: "127.0.0.1:0",
			NATSListen: "127.0.0.1:0", DataDir: t.TempDir(), ClusterListen: cl[i], ClusterPeers: peers}
		if n == 1 {
			cfg.ClusterListen = "" // one alone, as it runs without peers
		}
		cfgs = append(cfgs, cfg)
	}
	return runOrchestrators(t, cfgs...)
}

// runOrchestrators runs an orchestrator of each configuration (three at
// most) and waits until all serve; stop[i] stops the i-th.
func runOrchestrators(t testing.TB, cfgs ...Config) *orchestratorTrio {
	t.Helper()
	tr := &orchestratorTrio{}
	ready := make(chan int, len(cfgs))
	for i, cfg := range cfgs {
		o, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			if err := o.Run(ctx, func() { ready <- i }); err != nil {
				t.Error(err)
			}
		}()
		tr.o[i] = o
		tr.stop[i] = func() { cancel(); <-done }
		t.Cleanup(tr.stop[i])
	}
	for range cfgs {
		select {
		case <-ready:
		case <-time.After(30 * time.Second):
			t.Fatalf("the %d orchestrators did not all start in 30 s", len(cfgs))
		}
	}
	return tr
}

// leader is the index of the one orchestrator that leads, once all live
// ones agree on it.
func (tr *orchestratorTrio) leader(t testing.TB, live ...int) int {
	t.Helper()
	at := -1
	wait.Until(t, 15*time.Second, "one leader that every orchestrator names", func() bool {
		at = -1
		for _, i := range live {
			if tr.o[i].leading() {
				if at >= 0 {
					return false
				}
				at = i
			}
		}
		if at < 0 {
			return false
		}
		for _, i := range live {
			if tr.o[i].Status().Leader != tr.o[at].cfg.Name {
				return false
			}
		}
		return true
	})
	return at
}

// Three orchestrators on one NATS cluster: one leads the planner, all
// route, an operator's role change made on a follower is made by the
// leader and seen by all, and when the leader stops another leads within
// 10 s, with the pins an operator set, while the stopped leader's role
// commands are refused by the engines.
func TestThreeOrchestratorsOneLeader(t *testing.T) {
	tr := startTrio(t)
	lead := tr.leader(t, 0, 1, 2)
	for _, o := range tr.o {
		wait.Until(t, 5*time.Second, o.cfg.Name+" lists the three orchestrators", func() bool {
			up := 0
			for _, x := range o.Status().Orchestrators {
				if x.State == "up" && x.NATSPeers == 2 {
					up++
				}
			}
			return up == 3
		})
		if rt := o.RouterTargets(""); len(rt) != 3 || rt[0] != o.RouterURL() {
			t.Fatalf("%s's Prometheus router targets %v: want the three, its own first", o.cfg.Name, rt)
		}
		// Its /metrics say so, for the alerts on a missing leader.
		m := routerMetrics(t, o)
		for _, want := range []string{"evolve_planner_leaders 1\n", `evolve_orchestrators{state="up"} 3` + "\n", `evolve_orchestrators{state="silent"} 0` + "\n"} {
			if !strings.Contains(m, want) {
				t.Fatalf("%s's /metrics lack %q", o.cfg.Name, want)
			}
		}
	}

	// Engines join through one orchestrator's NATS server; every
	// orchestrator routes to them.
	tc := &testCluster{o: tr.o[(lead+1)%3]}
	p, _ := stepmodel.BuiltinProfile("tiny")
	tc.addEngine(t, "e0", p, roles.Decode)
	tc.addEngine(t, "e1", p, roles.Decode)
	t.Cleanup(func() {
		for _, stop := range tc.engines {
			stop()
		}
	})
	// The leader asks each engine for its KV once; the others take the
	// events it brings rather than ask again.
	for i, o := range tr.o {
		outcome, want := "shared", 2.0
		if i == lead {
			outcome = "applied"
		}
		wait.Until(t, 10*time.Second, o.cfg.Name+"'s resyncs "+outcome, func() bool {
			return testutil.ToFloat64(o.met.resyncs.WithLabelValues(outcome)) == want
		})
		if i != lead {
			if n := testutil.ToFloat64(o.met.resyncs.WithLabelValues("applied")); n != 0 {
				t.Fatalf("%s asked for %v resyncs of its own", o.cfg.Name, n)
			}
		}
	}
	for _, o := range tr.o {
		wait.Until(t, 10*time.Second, o.cfg.Name+" sees both engines", func() bool { return o.servingNodes() == 2 })
		if status, body := postJSON(t, o.RouterURL()+"/v1/completions", `{"prompt": "hello there", "max_tokens": 3}`); status != 200 {
			t.Fatalf("%s's router: %d %v", o.cfg.Name, status, body)
		}
	}

	// The load one router places counts on the others' bookkeeping
	// while it lasts.
	via, others := tr.o[lead], []*Orchestrator{tr.o[(lead+1)%3], tr.o[(lead+2)%3]}
	resp, err := http.Post(via.RouterURL()+"/v1/completions", "application/json",
		strings.NewReader(`{"prompt": "a long answer please", "max_tokens": 8000, "ignore_eos": true, "stream": true}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	for _, o := range others {
		wait.Until(t, 5*time.Second, o.cfg.Name+" counts the other router's request", func() bool { return o.remoteLoadCount() == 1 })
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	for _, o := range others {
		wait.Until(t, 5*time.Second, o.cfg.Name+" forgets the finished request", func() bool { return o.remoteLoadCount() == 0 })
	}

	// A role change asked of a follower: the leader makes it.
	follower := tr.o[(lead+1)%3]
	if _, err := follower.SetRole("e0", "prefill", true, "operator"); err != nil {
		t.Fatal(err)
	}
	for _, o := range tr.o {
		wait.Until(t, 10*time.Second, o.cfg.Name+" sees e0 prefill", func() bool {
			st, ok := o.NodeStatus("e0")
			return ok && st.Role == "prefill" && st.State == StateServing
		})
	}
	if st, _ := follower.PlannerStatus(); st.State != "following" || !strings.Contains(st.Reason, tr.o[lead].cfg.Name+" leads") {
		t.Fatalf("a follower's planner status: %s: %s", st.State, st.Reason)
	}
	old, ok := tr.o[lead].leads()
	if !ok || old == nil || old.Term == 0 {
		t.Fatalf("the leader's fence: %+v %v", old, ok)
	}

	tr.stop[lead]()
	var live []int
	for i := range 3 {
		if i != lead {
			live = append(live, i)
		}
	}
	start := time.Now()
	next := tr.leader(t, live...)
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("a new leader after %s", took)
	}
	f, _ := tr.o[next].leads()
	if f.Term <= old.Term || f.Lease != old.Lease {
		t.Fatalf("new fence %+v after %+v", f, old)
	}
	// The new leader knows e0's pin.
	st, _ := tr.o[next].NodeStatus("e0")
	if st.Mode != ModePinned || st.Role != "prefill" {
		t.Fatalf("e0 on the new leader: %s, %s", st.Role, st.Mode)
	}
	// The new leader's command, then a late one of the old leader's.
	if _, err := tr.o[next].SetRole("e1", "prefill", false, "operator"); err != nil {
		t.Fatal(err)
	}
	wait.Until(t, 10*time.Second, "e1 prefill", func() bool {
		st, ok := tr.o[next].NodeStatus("e1")
		return ok && st.Role == "prefill" && st.State == StateServing
	})
	nc, err := nats.Connect(tr.o[next].NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	b, _ := json.Marshal(protocol.ControlRequest{Op: protocol.OpSetRole, Role: "decode", Fence: old})
	msg, err := nc.Request(protocol.ControlSubject("e1"), b, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var rep protocol.ControlReply
	json.Unmarshal(msg.Data, &rep)
	if rep.OK || !strings.Contains(rep.Error, "fenced") {
		t.Fatalf("the deposed leader's set_role: %+v", rep)
	}
	b, _ = json.Marshal(protocol.ControlRequest{Op: protocol.OpStatus})
	if msg, err = nc.Request(protocol.ControlSubject("e1"), b, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	json.Unmarshal(msg.Data, &rep)
	if rep.Role != "prefill" {
		t.Fatalf("e1 after the deposed leader's set_role: %+v", rep)
	}
}

// BenchmarkRouters measures requests routed per second through 1 and 3
// routers (orchestrators on one NATS cluster, sharing their load) to four
// tiny engines, from 64 clients spread over the routers, each request a
// 100-word prompt and one output token. All run on this machine, the
// engines too: the figure is what this machine's cores allow, not what
// routers on their own machines would reach.
func BenchmarkRouters(b *testing.B) {
	for _, n := range []int{1, 3} {
		b.Run(fmt.Sprint("routers=", n), func(b *testing.B) {
			tr := startOrchestrators(b, n)
			tc := &testCluster{o: tr.o[0]}
			p, _ := stepmodel.BuiltinProfile("tiny")
			for i := range 4 {
				tc.addEngine(b, fmt.Sprint("e", i), p, []roles.Role{roles.Prefill, roles.Decode, roles.Decode, roles.Decode}[i])
			}
			b.Cleanup(func() {
				for _, stop := range tc.engines {
					stop()
				}
			})
			for i := range n {
				wait.Until(b, 15*time.Second, "four engines", func() bool { return tr.o[i].servingNodes() == 4 })
			}
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 128}}
			var next atomic.Int64
			b.SetParallelism(64 / max(1, runtime.GOMAXPROCS(0)))
			b.ResetTimer()
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				i := next.Add(1)
				url := tr.o[int(i)%n].RouterURL() + "/v1/completions"
				for pb.Next() {
					i++
					body := fmt.Sprintf(`{"prompt": "client %d asks %s", "max_tokens": 1}`, i, strings.Repeat("word ", 100))
					resp, err := client.Post(url, "application/json", strings.NewReader(body))
					if err != nil {
						b.Error(err)
						return
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 200 {
						b.Errorf("status %d", resp.StatusCode)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "requests/s")
		})
	}
}

// A node switching waits for the requests other routers sent it, not
// only its leader's own: the leader drains a decode node while an answer
// streams to it through another orchestrator's router.
func TestSwitchWaitsForOtherRoutersRequests(t *testing.T) {
	tr := startTrio(t)
	lead := tr.leader(t, 0, 1, 2)
	tc := &testCluster{o: tr.o[lead]}
	p, _ := stepmodel.BuiltinProfile("gb300-kimi-k2") // an answer of 8,000 tokens takes seconds
	tc.addEngine(t, "e0", p, roles.Decode)
	tc.addEngine(t, "e1", p, roles.Decode)
	t.Cleanup(func() {
		for _, stop := range tc.engines {
			stop()
		}
	})
	via := tr.o[(lead+1)%3]
	wait.Until(t, 10*time.Second, "both engines seen through another router", func() bool { return via.servingNodes() == 2 })
	resp, err := http.Post(via.RouterURL()+"/v1/completions", "application/json",
		strings.NewReader(`{"prompt": "a long answer please", "max_tokens": 8000, "ignore_eos": true, "stream": true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	var node string
	wait.Until(t, 5*time.Second, "the leader knows where the other router sent it", func() bool {
		for _, id := range []string{"e0", "e1"} {
			if tr.o[lead].remoteOn(id) > 0 {
				node = id
			}
		}
		return node != ""
	})
	if _, err := tr.o[lead].SetRole(node, "prefill", false, "operator"); err != nil {
		t.Fatal(err)
	}
	// While the answer streams, the node drains: every orchestrator shows
	// it switching, and it keeps its role.
	wait.Until(t, 5*time.Second, "the switch shown by the other router", func() bool {
		st, _ := via.NodeStatus(node)
		return st.State == StateSwitching
	})
	for end := time.Now().Add(1500 * time.Millisecond); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		for _, o := range []*Orchestrator{tr.o[lead], via} {
			st, _ := o.NodeStatus(node)
			if st.Role != "decode" || st.State != StateSwitching {
				t.Fatalf("%s on %s with another router's answer in flight: %s, %s", node, o.cfg.Name, st.Role, st.State)
			}
		}
	}
	io.Copy(io.Discard, resp.Body)
	for _, o := range tr.o {
		wait.Until(t, 10*time.Second, o.cfg.Name+" sees the switch done", func() bool {
			st, _ := o.NodeStatus(node)
			return st.Role == "prefill" && st.State == StateServing
		})
	}
}

// natsCluster starts three NATS servers with JetStream that form one
// cluster, as an operator's existing deployment, and returns a client
// URL listing them.
func natsCluster(t *testing.T) string {
	t.Helper()
	routes := make([]string, 3)
	for i := range routes {
		routes[i] = freeAddr(t)
	}
	var servers []*server.Server
	for i := range 3 {
		_, port, _ := net.SplitHostPort(routes[i])
		p, _ := strconv.Atoi(port)
		opts := &server.Options{ServerName: fmt.Sprint("nats-", i), Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(),
			NoSigs: true, NoLog: true, Cluster: server.ClusterOpts{Name: "ops", Host: "127.0.0.1", Port: p}}
		for j, r := range routes {
			if j != i {
				opts.Routes = append(opts.Routes, &url.URL{Scheme: "nats-route", Host: r})
			}
		}
		ns, err := server.NewServer(opts)
		if err != nil {
			t.Fatal(err)
		}
		go ns.Start()
		t.Cleanup(ns.Shutdown)
		servers = append(servers, ns)
	}
	var urls []string
	for _, ns := range servers {
		if !ns.ReadyForConnections(20 * time.Second) {
			t.Fatal("a NATS server of the cluster not ready in 20 s")
		}
		urls = append(urls, ns.ClientURL())
	}
	return strings.Join(urls, ",")
}

// Orchestrators attached to an existing NATS cluster (--nats) share it
// as they share their own: one leads, the lease kept in three copies, and
// another leads when it stops.
func TestOrchestratorsOnAnExistingNATSCluster(t *testing.T) {
	natsURL := natsCluster(t)
	var cfgs []Config
	for i := range 2 {
		cfgs = append(cfgs, Config{Name: fmt.Sprint("orch-", i), RouterAddr: "127.0.0.1:0", ControlAddr: "127.0.0.1:0", NATSURL: natsURL})
	}
	tr := runOrchestrators(t, cfgs...)
	lead := tr.leader(t, 0, 1)
	if r := tr.o[lead].replicas(); r != 3 {
		t.Fatalf("state kept in %d copies on a cluster of three NATS servers", r)
	}
	tr.stop[lead]()
	if next := tr.leader(t, 1-lead); next != 1-lead {
		t.Fatalf("leader %d", next)
	}
}

// Routers on every interface, of orchestrators on an existing NATS
// (no route of their own to be named by), are each listed for
// Prometheus by the address their host reaches the event plane from.
func TestRoutersOnEveryInterfaceAreListedOnAnExistingNATS(t *testing.T) {
	natsURL := natsCluster(t)
	var cfgs []Config
	for i := range 2 {
		cfgs = append(cfgs, Config{Name: fmt.Sprint("orch-", i), RouterAddr: "0.0.0.0:0", ControlAddr: "127.0.0.1:0", NATSURL: natsURL, PlannerMode: PlannerOff})
	}
	tr := runOrchestrators(t, cfgs...)
	a, b := tr.o[0], tr.o[1]
	wait.Until(t, 10*time.Second, "each hears the other", func() bool { return a.hasPeers() && b.hasPeers() })
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(b.RouterURL(), "http://"))
	want := "http://127.0.0.1:" + port // the NATS servers listen on loopback
	wait.Until(t, 10*time.Second, "orch-1's router listed by orch-0", func() bool {
		targets := a.RouterTargets("10.0.0.9:8001")
		return len(targets) == 2 && targets[1] == want
	})
	if got := a.RouterTargets("10.0.0.9:8001")[0]; !strings.HasPrefix(got, "http://10.0.0.9:") {
		t.Fatalf("orch-0's own router listed as %s: want the address it was asked at", got)
	}
	resp, err := http.Get(want + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("%s/health: %s", want, resp.Status)
	}
}

// remoteLoadCount is how many requests of other routers the policy
// counts now.
func (o *Orchestrator) remoteLoadCount() int {
	o.policyMu.Lock()
	defer o.policyMu.Unlock()
	n := 0
	for _, reqs := range o.remote {
		n += len(reqs)
	}
	return n
}

// An API key name's max-concurrency holds across routers: with one of
// its requests in flight at each of two routers and a limit of 2, a third
// is refused wherever it comes; a request waiting at one router is
// admitted when the other's end; a router that dies stops counting.
func TestKeyLimitHoldsAcrossRouters(t *testing.T) {
	cl := []string{freeAddr(t), freeAddr(t)}
	keys := []string{"team sk-t max-concurrency=2 max-wait=0s", "slow sk-s max-concurrency=1 max-wait=10s"}
	var cfgs []Config
	for i := range 2 {
		cfgs = append(cfgs, Config{Name: fmt.Sprint("orch-", i), RouterAddr: "127.0.0.1:0", ControlAddr: "127.0.0.1:0", NATSListen: "127.0.0.1:0",
			DataDir: t.TempDir(), ClusterListen: cl[i], ClusterPeers: []string{cl[1-i]}, APIKeys: keys, PlannerMode: PlannerOff})
	}
	tr := runOrchestrators(t, cfgs...)
	a, b := tr.o[0], tr.o[1]
	wait.Until(t, 10*time.Second, "each router hears the other", func() bool { return a.hasPeers() && b.hasPeers() })
	heldA := &held{release: make(chan struct{}), started: make(chan struct{}, 16)}
	heldB := &held{release: make(chan struct{}), started: make(chan struct{}, 16)}
	ha, hb := a.requireKey(heldA), b.requireKey(heldB)
	ctx := context.Background()

	ask(ha, ctx, "POST", "/v1/chat/completions", "sk-t")
	<-heldA.started
	ask(hb, ctx, "POST", "/v1/chat/completions", "sk-t")
	<-heldB.started
	wait.Until(t, 5*time.Second, "each router counts the other's request", func() bool {
		return a.othersInFlight("team") == 1 && b.othersInFlight("team") == 1
	})
	for name, h := range map[string]http.Handler{"orch-0": ha, "orch-1": hb} {
		t.Run(name, func(t *testing.T) {
			w, done := ask(h, ctx, "POST", "/v1/completions", "sk-t")
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				t.Fatalf("a third request of a name limited to 2, through %s, was admitted", name)
			}
			if w.Code != 429 || !strings.Contains(w.Body.String(), "team has 2 requests in flight across the cluster's routers") {
				t.Fatalf("a third request of a name limited to 2, through %s: %d %s, want 429 naming the cluster's count", name, w.Code, w.Body)
			}
		})
	}
	for _, o := range []*Orchestrator{a, b} {
		for _, kl := range o.Status().KeyLimits {
			if kl.Name == "team" && kl.InFlight != 2 {
				t.Fatalf("%s's status: team has %d in flight, want the cluster's 2", o.cfg.Name, kl.InFlight)
			}
		}
	}

	// One waits at orch-0 while orch-1 holds the name's one slot, and goes
	// once orch-1's request ends.
	ask(hb, ctx, "POST", "/v1/chat/completions", "sk-s")
	<-heldB.started
	wait.Until(t, 5*time.Second, "orch-0 counts orch-1's slow request", func() bool { return a.othersInFlight("slow") == 1 })
	w, done := ask(ha, ctx, "POST", "/v1/chat/completions", "sk-s")
	select {
	case <-heldA.started:
		t.Fatal("a request over the name's limit across routers was admitted at once")
	case <-time.After(300 * time.Millisecond):
	}
	close(heldB.release)
	select {
	case <-heldA.started:
	case <-done:
		t.Fatalf("the waiting request ended with %d before orch-1's slot came free", w.Code)
	case <-time.After(5 * time.Second):
		t.Fatal("the waiting request was not admitted within 5 s of the other router's request ending")
	}

	// orch-1 dies holding nothing now; its counts would not outlive it
	// anyway: orch-0 admits up to the limit on its own again.
	tr.stop[1]()
	wait.Until(t, 10*time.Second, "orch-0 forgets the dead router's requests", func() bool { return a.othersInFlight("team") == 0 })
	close(heldA.release)
}
