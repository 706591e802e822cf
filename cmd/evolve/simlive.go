package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/evolvellm/evolve/sim/live"
)

// serveLive starts the control API of evolve sim --live on addr and says
// how to watch it; stop shuts it down.
func serveLive(errw io.Writer, addr string, policies []string, model string, pace float64) (*live.Server, func(), error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("--live %s: %w", addr, err)
	}
	srv := live.New(policies, model, pace)
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintf(errw, "--live: %v\n", err)
		}
	}()
	base := "http://" + ln.Addr().String()
	urls := make([]string, len(policies))
	for i, p := range policies {
		urls[i] = base + live.Path(p)
	}
	how := fmt.Sprintf("  evolve top --readonly --server %s", urls[0])
	if len(urls) > 1 {
		how += fmt.Sprintf("\nside by side:\n  evolve top --readonly --server %s --beside %s", urls[0], urls[1])
	}
	paced := "as fast as they run"
	if pace > 0 {
		paced = fmt.Sprintf("%g modelled seconds per second", pace)
	}
	fmt.Fprintf(errw, "serving the simulations live at %s/ (%s): %s\nwatch with:\n%s\n", base, paced, strings.Join(urls, ", "), how)
	stop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = hs.Shutdown(ctx)
	}
	return srv, stop, nil
}

// holdLive keeps the final state served until the operator interrupts.
func holdLive(ctx context.Context, errw io.Writer) {
	if ctx.Err() != nil {
		return // interrupted already
	}
	ctx, cancel := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer cancel()
	fmt.Fprintln(errw, "simulations done; their final state is still served (Ctrl-C stops)")
	<-ctx.Done()
}
