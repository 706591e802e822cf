package vllm

import (
	"fmt"
	"strings"
	"testing"
)

// A vLLM command line schedules by priority only when it says so, in
// either form of the flag.
func TestPriorityScheduling(t *testing.T) {
	for i, tc := range []struct {
		command []string
		want    bool
	}{
		{[]string{"vllm", "serve", "m", "--scheduling-policy", "priority"}, true},
		{[]string{"vllm", "serve", "m", "--scheduling-policy=priority"}, true},
		{[]string{"vllm", "serve", "m", "--scheduling-policy", "fcfs"}, false},
		{[]string{"vllm", "serve", "m"}, false},
		{[]string{"vllm", "serve", "m", "--scheduling-policy"}, false},
	} {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			if got := PriorityScheduling(tc.command); got != tc.want {
				t.Errorf("%q: %v, want %v", tc.command, got, tc.want)
			}
		})
	}
}

func TestParallelSizes(t *testing.T) {
	for _, c := range []struct {
		args []string
		want int
		bad  string
	}{
		{[]string{"serve", "m"}, 1, ""},
		{[]string{"serve", "m", "--tensor-parallel-size", "4"}, 4, ""},
		{[]string{"serve", "m", "-tp", "2", "-pp=2"}, 4, ""},
		{[]string{"serve", "m", "--tensor-parallel-size=2", "--data-parallel-size", "4"}, 8, ""},
		{[]string{"serve", "m", "-tp", "0"}, 0, "-tp 0"},
		{[]string{"serve", "m", "--pipeline-parallel-size", "x"}, 0, "--pipeline-parallel-size x"},
	} {
		t.Run(c.bad, func(t *testing.T) {
			if tp, pp, dp, bad := ParallelSizes(c.args); tp*pp*dp != c.want || bad != c.bad {
				t.Errorf("%v: %d GPUs %q, want %d %q", c.args, tp*pp*dp, bad, c.want, c.bad)
			}
		})
	}
}

// The started server publishes forward-pass metrics where its command
// says, or where the agent's port says when the command does not; without
// either it is not asked to (older releases refuse the flag).
func TestPassMetricsEndpoint(t *testing.T) {
	for _, c := range []struct {
		command []string
		port    int
		want    string
		bad     bool
	}{
		{[]string{"vllm", "serve", "m"}, 0, "", false},
		{[]string{"vllm", "serve", "m"}, 20380, "tcp://127.0.0.1:20380", false},
		{[]string{"vllm", "serve", "m", "--forward-pass-metrics-port", "20400"}, 20380, "tcp://127.0.0.1:20400", false},
		{[]string{"vllm", "serve", "m", "--forward-pass-metrics-port=0"}, 20380, "", false},
		{[]string{"vllm", "serve", "m", "--forward-pass-metrics-port", "many"}, 0, "", true},
	} {
		t.Run(c.want, func(t *testing.T) {
			l := Launch{Command: c.command, PassMetricsPort: c.port}
			got, err := l.PassMetricsEndpoint()
			if got != c.want || (err != nil) != c.bad {
				t.Errorf("%q with port %d: %q, %v; want %q", c.command, c.port, got, err, c.want)
			}
			n := 0
			for _, a := range l.Args() {
				if strings.HasPrefix(a, "--forward-pass-metrics-port") {
					n++
				}
			}
			if n > 1 {
				t.Errorf("%q with port %d: the flag given %d times: %q", c.command, c.port, n, l.Args())
			}
		})
	}
}

// The scheduler's limits come from the command when it gives them.
func TestSchedulerLimits(t *testing.T) {
	for i, c := range []struct {
		command      []string
		seqs, tokens int
	}{
		{[]string{"vllm", "serve", "m"}, 0, 0},
		{[]string{"vllm", "serve", "m", "--max-num-seqs", "64", "--max-num-batched-tokens=16384"}, 64, 16384},
		{[]string{"vllm", "serve", "m", "--max-num-seqs", "lots"}, 0, 0},
	} {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			if s, tk := SchedulerLimits(c.command); s != c.seqs || tk != c.tokens {
				t.Errorf("%q: %d seqs, %d tokens; want %d, %d", c.command, s, tk, c.seqs, c.tokens)
			}
		})
	}
}
