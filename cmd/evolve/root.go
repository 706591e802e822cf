package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/spf13/viper"
)

// config holds the merged configuration: flag > EVOLVE_* environment >
// config file > default. A command's flag --name has the key "<command>.name"
// (environment EVOLVE_<COMMAND>_NAME); global flags have their bare name.
var config = viper.New()

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "evolve",
		Short: "Serve LLMs to fleets of agents, fitted to their traffic at run time",
		Long: `evolve is a control plane that serves LLMs to agent fleets. Its engines are
symmetric (they switch between prefill and decode without a restart), share
one host-memory KV pool, and follow the agents' sessions and branches.

Configuration comes from flags, then EVOLVE_* environment variables, then the
config file ($XDG_CONFIG_HOME/evolve/config.yaml, or --config), then defaults.
A command's flag --name is the key "<command>.name" in the file and
EVOLVE_<COMMAND>_NAME in the environment, for example:

  # ~/.config/evolve/config.yaml
  engine:
    profile: gb300-kimi-k2
    speedup: 10

  EVOLVE_ENGINE_LISTEN=0.0.0.0:8000 evolve engine

Values from the file and the environment are checked as the flag checks
them (a duration needs its unit: 10m); a list in the file sets a
comma-separated flag; a key no command reads is named on stderr.

Exit codes: 0 ok, 1 error, 2 usage error, 3 partial failure.`,
		SilenceUsage:      true,
		SilenceErrors:     true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error { return loadConfig(cmd) },
	}
	root.PersistentFlags().String("config", "", "config file (default $XDG_CONFIG_HOME/evolve/config.yaml)")
	root.PersistentFlags().String("log-level", "info", "log level: debug, info, warn, error")
	root.PersistentFlags().String("log-format", "text", "log format on stderr: text or json")
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error { return usageError{cmd: c.CommandPath(), err: err} })
	root.AddCommand(newVersionCmd(), newEngineCmd(), newOrchestratorCmd(), newUpCmd(), newDownCmd(), newStatusCmd(), newNodesCmd(), newRoleCmd(), newBenchCmd(), newSimCmd(), newPlannerCmd(), newBranchesCmd(), newKVCmd(), newTopCmd(), newLogsCmd(), newMonitoringCmd())
	registerCompletions(root)
	return root
}

// loadConfig reads the config file and binds the environment and the
// command's flags, then sets up logging.
func loadConfig(cmd *cobra.Command) error { return loadConfigWarning(cmd, os.Stderr) }

// loadConfigWarning is loadConfig, naming the file's unknown keys on w.
func loadConfigWarning(cmd *cobra.Command, w io.Writer) error {
	config.SetEnvPrefix("EVOLVE")
	config.SetEnvKeyReplacer(envKeys)
	config.AutomaticEnv()
	path, explicit := config.GetString("config"), false
	if f := cmd.Flags().Lookup("config"); f != nil && f.Changed {
		path, explicit = f.Value.String(), true
	} else if env := os.Getenv("EVOLVE_CONFIG"); env != "" {
		path, explicit = env, true
	}
	if path == "" {
		dir := os.Getenv("XDG_CONFIG_HOME")
		if dir == "" {
			if home, err := os.UserHomeDir(); err == nil {
				dir = filepath.Join(home, ".config")
			}
		}
		path = filepath.Join(dir, "evolve", "config.yaml")
	}
	config.SetConfigFile(path)
	read := true
	if err := config.ReadInConfig(); err != nil {
		if explicit || !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("config file %s: %w", path, err)
		}
		read = false
	}
	var bindErr error
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if err := config.BindPFlag(flagKey(cmd, f), f); err != nil && bindErr == nil {
			bindErr = err
		}
	})
	if bindErr != nil {
		return bindErr
	}
	if read {
		warnUnknownConfigKeys(cmd.Root(), path, w)
	}
	if err := applyConfigToFlags(cmd, path); err != nil {
		return usageError{cmd: cmd.CommandPath(), err: err}
	}
	return setupLogging()
}

// cfgKey is the config prefix of a command's flags: its path below the
// root, dotted ("engine", "role.set").
func cfgKey(cmd *cobra.Command) string {
	parts := strings.Fields(cmd.CommandPath())
	return strings.Join(parts[1:], ".")
}

func setupLogging() error {
	var level slog.Level
	if err := level.UnmarshalText([]byte(config.GetString("log-level"))); err != nil {
		return usageError{cmd: "evolve", err: fmt.Errorf("--log-level: %w", err)}
	}
	opts := &slog.HandlerOptions{Level: level}
	var h slog.Handler
	switch f := config.GetString("log-format"); f {
	case "text":
		h = slog.NewTextHandler(os.Stderr, opts)
	case "json":
		h = slog.NewJSONHandler(os.Stderr, opts)
	default:
		return usageError{cmd: "evolve", err: fmt.Errorf("--log-format %q: want text or json", f)}
	}
	slog.SetDefault(slog.New(h))
	return nil
}
