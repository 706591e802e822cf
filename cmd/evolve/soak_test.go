package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/evolvellm/evolve/cluster"
	"github.com/evolvellm/evolve/internal/wait"
	"github.com/evolvellm/evolve/orchestrator"
)

// TestSoak runs a local cluster of four engines under 64 agents for
// $EVOLVE_SOAK (30m is the figure operators asked for; skipped when unset,
// and never in CI) while an operator's faults come every
// $EVOLVE_SOAK_EVERY (default 2m): in turn an engine stopped (SIGSTOP)
// for 10 s and continued, an engine killed (SIGKILL) and restarted by
// its supervisor with the same command line, and an engine hung (SIGSTOP)
// past the router's stream idle time, whose answers must go on elsewhere
// with no stream waiting that long for a token; at a third and two thirds of
// the run the orchestrator is killed with -9 and restarted so. After every
// fault every node must serve again; the agents' calls must complete or be
// retried (a stream cut by a killed orchestrator is sent again); and the
// orchestrator's memory (RSS) and goroutines in the run's last minute must
// be within 10% of its first.
//
// The faults start after $EVOLVE_SOAK_WARMUP (default 10m) of agents
// alone. An orchestrator's memory grows at first to bounds it then keeps:
// the KV directory follows the engines' pools until they are full (4 to 5
// minutes here), and the record of evicted blocks for lost reuse fills
// its second generation (8 to 9 minutes). What the soak looks for is
// memory that grows past them. Each orchestrator process's growth (from
// its third minute to its last) is reported, not judged, since a process
// restarted by the faults grows to the same bounds again; but each must
// end within 10% of the soak's first minute too.
//
// The figures go to the log, and as JSON to $EVOLVE_SOAK_OUT when set:
//
//	EVOLVE_SOAK=30m EVOLVE_SOAK_OUT=soak.json go test ./cmd/evolve -run TestSoak -v -timeout 50m
func TestSoak(t *testing.T) {
	total, err := time.ParseDuration(os.Getenv("EVOLVE_SOAK"))
	if err != nil {
		t.Skip("set EVOLVE_SOAK to a duration (30m) to run the soak")
	}
	every := 2 * time.Minute
	if e, err := time.ParseDuration(os.Getenv("EVOLVE_SOAK_EVERY")); err == nil {
		every = e
	}
	warmup := 10 * time.Minute
	if w, err := time.ParseDuration(os.Getenv("EVOLVE_SOAK_WARMUP")); err == nil {
		warmup = w
	}
	warm := min(2*time.Minute, total/6)
	const engines, agents = 4, 64
	// A profile whose context holds the coding agents' prompts.
	c := upCluster(t, "--engines", strconv.Itoa(engines), "--speedup", "20", "--profile", "gb300-kimi-k2",
		"--router-addr", freePort(t), "--control-addr", freePort(t))
	s := &soak{t: t, c: c, logDir: t.TempDir(), engines: slices.Clone(c.state.Engines), orch: c.state.Orchestrator}

	bench := exec.Command(evolveBin, "bench", "--agents", strconv.Itoa(agents), "--duration", (warmup + total).String(),
		"--speedup", "20", "--workload", "coding", "--unreachable-timeout", "0", "-o", "json")
	bench.Env = append(os.Environ(), c.env...)
	var benchOut bytes.Buffer
	bench.Stdout = &benchOut
	benchLog, _ := os.Create(filepath.Join(s.logDir, "bench.log"))
	bench.Stderr = benchLog
	if err := bench.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bench.Process.Kill() })
	s.started = map[int]time.Time{s.orch: time.Now()}
	stopSampling := s.sampleEvery(10 * time.Second)
	if warmup > 0 {
		t.Logf("warming up for %v: agents only, no faults", warmup)
		time.Sleep(warmup)
	}
	start := time.Now() // the faults' clock
	s.soakStart = start
	at := func(d time.Duration) { time.Sleep(time.Until(start.Add(d))) }

	const hangFor = orchestrator.DefaultStreamIdle + 15*time.Second
	orchKills := []time.Duration{total / 3, 2 * total / 3}
	next := every
	for i := 0; next < total-every/2; i++ {
		for len(orchKills) > 0 && orchKills[0] <= next {
			at(orchKills[0])
			s.killOrchestrator()
			orchKills = orchKills[1:]
		}
		at(next)
		switch i % 3 {
		case 0:
			s.stopEngine(i/3%engines, 10*time.Second)
		case 1:
			s.killEngine(i / 3 % engines)
		case 2:
			// Hung past the router's stream idle time: its answers must
			// go on elsewhere, none waiting for it.
			s.stopEngine(i/3%engines, hangFor)
		}
		next += every
	}
	for _, k := range orchKills {
		at(k)
		s.killOrchestrator()
	}
	at(total - 5*time.Second)
	stopSampling()
	s.summarize(warm)
	if err := bench.Wait(); err != nil {
		t.Errorf("evolve bench: %v", err)
	}
	if err := json.Unmarshal(benchOut.Bytes(), &s.fig.Bench); err != nil {
		t.Fatalf("evolve bench -o json: %v\n%s", err, benchOut.String())
	}
	s.report()
}

