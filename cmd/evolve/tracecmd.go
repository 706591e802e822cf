package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/evolvellm/evolve/traceview"
	"github.com/evolvellm/evolve/workload"
	"github.com/spf13/cobra"
)

func newTraceCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "trace",
		Short: "Look at recorded traffic: a summary, or a timeline for Perfetto",
		Long: `Look at the traffic a router recorded (evolve orchestrator --record DIR, or
evolve up --record DIR), or any trace evolve sim --trace reads (evolve bench
--record, sim --record, Mooncake's). A PATH is a file (.jsonl, or gzipped)
or a directory, whose *.jsonl and *.jsonl.gz files are read together: the
files of several routers merge into one trace on one clock.

  summary   sessions, turns per session, prompt and output lengths, the
            agents' tool time (between an answer and the session's next
            request), latencies, where the prompts' KV came from (GPU,
            host, a peer's host pool, computed) and each node's load
  perfetto  a timeline in the Chrome trace event format, which
            ui.perfetto.dev opens: a track per node with each request's
            phases (queued, prefill, decode), and the sessions' turns
            joined by arrows across their tool time

To replay a recording in the simulator, at another split, size or
profile: evolve sim --trace PATH --gpus N --profile P.`,
		Example: `  evolve orchestrator --record rec/ ...      # or: evolve up --agents 8 --record rec/
  evolve trace summary rec/
  evolve trace summary rec/ -o json | jq .tool_time
  evolve trace perfetto rec/ -o run.json     # then open run.json at ui.perfetto.dev
  evolve sim --trace rec/ --gpus 16`,
	}
	cmd.AddCommand(newTraceSummaryCmd(), newTracePerfettoCmd())
	return cmd
}

func newTraceSummaryCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "summary PATH...",
		Short: "Summarise a recording or trace: sessions, lengths, tool time, KV reuse, nodes",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			recs, format, err := readTraces(args)
			if err != nil {
				return err
			}
			s := traceview.Summarize(recs, format)
			return output(cmd, s, func(w *tabwriter.Writer, _ bool) { s.WriteText(w) })
		},
	}
	addOutputFlag(cmd, "table, json or yaml")
	return cmd
}

func newTracePerfettoCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "perfetto PATH...",
		Short: "Write a recording or trace as a timeline that ui.perfetto.dev opens",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			recs, _, err := readTraces(args)
			if err != nil {
				return err
			}
			out, _ := cmd.Flags().GetString("output")
			if out == "" || out == "-" {
				return traceview.Perfetto(cmd.OutOrStdout(), recs)
			}
			f, err := os.CreateTemp(filepath.Dir(out), "."+filepath.Base(out)+".*")
			if err != nil {
				return usageError{cmd: cmd.CommandPath(), err: fmt.Errorf("-o %s: %w", out, err)}
			}
			if err := traceview.Perfetto(f, recs); err != nil {
				f.Close()
				os.Remove(f.Name())
				return err
			}
			if err := f.Close(); err != nil {
				os.Remove(f.Name())
				return err
			}
			if err := os.Rename(f.Name(), out); err != nil {
				os.Remove(f.Name())
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "wrote %s: %d requests; open it at https://ui.perfetto.dev (Open trace file)\n", out, len(recs))
			return nil
		},
	}
	cmd.Flags().StringP("output", "o", "", "file to write the timeline to (default, or -: standard output)")
	return cmd
}

// readTraces reads the files (or directories' files) of paths into one
// trace, and says what format it found.
func readTraces(paths []string) ([]workload.TraceRecord, string, error) {
	var files []string
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			return nil, "", err
		}
		if !st.IsDir() {
			files = append(files, p)
			continue
		}
		var found []string
		for _, pat := range []string{"*.jsonl", "*.jsonl.gz"} {
			m, _ := filepath.Glob(filepath.Join(p, pat))
			found = append(found, m...)
		}
		if len(found) == 0 {
			return nil, "", fmt.Errorf("%s: no *.jsonl or *.jsonl.gz files in it", p)
		}
		sort.Strings(found)
		files = append(files, found...)
	}
	var sets [][]workload.TraceRecord
	formats := map[string]bool{}
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			return nil, "", err
		}
		recs, format, cut, err := traceview.Read(name, io.Reader(f))
		f.Close()
		if err != nil {
			return nil, "", err
		}
		if cut {
			fmt.Fprintf(os.Stderr, "%s ends early (still being written, or its router stopped without closing it): its %d whole rows are read\n", name, len(recs))
		}
		sets = append(sets, recs)
		formats[format] = true
	}
	var fs []string
	for f := range formats {
		fs = append(fs, f)
	}
	sort.Strings(fs)
	return traceview.Merge(sets...), strings.Join(fs, " and "), nil
}
