// Package deep imports os, as an impure dependency would.
package deep

import (
	"os"
	"time"
)

// Age reads the clock.
var Age = time.Since(time.Unix(0, 0)) + time.Duration(os.Getpid())
