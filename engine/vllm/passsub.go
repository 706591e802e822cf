package vllm

import (
	"context"
	"fmt"
	"log/slog"
	"time"
)

// PassSubscriber follows vLLM's forward-pass metrics stream (a ZMQ PUB
// socket, --forward-pass-metrics-port: frames topic, 8-byte sequence,
// msgpack payload). A lost message is a lost sample, nothing more: the
// stream has no replay, and the planner needs no pass but many.
type PassSubscriber struct {
	Endpoint string // e.g. tcp://10.0.0.5:20380
	Log      *slog.Logger

	warned bool // an undecodable message was logged
}

// Run calls handle for every pass (heartbeats included) with the time it
// arrived, until ctx ends; it connects again when the stream breaks.
func (s *PassSubscriber) Run(ctx context.Context, handle func(fp ForwardPass, at time.Time)) {
	if s.Log == nil {
		s.Log = slog.Default()
	}
	for {
		err := s.follow(ctx, handle)
		if ctx.Err() != nil {
			return
		}
		s.Log.Warn("forward-pass metrics stream broke; connecting again", "endpoint", s.Endpoint, "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

func (s *PassSubscriber) follow(ctx context.Context, handle func(ForwardPass, time.Time)) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sub, err := dialSub(ctx, s.Endpoint, "", "forward-pass metrics")
	if err != nil {
		return err
	}
	defer sub.Close()
	for {
		msg, err := sub.Recv()
		if err != nil {
			return fmt.Errorf("receive forward-pass metrics from %s: %w", s.Endpoint, err)
		}
		at := time.Now()
		if len(msg.Frames) == 0 {
			continue
		}
		fp, err := DecodeForwardPass(msg.Frames[len(msg.Frames)-1])
		if err != nil {
			if !s.warned {
				s.warned = true
				s.Log.Warn("forward-pass metrics unreadable; such messages are skipped (logged once)", "endpoint", s.Endpoint, "err", err)
			}
			continue
		}
		handle(fp, at)
	}
}
