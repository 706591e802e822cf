package engine

import (
	"sync"
	"time"
)

// virtualClock maps wall time to the model's time: virtual time runs
// speedup times faster than the wall clock, from the moment it was made.
type virtualClock struct {
	mu      sync.Mutex
	wall0   time.Time
	virt0   time.Time
	speedup float64
}

func newVirtualClock(now time.Time, speedup float64) *virtualClock {
	return &virtualClock{wall0: now, virt0: now, speedup: speedup}
}

// Now is the current virtual time.
func (c *virtualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.virt0.Add(time.Duration(float64(time.Since(c.wall0)) * c.speedup))
}

// WallUntil is the wall time until virtual time t (0 if past).
func (c *virtualClock) WallUntil(t time.Time) time.Duration {
	d := t.Sub(c.Now())
	if d <= 0 {
		return 0
	}
	return time.Duration(float64(d) / c.speedup)
}
