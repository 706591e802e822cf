package orchestrator

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/evolvellm/evolve/controlapi"
	"github.com/evolvellm/evolve/engine"
	"github.com/evolvellm/evolve/engine/stepmodel"
	"github.com/evolvellm/evolve/internal/wait"
	"github.com/evolvellm/evolve/protocol"
	"github.com/evolvellm/evolve/roles"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// testCluster runs an orchestrator and engines in this process, so that
// the race detector sees all of them.
type testCluster struct {
	o       *Orchestrator
	cancel  context.CancelFunc
	done    chan struct{}
	engines []func()
	servers []*http.Server // each engine's HTTP server
	// wrap, when set, wraps the HTTP handler of each engine added since.
	wrap func(id string, h http.Handler) http.Handler
}

func startTestCluster(t *testing.T, roles ...roles.Role) *testCluster {
	t.Helper()
	return startTestClusterProfiles(t, nil, roles...)
}

// startTestClusterProfiles is startTestCluster with a profile per engine
// (nil: all tiny); it waits for the tiny ones to serve.
func startTestClusterProfiles(t *testing.T, profiles []string, roles ...roles.Role) *testCluster {
	t.Helper()
	return startTestClusterLogged(t, nil, profiles, roles...)
}

// startTestClusterLogged is startTestClusterProfiles with the
// orchestrator logging to log (nil: slog's default).
func startTestClusterLogged(t *testing.T, log *slog.Logger, profiles []string, roles ...roles.Role) *testCluster {
	t.Helper()
	return startTestClusterWith(t, Config{Logger: log}, profiles, roles...)
}

