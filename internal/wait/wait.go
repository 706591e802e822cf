// Package wait is how evolve's tests wait for a condition: polling it
// until it holds or a timeout passes, never sleeping a fixed time.
package wait

import (
	"testing"
	"time"
)

// PollEvery is how often Until looks again.
const PollEvery = 20 * time.Millisecond

// Until calls cond every PollEvery until it returns true, and fails
// the test, naming what it waited for, if that takes longer than timeout.
func Until(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(PollEvery)
	}
}
