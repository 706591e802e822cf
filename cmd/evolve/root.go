package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
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
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return usageError{cmd: c.CommandPath(), err: plainValueError(c, err)}
	})
	root.AddCommand(newVersionCmd(), newEngineCmd(), newOrchestratorCmd(), newUpCmd(), newDownCmd(), newStatusCmd(), newNodesCmd(), newRoleCmd(), newBenchCmd(), newSimCmd(), newPlannerCmd(), newBranchesCmd(), newKVCmd(), newTopCmd(), newLogsCmd(), newMonitoringCmd(), newTraceCmd())
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
		return usageError{cmd: cmd.CommandPath(), err: plainValueError(cmd, err)}
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
	h, err := logHandler(os.Stderr, config.GetString("log-format"), level)
	if err != nil {
		return usageError{cmd: "evolve", err: err}
	}
	slog.SetDefault(slog.New(h))
	return nil
}

// logHandler writes log records to w as format (text or json) says, in
// the units people read: a duration as 71ms, not 71000000 (JSON's
// nanoseconds), and an attribute without a value ("err": null) left out.
func logHandler(w io.Writer, format string, level slog.Level) (slog.Handler, error) {
	opts := &slog.HandlerOptions{Level: level, ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		switch v := a.Value; {
		case v.Kind() == slog.KindDuration:
			return slog.String(a.Key, v.Duration().String())
		case v.Kind() == slog.KindAny && v.Any() == nil:
			return slog.Attr{} // dropped
		}
		return a
	}}
	switch format {
	case "text":
		return slog.NewTextHandler(w, opts), nil
	case "json":
		return slog.NewJSONHandler(w, opts), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}

// badValueRE matches the flag parser's and the config's message for a
// value a flag cannot take: the value, the flag, where it came from, and
// the parser's own error.
var badValueRE = regexp.MustCompile(`^invalid (?:argument|value) ("[^"]*"|\[[^\]]*\]) for "?(?:-\w, )?--([\w.-]+)"?(?: flag)?(?: from (.+?))?: (.*)$`)

// goParseRE matches Go's own parse errors, which say nothing to people:
// strconv.ParseFloat: parsing "10m": invalid syntax; time: missing unit in
// duration "10".
var goParseRE = regexp.MustCompile(`strconv\.\w+: |^time: |invalid syntax|out of range`)

// plainValueError says what a flag wants in place of Go's parse error:
// --speedup "10m": want a number, such as 10 or 2.5.
func plainValueError(cmd *cobra.Command, err error) error {
	m := badValueRE.FindStringSubmatch(err.Error())
	if m == nil || !goParseRE.MatchString(m[4]) {
		return err
	}
	value, name, from, parse := m[1], m[2], m[3], m[4]
	want := ""
	if f := cmd.Flags().Lookup(name); f != nil {
		switch t := f.Value.Type(); {
		case strings.HasPrefix(t, "float"):
			want = "want a number, such as 10 or 2.5"
		case strings.HasPrefix(t, "int"), strings.HasPrefix(t, "uint"):
			want = "want a whole number, such as 4"
		case t == "duration":
			want = "want a duration with its unit, such as 90s, 10m or 1h30m"
			if u := durationUnitRE.FindStringSubmatch(parse); u != nil {
				want = u[1] + "; " + want // missing unit, unknown unit "x"
			}
		case t == "bool":
			want = "want true or false"
		}
	}
	if want == "" {
		return err
	}
	if strings.Contains(parse, "out of range") {
		want = "out of range; " + want
	}
	if from != "" {
		return fmt.Errorf("invalid value %s for --%s from %s: %s", value, name, from, want)
	}
	return fmt.Errorf("--%s %s: %s", name, value, want)
}

// durationUnitRE takes what a duration lacks from Go's parse error.
var durationUnitRE = regexp.MustCompile(`(missing unit|unknown unit "[^"]*")`)
