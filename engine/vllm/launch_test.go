package vllm

import "testing"

// A vLLM command line schedules by priority only when it says so, in
// either form of the flag.
func TestPriorityScheduling(t *testing.T) {
	for _, tc := range []struct {
		command []string
		want    bool
	}{
		{[]string{"vllm", "serve", "m", "--scheduling-policy", "priority"}, true},
		{[]string{"vllm", "serve", "m", "--scheduling-policy=priority"}, true},
		{[]string{"vllm", "serve", "m", "--scheduling-policy", "fcfs"}, false},
		{[]string{"vllm", "serve", "m"}, false},
		{[]string{"vllm", "serve", "m", "--scheduling-policy"}, false},
	} {
		if got := PriorityScheduling(tc.command); got != tc.want {
			t.Errorf("%q: %v, want %v", tc.command, got, tc.want)
		}
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
		if tp, pp, dp, bad := ParallelSizes(c.args); tp*pp*dp != c.want || bad != c.bad {
			t.Errorf("%v: %d GPUs %q, want %d %q", c.args, tp*pp*dp, bad, c.want, c.bad)
		}
	}
}
