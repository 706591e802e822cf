package vllm

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/evolvellm/evolve/engine/vllm/vllmtest"
	"github.com/evolvellm/evolve/internal/wait"
	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"
	"github.com/zeebo/xxh3"
)

// After a reconnect the subscriber tells the publisher it followed (its
// replay buffer holds our last message, byte for byte) from a new one.
func TestSamePublisher(t *testing.T) {
	ctx := context.Background()
	srv, err := vllmtest.Start(ctx, vllmtest.Options{}, "", "", "")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	resp, err := http.Post(srv.URL+"/v1/completions", "application/json",
		strings.NewReader(`{"prompt": "`+strings.Repeat("seen before ", 20)+`", "max_tokens": 1}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	s := &Subscriber{Endpoint: srv.Events, Replay: srv.Replay}
	got, err := s.fetchReplay(ctx, 0, 1)
	if err != nil || len(got) != 1 {
		t.Fatalf("replay: %v %v", got, err)
	}
	s.last, s.lastSum = 0, xxh3.Hash(got[0].payload)
	if !s.samePublisher(ctx) {
		t.Fatal("the same publisher not recognised")
	}
	s.lastSum++
	if s.samePublisher(ctx) {
		t.Fatal("another message at our sequence taken for ours")
	}
	s.lastSum--
	s.last = 5 // beyond what it published
	if s.samePublisher(ctx) {
		t.Fatal("a publisher without our sequence taken for ours")
	}
	s.last, s.Replay = 0, ""
	if s.samePublisher(ctx) {
		t.Fatal("without a replay endpoint nothing can be told")
	}
}

// llm-d-inference-sim numbers its messages from 1 and answers replay
// requests with the topic before the sequence: every start logged "KV
// events lost and not replayed ... sequence frame has 29 bytes, want 8"
// and started over. Its stream is now followed as vLLM's: no loss at the
// start, and a batch missed live is replayed.
func TestSubscriberFollowsAPublisherNumberingFromOne(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv, err := vllmtest.Start(ctx, vllmtest.Options{LLMDSim: true, Topic: "kv@localhost@fake/model"}, "", "", "")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	var mu sync.Mutex
	var batches, losses int
	var logs strings.Builder
	s := &Subscriber{Endpoint: srv.Events, Replay: srv.Replay, Log: slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &mu}, nil))}
	go s.Run(ctx, func(b Batch, lost bool) {
		mu.Lock()
		defer mu.Unlock()
		batches++
		if lost {
			losses++
		}
	})
	ask := func(i int) {
		resp, err := http.Post(srv.URL+"/v1/completions", "application/json",
			strings.NewReader(fmt.Sprintf(`{"prompt": "%d %s", "max_tokens": 1}`, i, strings.Repeat("a block or two ", 20))))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	// The first batches may go before the subscription is up: they are
	// replayed.
	for i := 0; ; i++ {
		ask(i)
		mu.Lock()
		n := batches
		mu.Unlock()
		if n > 0 {
			break
		}
		if i > 100 {
			t.Fatal("no batch arrived")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Every batch published so far arrives (live or replayed) before the
	// count is taken.
	wait.Until(t, 5*time.Second, "the first requests' batches", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return batches == srv.Stats().PublishedBatch
	})
	mu.Lock()
	before := batches
	mu.Unlock()
	srv.SkipNext(1) // a batch only the replay buffer has
	ask(1000)
	ask(1001)
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		n, l, text := batches, losses, logs.String()
		mu.Unlock()
		if l > 0 || strings.Contains(text, "lost") {
			t.Fatalf("%d batches, %d reported lost; log:\n%s", n, l, text)
		}
		if n >= before+2 && n == srv.Stats().PublishedBatch { // the skipped one too
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d batches after the skipped one; log:\n%s", n, text)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type lockedWriter struct {
	w  *strings.Builder
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// A server without vllm:request_prefill_kv_computed_tokens (older vLLM,
// llm-d-inference-sim) is measured over the prompt tokens it computed,
// less its prefix cache's hits: over all of them, an agent's cached
// context made its prefill look ten times cheaper than it is.
func TestScrapePrefillCostWithoutComputedTokens(t *testing.T) {
	ctx := context.Background()
	srv, err := vllmtest.Start(ctx, vllmtest.Options{}, "", "", "")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	context := strings.Repeat("the agent's long context ", 200)
	for i := range 5 {
		resp, err := http.Post(srv.URL+"/v1/completions", "application/json",
			strings.NewReader(fmt.Sprintf(`{"prompt": "%s turn %d", "max_tokens": 1}`, context, i)))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	l, err := ScrapeMetrics(ctx, http.DefaultClient, srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	// The fake spends 20 us on each token it computes.
	if us := l.PrefillSeconds / l.PrefillTokens * 1e6; us < 19 || us > 21 {
		t.Fatalf("measured %.1f us per prefill token (%.0f s over %.0f tokens), want 20", us, l.PrefillSeconds, l.PrefillTokens)
	}
}

// A publisher that connects to the agent, as llm-d-inference-sim's does,
// meets a subscriber that binds (--kv-events-bind); before, both sides
// dialled and no event ever arrived.
func TestSubscriberBindsForAPublisherThatConnects(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	endpoint := "tcp://" + ln.Addr().String()
	ln.Close()
	got := make(chan bool, 16)
	s := &Subscriber{Endpoint: endpoint, Bind: true, Log: slog.New(slog.DiscardHandler)}
	go s.Run(ctx, func(b Batch, lost bool) { got <- lost })
	pub := zmq4.NewPub(ctx, zmq4.WithDialerRetry(50*time.Millisecond), zmq4.WithDialerMaxRetries(-1))
	defer pub.Close()
	if err := pub.Dial(endpoint); err != nil {
		t.Fatal(err)
	}
	payload, _ := msgpack.Marshal([]any{1.0, []any{}, 0})
	deadline := time.After(10 * time.Second)
	for seq := uint64(1); ; seq++ {
		if err := pub.Send(zmq4.NewMsgFrom([]byte("kv@sim"), binary.BigEndian.AppendUint64(nil, seq), payload)); err != nil {
			t.Fatal(err)
		}
		select {
		case <-got:
			return
		case <-deadline:
			t.Fatal("no batch from a publisher that connects")
		case <-time.After(100 * time.Millisecond):
		}
	}
}
