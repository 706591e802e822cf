package orchestrator

import (
	"testing"
	"time"

	"github.com/evolvellm/evolve/internal/wait"
	"github.com/evolvellm/evolve/roles"
)

// A node marked down because it went silent (SIGSTOP, a stalled host)
// serves again once its heartbeats come back: the orchestrator asks it to
// register again, and it resyncs its KV.
func TestSilentNodeComesBackWhenItBeatsAgain(t *testing.T) {
	tc := startTestCluster(t, roles.Decode, roles.Decode)
	tc.o.markDown("e0", "no heartbeat for 3s", true)
	if st, _ := tc.o.NodeStatus("e0"); st.State != StateDown {
		t.Fatalf("e0 after markDown: %s", st.State)
	}
	wait.Until(t, 10*time.Second, "e0 serving again after its next heartbeats", func() bool {
		st, ok := tc.o.NodeStatus("e0")
		return ok && st.State == StateServing
	})
}

// A node that said goodbye stays down, whatever it still sends: it is
// stopping, and bringing it back would route requests into its shutdown.
func TestDeregisteredNodeStaysDown(t *testing.T) {
	tc := startTestCluster(t, roles.Decode, roles.Decode)
	tc.o.markDown("e0", "deregistered", false)
	time.Sleep(3 * time.Second) // three heartbeats
	if st, _ := tc.o.NodeStatus("e0"); st.State != StateDown {
		t.Fatalf("a deregistered node that still beats is %s", st.State)
	}
}

// The orchestrator's own slowness is not an engine's silence: while the
// cluster's lock is held (a router busy with a huge prompt) for longer
// than the heartbeat limit, heartbeats still arrive, and no node is
// marked down for the wait.
func TestHeldLockDoesNotMarkNodesDown(t *testing.T) {
	tc := startTestCluster(t, roles.Decode, roles.Decode)
	limit := time.Duration(tc.o.cfg.MissedHeartbeats) * time.Second
	tc.o.c.mu.Lock()
	time.Sleep(limit + 1500*time.Millisecond)
	tc.o.c.mu.Unlock()
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		for _, id := range []string{"e0", "e1"} {
			if st, _ := tc.o.NodeStatus(id); st.State != StateServing {
				t.Fatalf("%s is %s (%s) after the orchestrator held its lock", id, st.State, st.Reason)
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestSilenceIsJudgedByTheLatestSign(t *testing.T) {
	now := time.Unix(1000, 0)
	if silentSince(now.Add(-5*time.Second), now.Add(-time.Second), now, 3*time.Second) {
		t.Fatal("a node heard 1 s ago is silent")
	}
	if !silentSince(now.Add(-5*time.Second), now.Add(-4*time.Second), now, 3*time.Second) {
		t.Fatal("a node last heard 4 s ago is not silent with a 3 s limit")
	}
	var l liveness
	if !l.askAgain("e0", now) || l.askAgain("e0", now.Add(100*time.Millisecond)) || !l.askAgain("e0", now.Add(2*time.Second)) {
		t.Fatal("a down node that beats is asked to register at most once a heartbeat interval")
	}
}