// startTestClusterWith is startTestClusterProfiles with the orchestrator
// configured by cfg, on loopback and free ports.
func startTestClusterWith(t testing.TB, cfg Config, profiles []string, roles ...roles.Role) *testCluster {
	t.Helper()
	cfg.RouterAddr, cfg.ControlAddr, cfg.NATSListen, cfg.DataDir = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0", t.TempDir()
	if cfg.Policy == "" {
		cfg.Policy = "evolve"
	}
	o, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	tc := &testCluster{o: o, cancel: cancel, done: make(chan struct{})}
	ready := make(chan struct{})
	go func() {
		if err := o.Run(ctx, func() { close(ready) }); err != nil {
			t.Error(err)
		}
		close(tc.done)
	}()
	select {
	case <-ready:
	case <-time.After(10 * time.Second):
		t.Fatal("orchestrator not ready")
	}
	want := 0
	for i, r := range roles {
		name := "tiny"
		if i < len(profiles) && profiles[i] != "" {
			name = profiles[i]
		}
		if name == "tiny" {
			want++
		}
		p, _ := stepmodel.BuiltinProfile(name)
		tc.addEngine(t, fmt.Sprint("e", i), p, r)
	}
	t.Cleanup(tc.stop)
	deadline := time.Now().Add(10 * time.Second)
	for tc.o.servingNodes() < want {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d engines registered", tc.o.servingNodes(), want)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return tc
}

// addEngine starts an engine process of profile p and role r that joins
// the cluster as id; tc.engines gets the function that stops it.
func (tc *testCluster) addEngine(t testing.TB, id string, p *stepmodel.Profile, r roles.Role) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.NewSimulated(engine.Config{ID: id, Profile: p, Role: r, Speedup: 20, AdvertiseURL: "http://" + ln.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(tc.o.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	a := engine.AttachNATS(e, nc, "test")
	ectx, ecancel := context.WithCancel(context.Background())
	if err := a.Start(ectx); err != nil {
		t.Fatal(err)
	}
	h := e.Handler()
	if tc.wrap != nil {
		h = tc.wrap(id, h)
	}
	srv := &http.Server{Handler: h}
	tc.servers = append(tc.servers, srv)
	var wg sync.WaitGroup
	wg.Add(3)
	go func() { defer wg.Done(); e.Run(ectx) }()
	go func() { defer wg.Done(); a.Run(ectx) }()
	go func() { defer wg.Done(); srv.Serve(ln) }()
	tc.engines = append(tc.engines, func() { ecancel(); srv.Close(); wg.Wait(); nc.Close() })
}

func (tc *testCluster) stop() {
	for _, stop := range tc.engines {
		stop()
	}
	tc.engines = nil
	tc.cancel()
	<-tc.done
}

func postJSON(t *testing.T, url, body string) (int, map[string]any) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	b, _ := io.ReadAll(resp.Body)
	json.Unmarshal(b, &out)
	return resp.StatusCode, out
}

func TestRoutesDisaggregatedAndSwitchesUnderLoad(t *testing.T) {
	tc := startTestCluster(t, roles.Prefill, roles.Decode, roles.Decode)
	router := tc.o.RouterURL()
	long := strings.Repeat("context for the agent to read ", 200)

	status, body := postJSON(t, router+"/v1/completions", fmt.Sprintf(`{"prompt": %q, "max_tokens": 4}`, long))
	ev, _ := body["evolve"].(map[string]any)
	if status != 200 || ev == nil || ev["transferred_tokens"].(float64) == 0 {
		t.Fatalf("disaggregated request: %d %v", status, body)
	}
	// Where the prompt's KV came from is the prefill leg's story: a new
	// prompt was computed there, and the router says so beside the decode
	// leg's handoff.
	pre, _ := ev["prefill"].(map[string]any)
	if pre == nil || pre["engine"] != "e0" || pre["computed_tokens"].(float64) == 0 || pre["prefill"] != nil || ev["engine"] == "e0" {
		t.Fatalf("disaggregated request's evolve object: %v", ev)
	}
	// Streamed, the chunk that carries the object carries it too. A new
	// prompt, with nothing cached: the first one's context lives on its
	// decode node once its KV events arrive, and the router then keeps
	// the few tokens left to compute there, unsplit.
	resp, err := http.Post(router+"/v1/completions", "application/json",
		strings.NewReader(fmt.Sprintf(`{"prompt": %q, "max_tokens": 4, "stream": true}`, strings.Repeat("another file for the agent ", 200))))
	if err != nil {
		t.Fatal(err)
	}
	stream, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var streamed map[string]any
	for _, l := range strings.Split(string(stream), "\n") {
		if strings.HasPrefix(l, "data: {") && strings.Contains(l, `"evolve":`) {
			if err := json.Unmarshal([]byte(l[len("data: "):]), &streamed); err != nil {
				t.Fatalf("chunk %q: %v", l, err)
			}
		}
	}
	ev, _ = streamed["evolve"].(map[string]any)
	if pre, _ := ev["prefill"].(map[string]any); pre == nil || pre["engine"] != "e0" || ev["engine"] == "e0" {
		t.Fatalf("streamed disaggregated request: %s", stream)
	}
	// The answer's headers name the nodes that served it.
	if p, d := resp.Header.Get(HeaderPrefillNode), resp.Header.Get(HeaderDecodeNode); p != "e0" || d != ev["engine"] || resp.Header.Get("X-Request-Id") == "" {
		t.Fatalf("streamed answer's headers name prefill %q and decode %q (id %q); the engines were e0 and %v",
			p, d, resp.Header.Get("X-Request-Id"), ev["engine"])
	}
	// The directory learned the prompt's blocks from the prefill engine.
	wait.Until(t, 10*time.Second, "directory holds the prompt", func() bool { return tc.o.Status().KVReplicas > 0 })

	// Watch the control stream while switching a node under load.
	watchCtx, stopWatch := context.WithCancel(context.Background())
	defer stopWatch()
	events := make(chan controlapi.WatchEvent, 1024)
	go (&controlapi.Client{Base: tc.o.ControlURL()}).Watch(watchCtx, "/api/v1/watch", events)
	first := <-events
	if first.Type != "snapshot" || len(first.Nodes) != 3 {
		t.Fatalf("watch did not start with a snapshot: %+v", first)
	}

	var wg sync.WaitGroup
	var mu sync.Mutex
	var failures []string
	for w := 0; w < 3; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < 6; i++ {
				st, b := postJSON(t, router+"/v1/completions", fmt.Sprintf(`{"prompt": %q, "max_tokens": 20}`, fmt.Sprint(long, w, i)))
				if st != 200 {
					mu.Lock()
					failures = append(failures, fmt.Sprint(st, b))
					mu.Unlock()
				}
			}
		}(w)
	}
	if _, err := tc.o.SetRole("e1", "prefill", true, "test"); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if len(failures) > 0 {
		t.Fatalf("requests failed during the switch: %v", failures)
	}
	wait.Until(t, 10*time.Second, "switch completes", func() bool {
		st, _ := tc.o.NodeStatus("e1")
		return st.Role == "prefill" && st.Switch == nil && st.State == StateServing && st.Mode == ModePinned
	})
	sawSwitching := false
	timeout := time.After(5 * time.Second)
	for !sawSwitching {
		select {
		case ev := <-events:
			if n := ev.Node; n != nil && n.ID == "e1" && n.State == StateSwitching {
				sawSwitching = true
			}
		case <-timeout:
			t.Fatal("the watch stream never showed e1 switching")
		}
	}

	// A node that stops is marked down and leaves the directory.
	tc.engines[2]()
	tc.engines[2] = func() {}
	wait.Until(t, 10*time.Second, "e2 down", func() bool {
		st, _ := tc.o.NodeStatus("e2")
		return st.State == StateDown && st.GPUBlocks == 0
	})
}

