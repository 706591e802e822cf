package orchestrator

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/evolvellm/evolve/internal/wait"
	"github.com/evolvellm/evolve/roles"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// The router's queue serves in arrival order: while busy, requests wait
// behind each other; a kick lets the head look again; a client that
// leaves gives up its place and the one behind it moves up.
func TestRouterQueueIsFirstComeFirstServed(t *testing.T) {
	q := newRouterQueue()
	var busy atomic.Bool
	release, waited, err := q.wait(context.Background(), busy.Load)
	if waited || err != nil {
		t.Fatalf("an idle queue held a request: %v %v", waited, err)
	}
	release()
	busy.Store(true)
	var mu sync.Mutex
	var order []int
	var wg sync.WaitGroup
	gone, leave := context.WithCancel(context.Background())
	for i := range 4 {
		ctx := context.Background()
		if i == 1 {
			ctx = gone // this client leaves while it waits
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			release, _, err := q.wait(ctx, busy.Load)
			if err != nil {
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			release() // routed: the next may go
		}()
		wait.Until(t, 5*time.Second, fmt.Sprintf("request %d queued", i), func() bool {
			q.mu.Lock()
			defer q.mu.Unlock()
			return len(q.waiting) == i+1
		})
	}
	leave()
	wait.Until(t, 5*time.Second, "the client that left out of the queue", func() bool {
		q.mu.Lock()
		defer q.mu.Unlock()
		return len(q.waiting) == 3
	})
	busy.Store(false)
	q.kick()
	wg.Wait()
	if fmt.Sprint(order) != "[0 2 3]" {
		t.Fatalf("served in order %v, want [0 2 3]", order)
	}
}

// A cluster routed as Dynamo routes queues requests at the router while
// its prefill engine holds more than 16 times its max_num_batched_tokens
// of prefill, and serves every one of them; evolve's router does not
// queue.
func TestDynamoRouterQueuesPastItsThreshold(t *testing.T) {
	for _, policy := range []string{"dynamo", "evolve"} {
		t.Run(policy, func(t *testing.T) {
			tc := startTestClusterWith(t, Config{Policy: policy, PlannerMode: PlannerOff}, nil, roles.Prefill, roles.Decode)
			// tiny: 1,024 batched tokens, so 16,384 tokens of prefill in
			// flight make the prefill engine busy; 40 prompts of about
			// 1,000 tokens arrive at once.
			var wg sync.WaitGroup
			var failed atomic.Int32
			for i := range 40 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					body := fmt.Sprintf(`{"prompt": %q, "max_tokens": 4}`, strings.Repeat(fmt.Sprintf("agent %d reads a long file ", i), 180))
					resp, err := http.Post(tc.o.RouterURL()+"/v1/completions", "application/json", strings.NewReader(body))
					if err != nil {
						failed.Add(1)
						return
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 200 {
						failed.Add(1)
					}
				}()
			}
			wg.Wait()
			queued := testutil.ToFloat64(tc.o.met.routerQueued)
			if failed.Load() != 0 {
				t.Fatalf("%d of 40 requests failed", failed.Load())
			}
			if policy == "dynamo" && queued == 0 || policy == "evolve" && queued != 0 {
				t.Fatalf("%s: %v requests queued at the router", policy, queued)
			}
			t.Logf("%s: %v of 40 requests queued at the router", policy, queued)
		})
	}
}

// A request keeps its turn until it is routed: the one behind it does not
// look while the first's load is not yet the policy's, so one freed slot
// lets one request through, not the whole queue.
func TestRouterQueueTurnLastsUntilRouted(t *testing.T) {
	q := newRouterQueue()
	notBusy := func() bool { return false }
	first, _, err := q.wait(context.Background(), notBusy)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan struct{})
	go func() {
		release, _, _ := q.wait(context.Background(), notBusy)
		close(got)
		release()
	}()
	wait.Until(t, 5*time.Second, "the second request queued", func() bool {
		q.mu.Lock()
		defer q.mu.Unlock()
		return len(q.waiting) == 2
	})
	select {
	case <-got:
		t.Fatal("the second request went on before the first was routed")
	case <-time.After(50 * time.Millisecond):
	}
	first()
	first() // released twice: once counts
	select {
	case <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("the second request never got its turn")
	}
}
