package main

import (
	"encoding/json"
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

type versionInfo struct {
	Version   string `json:"version"`
	Commit    string `json:"commit,omitempty"`
	GoVersion string `json:"go_version"`
	Platform  string `json:"platform"`
}

func buildVersion() versionInfo {
	v := versionInfo{Version: version, GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				v.Commit = s.Value
			}
		}
		if v.Version == "dev" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			v.Version = bi.Main.Version
		}
	}
	return v
}

func newVersionCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the version of evolve",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			v := buildVersion()
			switch out := config.GetString("version.output"); out {
			case "json":
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(v)
			case "table", "":
				fmt.Fprintf(cmd.OutOrStdout(), "evolve %s (%s, %s)\n", v.Version, v.GoVersion, v.Platform)
				if v.Commit != "" {
					fmt.Fprintf(cmd.OutOrStdout(), "commit %s\n", v.Commit)
				}
				return nil
			default:
				return usageError{cmd: cmd.CommandPath(), err: fmt.Errorf("-o %q: want table or json", out)}
			}
		},
	}
	cmd.Flags().StringP("output", "o", "table", "output format: table or json")
	return cmd
}

// commandGroup makes cmd, a group of subcommands, refuse a word that
// names none of them (exit 2) rather than print its help and succeed.
func commandGroup(cmd *cobra.Command) *cobra.Command {
	cmd.Args = cobra.ArbitraryArgs
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if len(args) > 0 {
			return usageError{cmd: cmd.CommandPath(), err: fmt.Errorf("unknown command %q: want one of %s", args[0], subcommandNames(cmd))}
		}
		return cmd.Help()
	}
	return cmd
}

func subcommandNames(cmd *cobra.Command) string {
	var names []string
	for _, c := range cmd.Commands() {
		if c.IsAvailableCommand() {
			names = append(names, c.Name())
		}
	}
	return strings.Join(names, ", ")
}

// noArgs rejects positional arguments as a usage error.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usageError{cmd: cmd.CommandPath(), err: fmt.Errorf("unexpected argument %q", args[0])}
	}
	return nil
}