// soak holds a soak run's cluster, its faults and its figures.
type soak struct {
	t       *testing.T
	c       *localCluster
	logDir  string
	engines []int // engine pids, by index
	orch    int   // the orchestrator's pid
	fig     soakFigures

	mu        sync.Mutex
	started   map[int]time.Time // each orchestrator process's start
	soakStart time.Time         // the end of the warm-up
	samples   []soakSample
}

// soakFigures is what a soak measured.
type soakFigures struct {
	// Began and Ended: the orchestrator's figures (medians of 10 s
	// samples) in the first minute after the warm-up and in the run's
	// last minute, whichever process served then. These are judged.
	Began soakSample `json:"began"`
	Ended soakSample `json:"ended"`
	// WarmupBegan: its second minute, for how much it grew warming up.
	WarmupBegan soakSample `json:"warmup_second_minute"`
	// Orchestrators: each orchestrator process's figures, warm (a
	// minute's median from warm after it started) and at its end (the
	// median of its last minute).
	Orchestrators []soakProcess
	Faults        []soakFault
	Bench         map[string]any
}

type soakProcess struct {
	PID    int        `json:"pid"`
	Ran    string     `json:"ran"`
	BeganS soakSample `json:"warm"`
	EndedS soakSample `json:"end"`
}

type soakSample struct {
	at         time.Time
	pid        int
	RSSMB      float64 `json:"rss_mb"`
	Goroutines float64 `json:"goroutines"`
	HeapMB     float64 `json:"heap_inuse_mb"`
	// KVCopies: the block copies the KV directory holds, which follow the
	// engines' pools as they fill (memory that grows with them is theirs).
	KVCopies float64 `json:"kv_directory_copies"`
}

// sampleEvery samples the orchestrator until the function it returns is
// called.
func (s *soak) sampleEvery(d time.Duration) func() {
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		for {
			select {
			case <-done:
				return
			case <-time.After(d):
			}
			s.mu.Lock()
			pid := s.orch
			s.mu.Unlock()
			if x, err := s.sample(); err == nil {
				x.at, x.pid = time.Now(), pid
				s.mu.Lock()
				s.samples = append(s.samples, x)
				s.mu.Unlock()
			}
		}
	}()
	return func() { close(done); <-finished }
}

// summarize takes the run's first and last figures after the warm-up, and
// each orchestrator process's warm and last ones.
func (s *soak) summarize(warm time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.samples) == 0 {
		s.t.Fatal("no samples of the orchestrator")
	}
	// One goroutine takes the samples, in time order.
	firstAt, lastAt := s.samples[0].at, s.samples[len(s.samples)-1].at
	within := func(from, to time.Time) []soakSample {
		var in []soakSample
		for _, x := range s.samples {
			if !x.at.Before(from) && x.at.Before(to) {
				in = append(in, x)
			}
		}
		return in
	}
	began, ended := within(s.soakStart, s.soakStart.Add(time.Minute)), within(lastAt.Add(-time.Minute), lastAt.Add(time.Second))
	if len(began) == 0 || len(ended) == 0 {
		s.t.Fatalf("no samples in the soak's first or last minute (%d, %d of %d)", len(began), len(ended), len(s.samples))
	}
	s.fig.Began, s.fig.Ended = median(began), median(ended)
	if w := within(firstAt.Add(time.Minute), firstAt.Add(2*time.Minute)); len(w) > 0 {
		s.fig.WarmupBegan = median(w)
	}
	for pid, start := range s.started {
		var early, late []soakSample
		var last time.Time
		for _, x := range s.samples {
			if x.pid == pid && x.at.After(last) {
				last = x.at
			}
		}
		for _, x := range s.samples {
			switch {
			case x.pid != pid:
			case x.at.After(start.Add(warm)) && x.at.Before(start.Add(warm+time.Minute)):
				early = append(early, x)
			case x.at.After(last.Add(-time.Minute)) && x.at.After(start.Add(warm+time.Minute)):
				late = append(late, x)
			}
		}
		if len(early) == 0 || len(late) == 0 {
			continue // too short a life to report
		}
		p := soakProcess{PID: pid, Ran: last.Sub(start).Round(time.Second).String(), BeganS: median(early), EndedS: median(late)}
		s.fig.Orchestrators = append(s.fig.Orchestrators, p)
	}
	slices.SortFunc(s.fig.Orchestrators, func(a, b soakProcess) int { return s.started[a.PID].Compare(s.started[b.PID]) })
}

