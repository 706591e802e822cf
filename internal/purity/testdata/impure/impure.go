// Package impure is the purity check's own test: what it must find.
package impure

import (
	"time"

	"github.com/evolvellm/evolve/internal/purity/testdata/impure/deep"
)

// Stamp reads the clock.
func Stamp() time.Time { return time.Now().Add(deep.Age) }
