package wait

import (
	"sync/atomic"
	"testing"
	"time"
)

// fakeT records a failure instead of stopping the test.
type fakeT struct {
	testing.TB
	failed atomic.Bool
}

func (f *fakeT) Helper() {}
func (f *fakeT) Fatalf(format string, args ...any) {
	f.failed.Store(true)
	panic("fatal") // as FailNow stops the goroutine
}

// Until returns once the condition holds, and fails a condition that
// never does after its timeout.
func TestEventuallyWaitsThenFails(t *testing.T) {
	n := 0
	Until(t, time.Second, "three looks", func() bool { n++; return n >= 3 })
	if n != 3 {
		t.Fatalf("looked %d times", n)
	}
	f := &fakeT{}
	start := time.Now()
	func() {
		defer func() { recover() }()
		Until(f, 100*time.Millisecond, "never", func() bool { return false })
	}()
	if !f.failed.Load() || time.Since(start) < 100*time.Millisecond {
		t.Fatalf("a condition that never holds: failed %v after %v", f.failed.Load(), time.Since(start))
	}
}
