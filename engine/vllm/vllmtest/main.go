package vllmtest

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

// Main runs the fake as a process, with vLLM's command line:
// serve MODEL [--host H] [--port P] [--kv-events-config JSON]
// [--served-model-name NAME] [--map-events]
// [--forward-pass-metrics-port P]; other flags are accepted and ignored.
// With FAKE_VLLM_ARGS_FILE set it writes its arguments there (one per
// line) first. It serves until SIGTERM or SIGINT and
// returns the exit code.
func Main(args []string) int {
	if f := os.Getenv("FAKE_VLLM_ARGS_FILE"); f != "" {
		_ = os.WriteFile(f, []byte(strings.Join(args, "\n")+"\n"), 0o644)
	}
	if len(args) < 2 || args[0] != "serve" {
		fmt.Fprintln(os.Stderr, "usage: serve MODEL [flags]")
		return 2
	}
	opts := Options{Model: args[1], APIKey: os.Getenv("VLLM_API_KEY")}
	host, port := "127.0.0.1", "8000"
	events, replay := "tcp://127.0.0.1:5557", ""
	for i := 2; i < len(args); i++ {
		next := func() string {
			if i+1 < len(args) {
				i++
				return args[i]
			}
			return ""
		}
		switch args[i] {
		case "--host":
			host = next()
		case "--port":
			port = next()
		case "--served-model-name":
			opts.Model = next()
		case "--api-key":
			opts.APIKey = next()
		case "--map-events":
			opts.MapEvents = true
		case "--forward-pass-metrics-port":
			if p := next(); p != "0" {
				opts.PassMetrics = "tcp://0.0.0.0:" + p
			}
		case "--kv-events-config":
			var cfg struct {
				Endpoint string `json:"endpoint"`
				Replay   string `json:"replay_endpoint"`
				Topic    string `json:"topic"`
			}
			if err := json.Unmarshal([]byte(next()), &cfg); err != nil {
				fmt.Fprintln(os.Stderr, "--kv-events-config:", err)
				return 2
			}
			events, replay, opts.Topic = bindable(cfg.Endpoint), bindable(cfg.Replay), cfg.Topic
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	s, err := Start(ctx, opts, net.JoinHostPort(host, port), events, replay)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "INFO fake vLLM serving %s at %s, KV events at %s\n", opts.Model, s.URL, s.Events)
	<-ctx.Done()
	s.Close()
	return 0
}

// bindable turns vLLM's "tcp://*:5557" into an address Go listens on.
func bindable(ep string) string {
	return strings.Replace(ep, "tcp://*:", "tcp://0.0.0.0:", 1)
}