func TestControlAPIRequiresTokenOffLoopback(t *testing.T) {
	if _, err := New(Config{RouterAddr: "127.0.0.1:0", ControlAddr: "0.0.0.0:0", DataDir: t.TempDir()}); err == nil {
		t.Fatal("a control API on all interfaces without a token was accepted")
	}
	if _, err := New(Config{ControlAddr: "127.0.0.1:0", DataDir: t.TempDir(), Policy: "fastest"}); err == nil {
		t.Fatal("unknown policy accepted")
	}
}

// An engine whose HTTP side dies while its heartbeats go on: requests
// routed to it fail before their first byte and are routed again.
func TestRetriesOnAnotherEngineBeforeFirstByte(t *testing.T) {
	tc := startTestCluster(t, roles.Decode, roles.Decode)
	tc.servers[0].Close()
	for i := 0; i < 10; i++ {
		status, body := postJSON(t, tc.o.RouterURL()+"/v1/completions", fmt.Sprintf(`{"prompt": "request %d", "max_tokens": 3}`, i))
		ev, _ := body["evolve"].(map[string]any)
		if status != 200 || ev["engine"] != "e1" {
			t.Fatalf("request %d: %d %v", i, status, body)
		}
	}
	// Some were first routed to the dead engine: more decisions than requests.
	if n := testutil.ToFloat64(tc.o.met.decisions.WithLabelValues("evolve", "false")); n <= 10 {
		t.Fatalf("%v routing decisions for 10 requests: the retry path never ran", n)
	}
}

// An engine of another model joining the cluster is kept out of routing.
func TestRejectsEngineOfAnotherModel(t *testing.T) {
	tc := startTestClusterProfiles(t, []string{"tiny", "gb300-kimi-k2"}, roles.Decode, roles.Decode)
	wait.Until(t, 10*time.Second, "e1 rejected", func() bool {
		st, ok := tc.o.NodeStatus("e1")
		return ok && st.State == StateRejected && st.Reason != ""
	})
	for i := 0; i < 5; i++ {
		status, body := postJSON(t, tc.o.RouterURL()+"/v1/completions", fmt.Sprintf(`{"prompt": "hello %d", "max_tokens": 2}`, i))
		if ev, _ := body["evolve"].(map[string]any); status != 200 || ev["engine"] != "e0" {
			t.Fatalf("request %d: %d %v", i, status, body)
		}
	}
}

// When the decode leg fails before it pulls the KV, the router frees the
// prefill engine's hold at once and serves the request elsewhere.
func TestFailedDecodeLegReleasesPrefillHold(t *testing.T) {
	tc := startTestCluster(t, roles.Prefill, roles.Decode)
	tc.servers[1].Close() // the decode engine's HTTP dies; its heartbeats go on
	long := strings.Repeat("context for the agent to read ", 200)
	status, body := postJSON(t, tc.o.RouterURL()+"/v1/completions", fmt.Sprintf(`{"prompt": %q, "max_tokens": 3}`, long))
	if status != 200 {
		t.Fatalf("request: %d %v", status, body)
	}
	st, _ := tc.o.NodeStatus("e0")
	wait.Until(t, 10*time.Second, "no KV held on the prefill engine", func() bool {
		resp, err := http.Get(st.Address + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, "evolve_engine_held_requests{") {
				return strings.HasSuffix(line, " 0")
			}
		}
		return false
	})
}

// A cluster whose engines publish no pass records (vLLM) gets a planner
// that says so, rather than "learning" for ever.
func TestPlannerSaysWhenNoEngineReportsPasses(t *testing.T) {
	tc := startTestCluster(t)
	nc, err := nats.Connect(tc.o.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	reg := protocol.Registration{ID: "v0", URL: "http://127.0.0.1:1", Backend: "vllm", Model: "m", Role: "both", BlockSize: 16,
		GPUBlocks: 1000, MaxModelLen: 4096, Speedup: 1, StartedAt: time.Now().Add(-2 * time.Minute), Tokenizer: "engine", SelfManagedKV: true}
	publish := func(subject string, v any) {
		b, _ := json.Marshal(v)
		nc.Publish(subject, b)
	}
	publish(protocol.SubjectRegister, reg)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			publish(protocol.HeartbeatSubject("v0"), protocol.Heartbeat{ID: "v0", Time: time.Now(), Role: "decode"})
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	wait.Until(t, 10*time.Second, "the planner's reason", func() bool {
		st, ok := tc.o.PlannerStatus()
		return ok && strings.Contains(st.Reason, "no engine publishes per-pass statistics") && strings.Contains(st.Reason, "--pass-metrics-port")
	})
}

// recordLog is a slog handler that keeps every record's message and
// attributes, for a test to look for a line.
type recordLog struct {
	mu   sync.Mutex
	recs []map[string]any
}

func (l *recordLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *recordLog) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *recordLog) WithGroup(string) slog.Handler            { return l }

