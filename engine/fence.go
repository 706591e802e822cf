package engine

import (
	"fmt"
	"sync"

	"github.com/evolvellm/evolve/protocol"
)

// fenceGuard refuses role commands of a leadership term older than one
// already seen (protocol.Fence): a planner leader that lost its lease (a
// paused process, a partition) and sends a switch late does not undo
// what the new leader decided.
type fenceGuard struct {
	mu     sync.Mutex
	lease  string
	term   uint64
	holder string
}

// admit says whether a command op sent under f may run, and records f's
// term when it is the newest seen. Commands other than role commands,
// and commands without a fence, always may.
func (g *fenceGuard) admit(op string, f *protocol.Fence) error {
	if f == nil || !protocol.RoleOp(op) {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if f.Lease == g.lease && f.Term < g.term {
		return fmt.Errorf("fenced: %s from %s's leadership term %d, which is over: %s leads in term %d", op, f.Holder, f.Term, g.holder, g.term)
	}
	g.lease, g.term, g.holder = f.Lease, f.Term, f.Holder
	return nil
}
