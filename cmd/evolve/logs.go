package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/evolvellm/evolve/cluster"
	"github.com/spf13/cobra"
)

func newLogsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "logs NAME",
		Short: "Print the log of an engine or of the orchestrator, and follow it",
		Long: `Print the end of a log, and with --follow what is written to it after,
until Ctrl-C. The processes write JSON lines; they show as time, level,
message and key=value fields, or with -o json as written (for jq).

NAME is a node of the local cluster (engine-0, engine-1, ...) or
orchestrator. With -f, a cluster file's: the name of a host, for the log
of the engine evolve up runs there, or orchestrator; the log of a host is
read over SSH, as evolve status -f reaches it.

'evolve logs' without NAME lists the names there are.`,
		Example: `  evolve logs engine-0
  evolve logs orchestrator --follow
  evolve logs gpu-01 -f lab.yaml --tail 50
  evolve logs engine-1 --tail -1 -o json | jq -r 'select(.level == "WARN") | .msg'`,
		Args: cobra.MaximumNArgs(1),
		RunE: runLogs,
		ValidArgsFunction: func(cmd *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
			if len(args) > 0 {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
			names, _ := logNames(cmd)
			return names, cobra.ShellCompDirectiveNoFileComp
		},
	}
	f := cmd.Flags()
	f.Int("tail", 100, "print the last N lines (-1: all of the log, 0: none, for --follow)")
	f.BoolP("follow", "F", false, "then print what is written to the log, until Ctrl-C")
	f.StringP("file", "f", "", "a cluster brought up with evolve up -f: NAME is one of its hosts, or orchestrator")
	f.StringP("output", "o", "text", "text: each JSON log line as time, level, message and key=value fields; json: the lines as written (for jq)")
	addSSHFlags(f)
	return cmd
}

func runLogs(cmd *cobra.Command, args []string) error {
	usage := func(err error) error { return usageError{cmd: cmd.CommandPath(), err: err} }
	names, err := logNames(cmd)
	if err != nil {
		return err
	}
	if len(args) == 0 {
		for _, n := range names {
			fmt.Fprintln(cmd.OutOrStdout(), n)
		}
		return nil
	}
	name := args[0]
	if !slices.Contains(names, name) {
		return usage(fmt.Errorf("no log named %q: there are %s", name, strings.Join(names, ", ")))
	}
	tail := config.GetInt("logs.tail")
	if tail < -1 {
		return usage(fmt.Errorf("--tail %d: want a number of lines, or -1 for all", tail))
	}
	follow := config.GetBool("logs.follow")
	var out io.Writer = cmd.OutOrStdout()
	switch o := config.GetString("logs.output"); o {
	case "json":
	case "text":
		text := &logText{w: out}
		defer text.Flush()
		out = text
	default:
		return usage(fmt.Errorf("-o %q: want text or json", o))
	}
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if file := config.GetString("logs.file"); file != "" {
		f, err := loadClusterFile(cmd, file)
		if err != nil {
			return err
		}
		err = cluster.Logs(ctx, f, name, tail, follow, cluster.UpOptions{Dial: cluster.SSHDialer(sshOptions("logs"))}, out)
		if !errors.Is(err, cluster.ErrLocalLog) {
			return err
		}
		return tailFile(ctx, filepath.Join(clusterDir(f.Metadata.Name), "logs", "orchestrator.log"), tail, follow, out)
	}
	st, err := cluster.ReadLocalState(localDir())
	if err != nil {
		return err // logNames said so already
	}
	return tailFile(ctx, filepath.Join(st.LogDir, name+".log"), tail, follow, out)
}

// logNames are the logs there are: of the local cluster (its files), or
// with -f of the cluster file's hosts and its orchestrator.
func logNames(cmd *cobra.Command) ([]string, error) {
	if file := config.GetString("logs.file"); file != "" {
		f, err := loadClusterFile(cmd, file)
		if err != nil {
			return nil, err
		}
		return cluster.LogNames(f), nil
	}
	st, err := cluster.ReadLocalState(localDir())
	if err != nil {
		return nil, errors.New("no local cluster (evolve up starts one); for a cluster file's, pass it with -f")
	}
	files, _ := filepath.Glob(filepath.Join(st.LogDir, "*.log"))
	var names []string
	for _, f := range files {
		names = append(names, strings.TrimSuffix(filepath.Base(f), ".log"))
	}
	sort.Strings(names)
	if len(names) == 0 {
		return nil, fmt.Errorf("the local cluster has no logs in %s", st.LogDir)
	}
	return names, nil
}

// tailFile writes the last n lines of the file at path (all when n is
// negative) to w, and with follow what is appended after, until ctx ends,
// reading the file anew when it is replaced or truncated.
func tailFile(ctx context.Context, path string, n int, follow bool, w io.Writer) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer func() { f.Close() }()
	from, err := lastLines(f, n)
	if err != nil {
		return err
	}
	if _, err := f.Seek(from, io.SeekStart); err != nil {
		return err
	}
	off, err := io.Copy(w, f)
	off += from
	if err != nil || !follow {
		return err
	}
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		now, err := os.Stat(path)
		if err != nil {
			continue // between a removal and its new file
		}
		if had, err := f.Stat(); err != nil || !os.SameFile(had, now) || now.Size() < off {
			g, err := os.Open(path)
			if err != nil {
				continue
			}
			f.Close()
			f, off = g, 0
		}
		k, err := io.Copy(w, f)
		off += k
		if err != nil {
			return err
		}
	}
}

// lastLines is the offset in f where its last n lines begin (0 for n < 0:
// all of it), a final newline ending the last line rather than opening
// another.
func lastLines(f *os.File, n int) (int64, error) {
	st, err := f.Stat()
	if err != nil || n < 0 {
		return 0, err
	}
	size := st.Size()
	if n == 0 {
		return size, nil
	}
	buf := make([]byte, 64<<10)
	lines := 0
	for pos := size; pos > 0; {
		k := min(int64(len(buf)), pos)
		pos -= k
		if _, err := f.ReadAt(buf[:k], pos); err != nil && err != io.EOF {
			return 0, err
		}
		for i := k - 1; i >= 0; i-- {
			if buf[i] == '\n' && pos+i != size-1 {
				if lines++; lines == n {
					return pos + i + 1, nil
				}
			}
		}
	}
	return 0, nil
}
