package main

import (
	"errors"
	"fmt"
	"text/tabwriter"

	"github.com/evolvellm/evolve/cluster"
	"github.com/spf13/cobra"
)

// upFromFile brings up the hosts of a cluster file. Only --dry-run is
// built so far: the SSH phases are the next step of the bootstrap work.
func upFromFile(cmd *cobra.Command, path string, dryRun bool) error {
	f, err := cluster.Load(path)
	if err != nil {
		var es cluster.Errors
		if errors.As(err, &es) {
			return usageError{cmd: cmd.CommandPath(), err: err}
		}
		return usageError{cmd: cmd.CommandPath(), err: fmt.Errorf("cluster file: %w", err)}
	}
	if !dryRun {
		return fmt.Errorf("%s is valid, but bringing hosts up over SSH is not built yet: 'evolve up -f %s --dry-run' shows the plan", path, path)
	}
	plan := f.Plan()
	out := map[string]any{"cluster": f.Metadata.Name, "file": path, "valid": true, "hosts": plan}
	return output(cmd, out, func(w *tabwriter.Writer, _ bool) {
		fmt.Fprintf(w, "%s: cluster %s, %d hosts, valid\n", path, f.Metadata.Name, len(f.Spec.Hosts))
		for _, h := range plan {
			fmt.Fprintf(w, "\n%s (%s)\n", h.Host, h.SSH)
			for i, s := range h.Steps {
				fmt.Fprintf(w, "  %d. %s\n", i+1, s)
			}
		}
	})
}