// median is the median of each figure of xs.
func median(xs []soakSample) soakSample {
	pick := func(f func(soakSample) float64) float64 {
		v := make([]float64, len(xs))
		for i, x := range xs {
			v[i] = f(x)
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	return soakSample{RSSMB: pick(func(x soakSample) float64 { return x.RSSMB }),
		Goroutines: pick(func(x soakSample) float64 { return x.Goroutines }),
		HeapMB:     pick(func(x soakSample) float64 { return x.HeapMB }),
		KVCopies:   pick(func(x soakSample) float64 { return x.KVCopies })}
}

type soakFault struct {
	At         string  `json:"at"`
	What       string  `json:"what"`
	RecoveredS float64 `json:"serving_again_after_s"`
}

// sample reads the orchestrator's RSS, goroutines and heap from its
// router's /metrics.
func (s *soak) sample() (soakSample, error) {
	resp, err := http.Get(s.c.state.RouterURL + "/metrics")
	if err != nil {
		return soakSample{}, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out soakSample
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		v, _ := strconv.ParseFloat(f[1], 64)
		switch f[0] {
		case "process_resident_memory_bytes":
			out.RSSMB = v / (1 << 20)
		case "go_goroutines":
			out.Goroutines = v
		case "go_memstats_heap_inuse_bytes":
			out.HeapMB = v / (1 << 20)
		case "evolve_kv_directory_copies":
			out.KVCopies = v
		}
	}
	return out, nil
}

// recovered waits for every engine to serve again after the fault what,
// at addresses other than those in gone when given (a restarted engine
// listens on a new port), and notes how long it took.
func (s *soak) recovered(what string, since time.Time, gone map[string]bool) {
	s.t.Helper()
	wait.Until(s.t, 90*time.Second, "every node serving after "+what, func() bool {
		serving, fresh := 0, 0
		for _, n := range s.nodes() {
			if n["state"] == "serving" {
				serving++
				if !gone[fmt.Sprint(n["address"])] {
					fresh++
				}
			}
		}
		return serving == len(s.engines) && (gone == nil || fresh > 0)
	})
	f := soakFault{At: since.Format("15:04:05"), What: what, RecoveredS: time.Since(since).Seconds()}
	s.fig.Faults = append(s.fig.Faults, f)
	s.t.Logf("%s %s: every node serving after %.1f s", f.At, what, f.RecoveredS)
}

// nodes is the control API's node list.
func (s *soak) nodes() []map[string]any {
	var nodes []map[string]any
	getJSON(s.t, s.c.state.ControlURL+"/api/v1/nodes", &nodes)
	return nodes
}

func (s *soak) stopEngine(i int, d time.Duration) {
	pid := s.engines[i]
	syscall.Kill(pid, syscall.SIGSTOP)
	time.Sleep(d)
	syscall.Kill(pid, syscall.SIGCONT)
	start := time.Now() // recovery counts from its continuing
	s.recovered(fmt.Sprintf("engine %d stopped %v", i, d), start, nil)
}

func (s *soak) killEngine(i int) {
	before := map[string]bool{}
	for _, n := range s.nodes() {
		before[fmt.Sprint(n["address"])] = true
	}
	start := time.Now()
	s.engines[i] = s.restart(s.engines[i], fmt.Sprintf("engine-%d", i))
	// Serving: the three left, and the new process at a new address.
	s.recovered(fmt.Sprintf("engine %d killed", i), start, before)
}

func (s *soak) killOrchestrator() {
	start := time.Now()
	pid := s.restart(s.orch, "orchestrator")
	s.mu.Lock()
	s.orch, s.started[pid] = pid, start
	s.mu.Unlock()
	wait.Until(s.t, 60*time.Second, "the router back", func() bool {
		resp, err := http.Get(s.c.state.RouterURL + "/health")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == 200
	})
	s.recovered("orchestrator killed -9", start, nil)
}

// restart kills pid with SIGKILL and starts its command line again, in its
// environment, as a supervisor would; it returns the new pid.
func (s *soak) restart(pid int, name string) int {
	s.t.Helper()
	args := procStrings(s.t, pid, "cmdline")
	env := procStrings(s.t, pid, "environ")
	syscall.Kill(pid, syscall.SIGKILL)
	wait.Until(s.t, 10*time.Second, name+" gone", func() bool { return !cluster.Alive(pid) })
	cmd := exec.Command(evolveBin, args[1:]...)
	cmd.Env = env
	log, err := os.OpenFile(filepath.Join(s.logDir, name+".log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		s.t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	go func() { cmd.Wait(); log.Close() }()
	s.t.Cleanup(func() { cmd.Process.Signal(syscall.SIGTERM) })
	return cmd.Process.Pid
}

// procStrings is a process's NUL-separated /proc file (cmdline, environ).
func procStrings(t *testing.T, pid int, file string) []string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/%s", pid, file))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
}

// report logs the figures, writes them to $EVOLVE_SOAK_OUT, and holds the
// run to its bounds.
func (s *soak) report() {
	t, f := s.t, s.fig
	b, _ := json.MarshalIndent(f, "", "  ")
	t.Logf("soak figures:\n%s", b)
	if out := os.Getenv("EVOLVE_SOAK_OUT"); out != "" {
		if err := os.WriteFile(out, b, 0o644); err != nil {
			t.Error(err)
		}
	}
	num := func(k string) float64 { v, _ := f.Bench[k].(float64); return v }
	if num("requests_completed") == 0 {
		t.Fatal("no request completed")
	}
	// A call refused while the orchestrator restarts, or whose stream
	// broke off when it was killed, is sent again, as agents' clients do:
	// every call completes or is retried.
	if errs := num("errors"); errs > 0 {
		t.Errorf("%v calls failed (first: %v; last: %v)", errs, f.Bench["first_error"], f.Bench["last_error"])
	}
	// An engine hung past the stream idle time stalls no answer that long:
	// its node is marked down in seconds, and its answers go on elsewhere.
	if gap := num("longest_token_gap_s"); gap >= orchestrator.DefaultStreamIdle.Seconds() {
		t.Errorf("a stream waited %.1f s between two tokens: past the stream idle time (%v)", gap, orchestrator.DefaultStreamIdle)
	}
	for _, p := range f.Orchestrators {
		t.Logf("orchestrator %d (%s): RSS %.0f -> %.0f MB, goroutines %.0f -> %.0f, directory copies %.0f -> %.0f",
			p.PID, p.Ran, p.BeganS.RSSMB, p.EndedS.RSSMB, p.BeganS.Goroutines, p.EndedS.Goroutines, p.BeganS.KVCopies, p.EndedS.KVCopies)
		// A process grows back to the bounds the first reached warming
		// up, not past them: one that leaked in its life, even if a later
		// one did not, ends above.
		if p.EndedS.RSSMB > 1.1*f.Began.RSSMB {
			t.Errorf("orchestrator %d ended at %.0f MB, over 10%% above the soak's first minute (%.0f MB)", p.PID, p.EndedS.RSSMB, f.Began.RSSMB)
		}
	}
	t.Logf("warming up, from its second minute to the faults: RSS %.0f -> %.0f MB, directory copies %.0f -> %.0f",
		f.WarmupBegan.RSSMB, f.Began.RSSMB, f.WarmupBegan.KVCopies, f.Began.KVCopies)
	t.Logf("the soak, first minute -> last: RSS %.0f -> %.0f MB (%+.1f%%), goroutines %.0f -> %.0f (%+.1f%%)",
		f.Began.RSSMB, f.Ended.RSSMB, 100*(f.Ended.RSSMB/f.Began.RSSMB-1), f.Began.Goroutines, f.Ended.Goroutines, 100*(f.Ended.Goroutines/f.Began.Goroutines-1))
	if f.Ended.RSSMB > 1.1*f.Began.RSSMB {
		t.Errorf("the orchestrator's RSS grew from %.0f MB to %.0f MB", f.Began.RSSMB, f.Ended.RSSMB)
	}
	if f.Ended.Goroutines > 1.1*f.Began.Goroutines {
		t.Errorf("the orchestrator's goroutines grew from %.0f to %.0f", f.Began.Goroutines, f.Ended.Goroutines)
	}
}
