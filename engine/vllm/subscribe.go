package vllm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/zeebo/xxh3"
)

// replayTimeout bounds one replay request.
const replayTimeout = 3 * time.Second

// Subscriber reads the KV event stream vLLM publishes with
// --kv-events-config (a ZMQ PUB socket, as vLLM's docs on KV events describe it: each
// message is topic, 8-byte big-endian sequence, msgpack payload). It
// detects lost messages by their sequence numbers and asks the replay
// endpoint for them; what cannot be replayed is reported as lost so that
// the caller starts over from a clean state.
type Subscriber struct {
	Endpoint string // where vLLM publishes, e.g. tcp://10.0.0.5:5557
	Replay   string // its replay endpoint, e.g. tcp://10.0.0.5:5558; "" for none
	Topic    string // topic prefix to subscribe to; "" for all
	// Bind listens on Endpoint for a publisher that connects to the
	// agent (llm-d-inference-sim's), where vLLM's binds and the agent
	// connects.
	Bind bool
	Log  *slog.Logger

	last    int64  // sequence of the last message handled; -1 before the first
	lastSum uint64 // XXH3 of its payload
}

// Handler receives batches in sequence order. lost says events were lost
// just before this batch (a gap nothing could replay, or the publisher
// restarted): the state built from earlier batches is no longer right.
type Handler func(b Batch, lost bool)

// Run subscribes and calls handle for every batch until ctx ends. A
// batch that cannot be decoded counts as lost. When the stream breaks
// (vLLM restarted, the network dropped) it connects again, and what was
// lost meanwhile is replayed or reported as lost.
func (s *Subscriber) Run(ctx context.Context, handle Handler) error {
	if s.Log == nil {
		s.Log = slog.Default()
	}
	s.last = -1
	lostNext := false
	for {
		err := s.follow(ctx, handle, &lostNext)
		if ctx.Err() != nil {
			return nil
		}
		s.Log.Warn("KV event stream broke; connecting again", "endpoint", s.Endpoint, "err", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Second):
		}
	}
}

// follow reads one connection's messages until it fails.
func (s *Subscriber) follow(ctx context.Context, handle Handler, lostNext *bool) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var sub zmq4.Socket
	var err error
	if s.Bind {
		sub, err = bindSub(ctx, s.Endpoint, s.Topic)
	} else {
		sub, err = dialSub(ctx, s.Endpoint, s.Topic, "KV events")
	}
	if err != nil {
		return err
	}
	defer sub.Close()
	if s.last >= 0 && !s.samePublisher(ctx) {
		// A new vLLM (a restart) numbers from 0 again, and may be past
		// our last sequence by now: its numbers mean nothing to us.
		s.Log.Info("vLLM's KV event publisher restarted; starting over", "endpoint", s.Endpoint)
		s.last, *lostNext = -1, true
	}
	for {
		msg, err := sub.Recv()
		if err != nil {
			return fmt.Errorf("receive KV events from %s: %w", s.Endpoint, err)
		}
		seqFrame, payload, err := frames(msg.Frames)
		if err != nil {
			s.Log.Warn("malformed KV event message", "err", err)
			*lostNext = true
			continue
		}
		seq, err := seqOf(seqFrame)
		if err != nil {
			s.Log.Warn("malformed KV event message", "err", err)
			*lostNext = true
			continue
		}
		if s.last >= 0 && seq <= s.last {
			// The sequence went back: vLLM restarted, with an empty cache.
			// Start over, with what the new one published before we joined.
			s.Log.Info("vLLM's KV event sequence restarted", "from", s.last, "to", seq)
			s.last, *lostNext = -1, true
		}
		if s.last < 0 && seq == 1 && s.Replay == "" {
			// The first message is 1: a publisher that numbers from 1
			// (llm-d-inference-sim), or a vLLM whose message 0 went before
			// any request; without a replay endpoint there is no telling,
			// and nothing to resynchronise yet.
			s.last = 0
		}
		if seq > s.last+1 {
			*lostNext = !s.replay(ctx, s.last+1, seq, handle, *lostNext)
		}
		s.handle(seq, payload, handle, lostNext)
	}
}

// dialSub subscribes to the messages of topic (a prefix; "" for all) that
// vLLM publishes at endpoint; what names the stream in errors. The socket
// keeps dialling until vLLM listens, and closes when ctx ends.
func dialSub(ctx context.Context, endpoint, topic, what string) (zmq4.Socket, error) {
	sub := zmq4.NewSub(ctx, zmq4.WithDialerRetry(500*time.Millisecond), zmq4.WithDialerMaxRetries(-1))
	if err := sub.SetOption(zmq4.OptionSubscribe, topic); err != nil {
		sub.Close()
		return nil, fmt.Errorf("subscribe to %s: %w", endpoint, err)
	}
	if err := sub.Dial(endpoint); err != nil {
		sub.Close()
		return nil, fmt.Errorf("connect to vLLM's %s at %s: %w", what, endpoint, err)
	}
	return sub, nil
}

