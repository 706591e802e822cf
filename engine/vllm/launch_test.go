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