func (l *recordLog) Handle(_ context.Context, r slog.Record) error {
	rec := map[string]any{"msg": r.Message, "level": r.Level.String()}
	r.Attrs(func(a slog.Attr) bool { rec[a.Key] = a.Value.Any(); return true })
	l.mu.Lock()
	l.recs = append(l.recs, rec)
	l.mu.Unlock()
	return nil
}

// find returns the first record with msg whose attribute key is val.
func (l *recordLog) find(msg, key string, val any) map[string]any {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.recs {
		if r["msg"] == msg && r[key] == val {
			return r
		}
	}
	return nil
}

// all returns the records with msg.
func (l *recordLog) all(msg string) []map[string]any {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, r := range l.recs {
		if r["msg"] == msg {
			out = append(out, r)
		}
	}
	return out
}

// An operator asking where a request went finds it in the answer's
// headers, on success and on the engine's refusal alike, and, at debug
// level, in the router's log with the policy's reason.
func TestAnswerSaysWhereItWasServed(t *testing.T) {
	logs := &recordLog{}
	log := slog.New(logs)
	tc := startTestClusterLogged(t, log, nil, roles.Prefill, roles.Decode)
	router := tc.o.RouterURL()
	post := func(body string) *http.Response {
		t.Helper()
		resp, err := http.Post(router+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	long := strings.Repeat("the repository's context, read again ", 100)
	resp := post(fmt.Sprintf(`{"prompt": %q, "max_tokens": 3}`, long))
	id := resp.Header.Get("X-Request-Id")
	if resp.StatusCode != 200 || resp.Header.Get(HeaderPrefillNode) != "e0" || resp.Header.Get(HeaderDecodeNode) != "e1" || id == "" {
		t.Fatalf("answer %d with headers %v: want prefill e0, decode e1 and a request id", resp.StatusCode, resp.Header)
	}
	routed := logs.find("routed", "request", id)
	if routed == nil || routed["prefill"] != "e0" || routed["decode"] != "e1" || routed["disaggregated"] != true ||
		!strings.HasPrefix(fmt.Sprint(routed["why"]), "evolve: ") || routed["prompt_tokens"] == int64(0) {
		t.Fatalf("the debug log's line for %s: %v", id, routed)
	}

	// More output than the model's context holds beside the prompt is the
	// request's fault: the router refuses it before any engine, with the
	// request's id and no node.
	resp = post(`{"prompt": "hello", "max_tokens": 8192}`) // tiny's context, with the prompt over it
	if resp.StatusCode != 400 || resp.Header.Get(HeaderPrefillNode) != "" || resp.Header.Get("X-Request-Id") == "" {
		t.Fatalf("refused request answered %d with headers %v", resp.StatusCode, resp.Header)
	}
}

// A prefill node switching to decode waits for the prefills it serves,
// not for the decodes that follow them on other nodes: once a split
// request's decode leg answers, its KV has left the prefill node. (Math
// agents' decodes run for minutes; the switch used to wait for all.)
func TestPrefillSwitchDoesNotWaitForDecodesElsewhere(t *testing.T) {
	tc := startTestCluster(t, roles.Prefill, roles.Decode)
	long := strings.Repeat("a problem to reason about at length ", 200)
	resp, err := http.Post(tc.o.RouterURL()+"/v1/completions", "application/json",
		strings.NewReader(fmt.Sprintf(`{"prompt": %q, "max_tokens": 6000, "ignore_eos": true, "stream": true}`, long)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	if !sc.Scan() || resp.Header.Get(HeaderPrefillNode) != "e0" || resp.Header.Get(HeaderDecodeNode) != "e1" {
		t.Fatalf("want a request split e0 -> e1: %v %v", sc.Err(), resp.Header)
	}
	ended := make(chan time.Time, 1)
	go func() {
		for sc.Scan() {
		}
		ended <- time.Now()
	}()
	if _, err := tc.o.SetRole("e0", "decode", true, "test"); err != nil {
		t.Fatal(err)
	}
	wait.Until(t, 10*time.Second, "e0 switches to decode", func() bool {
		st, _ := tc.o.NodeStatus("e0")
		return st.Role == "decode" && st.State == StateServing
	})
	select {
	case at := <-ended:
		t.Fatalf("the switch finished after the decode on e1 (it ended at %s): it waited for it", at.Format("15:04:05.000"))
	default:
	}
	<-ended
}