// bindSub listens on endpoint for a KV event publisher that connects, and
// subscribes to topic.
func bindSub(ctx context.Context, endpoint, topic string) (zmq4.Socket, error) {
	sub := zmq4.NewSub(ctx)
	if err := sub.SetOption(zmq4.OptionSubscribe, topic); err != nil {
		sub.Close()
		return nil, fmt.Errorf("subscribe on %s: %w", endpoint, err)
	}
	if err := sub.Listen(endpoint); err != nil {
		sub.Close()
		return nil, fmt.Errorf("listen for KV events on %s: %w", endpoint, err)
	}
	return sub, nil
}

// samePublisher says whether the publisher reached after a reconnect is
// the one followed before: its replay buffer still holds our last message,
// byte for byte. Without a replay endpoint it cannot tell, and says no.
func (s *Subscriber) samePublisher(ctx context.Context) bool {
	if s.Replay == "" {
		return false
	}
	got, err := s.fetchReplay(ctx, s.last, s.last+1)
	return err == nil && len(got) == 1 && got[0].seq == s.last && xxh3.Hash(got[0].payload) == s.lastSum
}

// handle decodes one message and passes it on.
func (s *Subscriber) handle(seq int64, payload []byte, handle Handler, lost *bool) {
	s.last, s.lastSum = seq, xxh3.Hash(payload)
	b, unknown, err := DecodeBatch(payload)
	if err != nil {
		s.Log.Warn("undecodable KV event batch; resynchronising", "seq", seq, "err", err)
		*lost = true
		return
	}
	if unknown > 0 {
		s.Log.Debug("KV events of unknown types skipped", "count", unknown)
	}
	handle(b, *lost)
	*lost = false
}

// frames splits a message into its sequence and payload frames: three
// frames (topic, sequence, payload) as vLLM sends, or two without topic.
func frames(fs [][]byte) ([]byte, []byte, error) {
	switch len(fs) {
	case 3:
		return fs[1], fs[2], nil
	case 2:
		return fs[0], fs[1], nil
	}
	return nil, nil, fmt.Errorf("KV event message has %d frames, want 3", len(fs))
}

// replay asks the replay endpoint for messages from..until-1 and handles
// them in order. It reports whether all of them came.
func (s *Subscriber) replay(ctx context.Context, from, until int64, handle Handler, lost bool) bool {
	if s.Replay == "" {
		s.Log.Warn("KV events lost and no replay endpoint; resynchronising", "from", from, "until", until)
		return false
	}
	got, err := s.fetchReplay(ctx, from, until)
	if err == nil && from == 0 && ((len(got) == 0 && until == 1) || (len(got) > 0 && got[0].seq == 1)) {
		// A publisher that numbers from 1 (llm-d-inference-sim): there
		// is no message 0 to miss.
		if from = 1; from == until {
			return !lost
		}
	}
	if err != nil || len(got) == 0 || got[0].seq != from {
		s.Log.Warn("KV events lost and not replayed; resynchronising", "from", from, "until", until, "err", err)
		return false
	}
	for i, m := range got {
		if i > 0 && m.seq != got[i-1].seq+1 {
			s.Log.Warn("replay has a gap; resynchronising", "at", got[i-1].seq+1)
			return false
		}
	}
	if got[len(got)-1].seq != until-1 {
		s.Log.Warn("replay ended early; resynchronising", "last", got[len(got)-1].seq, "want", until-1)
		return false
	}
	for _, m := range got {
		s.handle(m.seq, m.payload, handle, &lost)
	}
	return !lost
}

type replayed struct {
	seq     int64
	payload []byte
}

// fetchReplay sends vLLM's replay request (an 8-byte start sequence) from a
// DEALER socket and reads [seq, payload] replies until the end marker (-1)
// or until.
func (s *Subscriber) fetchReplay(ctx context.Context, from, until int64) ([]replayed, error) {
	ctx, cancel := context.WithTimeout(ctx, replayTimeout)
	defer cancel()
	d := zmq4.NewDealer(ctx, zmq4.WithDialerMaxRetries(3), zmq4.WithDialerRetry(100*time.Millisecond))
	defer d.Close()
	if err := d.Dial(s.Replay); err != nil {
		return nil, err
	}
	start := binary.BigEndian.AppendUint64(nil, uint64(from))
	if err := d.SendMulti(zmq4.NewMsgFrom([]byte{}, start)); err != nil {
		return nil, fmt.Errorf("send replay request: %w", err)
	}
	var out []replayed
	for {
		msg, err := d.Recv()
		if err != nil {
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return out, fmt.Errorf("replay did not finish within %s", replayTimeout)
			}
			return out, err
		}
		fs := msg.Frames
		if len(fs) > 0 && len(fs[0]) == 0 {
			fs = fs[1:] // the delimiter
		}
		if len(fs) == 3 || (len(fs) == 2 && len(fs[0]) != 8) {
			// A topic before the sequence, as the live stream has it
			// (llm-d-inference-sim answers so; vLLM does not): a
			// sequence is 8 bytes.
			fs = fs[1:]
		}
		if len(fs) < 1 {
			continue
		}
		seq, err := seqOf(fs[0])
		if err != nil {
			return out, err
		}
		if seq < 0 {
			return out, nil
		}
		if seq >= until {
			continue // the live stream delivers it
		}
		if len(fs) < 2 {
			return out, fmt.Errorf("replayed message %d has no payload", seq)
		}
		if seq >= from {
			out = append(out, replayed{seq, fs[1]})
		}
	}
}
