package main

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/viper"
)

// FuzzConfigFile reads arbitrary config files as evolve orchestrator
// would: none may panic it, and a refused one says where the fault is
// (the file, or the flag its value was for).
func FuzzConfigFile(f *testing.F) {
	for _, s := range []string{
		"orchestrator:\n  policy: evolve\n  max-connections: 10\n  body-timeout: 5s\n",
		"orchestrator:\n  api-key: [a, b]\n  model-alias: {x: y}\n",
		"orchestrator:\n  body-timeout: 5\n  missed-heartbeats: many\n",
		"orchestrator: [1, 2]\nlog-level: loud\n",
		"a: &a [*a, *a]\n",
		"log-format: json\nengine:\n  speedup: 1e400\n",
		"\t- not yaml: [\n",
		"orchestrator:\n  orchestrator:\n    orchestrator: {}\n",
	} {
		f.Add([]byte(s))
	}
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, file []byte) {
		path := filepath.Join(dir, "config.yaml")
		if err := os.WriteFile(path, file, 0o600); err != nil {
			t.Fatal(err)
		}
		saved, log := config, slog.Default()
		defer func() { config = saved; slog.SetDefault(log) }()
		config = viper.New()
		cmd, _, err := newRootCmd().Find([]string{"orchestrator"})
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.ParseFlags([]string{"--config", path}); err != nil {
			t.Fatal(err)
		}
		err = loadConfigWarning(cmd, io.Discard)
		if err != nil && !strings.Contains(err.Error(), path) && !strings.Contains(err.Error(), "--") {
			t.Fatalf("a refused config file: %q says neither the file nor the flag", err)
		}
	})
}
