package vllm

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/evolvellm/evolve/engine/vllm/vllmtest"
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
