package orchestrator

import (
	"context"
	"net"
	"testing"
	"time"
)

// An orchestrator restarted at once may find its event plane's port still
// held for a moment: it retries binding rather than fail.
func TestEmbeddedNATSWaitsForItsPort(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	o, err := New(Config{RouterAddr: "127.0.0.1:0", ControlAddr: "127.0.0.1:0", NATSListen: addr, DataDir: t.TempDir(), PlannerMode: PlannerOff})
	if err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(time.Second, func() { ln.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- o.Run(ctx, func() { close(ready) }) }()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("the orchestrator gave up on its busy port: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("not ready in 20 s")
	}
	if o.NATSURL() != "nats://"+addr {
		t.Fatalf("event plane at %s, want %s", o.NATSURL(), addr)
	}
	cancel()
	<-done
}

// A port picked for port 0 is kept in the data directory and taken again.
func TestEmbeddedNATSKeepsAPickedPort(t *testing.T) {
	dir := t.TempDir()
	run := func() string {
		o, err := New(Config{RouterAddr: "127.0.0.1:0", ControlAddr: "127.0.0.1:0", NATSListen: "127.0.0.1:0", DataDir: dir, PlannerMode: PlannerOff})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		ready := make(chan struct{})
		done := make(chan error, 1)
		go func() { done <- o.Run(ctx, func() { close(ready) }) }()
		select {
		case <-ready:
		case err := <-done:
			t.Fatal(err)
		}
		url := o.NATSURL()
		cancel()
		<-done
		return url
	}
	first, second := run(), run()
	if first != second {
		t.Fatalf("first run on %s, the next on %s", first, second)
	}
}
