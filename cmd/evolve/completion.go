package main

import (
	"strings"

	"github.com/evolvellm/evolve/engine/stepmodel"
	"github.com/evolvellm/evolve/sim"
	"github.com/evolvellm/evolve/workload"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// flagChoices are the values flags of a given name take, wherever they
// appear; shells complete them (`evolve sim --preset <TAB>`).
func flagChoices() map[string]func() []string {
	fixed := func(vs ...string) func() []string { return func() []string { return vs } }
	return map[string]func() []string{
		"preset":     presetNames,
		"profile":    stepmodel.ProfileNames,
		"workload":   workload.Names,
		"eviction":   fixed("ref", "lru"),
		"backend":    fixed("sim", "vllm"),
		"service":    fixed("auto", "systemd", "process"),
		"log-level":  fixed("debug", "info", "warn", "error"),
		"log-format": fixed("text", "json"),
	}
}

// policyChoices are the policy names `evolve sim --policies` takes; a split
// (static:P:D) is completed as far as its prefix.
func policyChoices() []string {
	var out []string
	for _, p := range sim.PolicyNames {
		out = append(out, strings.TrimSuffix(p, "P:D"))
	}
	return out
}

// outputFormats are the formats an --output flag's help names.
var outputFormats = []string{"table", "wide", "text", "json", "yaml"}

// registerCompletions gives every command's enumerated flags shell
// completion: the choices above, the formats each -o names in its help,
// and for --policies the next name of the comma-separated list.
func registerCompletions(c *cobra.Command) {
	choices := flagChoices()
	register := func(f *pflag.Flag, values func(toComplete string) []string, dir cobra.ShellCompDirective) {
		// Registering twice is an error cobra returns; inherited flags are
		// registered once, on the command that defines them.
		_ = c.RegisterFlagCompletionFunc(f.Name, func(_ *cobra.Command, _ []string, toComplete string) ([]string, cobra.ShellCompDirective) {
			return values(toComplete), dir
		})
	}
	c.LocalNonPersistentFlags().VisitAll(func(f *pflag.Flag) {
		switch {
		case f.Name == "output":
			var fs []string
			for _, o := range outputFormats {
				if strings.Contains(f.Usage, o) {
					fs = append(fs, o)
				}
			}
			register(f, func(string) []string { return fs }, cobra.ShellCompDirectiveNoFileComp)
		case f.Name == "policies":
			register(f, completeList(policyChoices()), cobra.ShellCompDirectiveNoFileComp|cobra.ShellCompDirectiveNoSpace)
		case f.Name == "profile":
			// A profile may also be a YAML file of one's own.
			register(f, func(string) []string { return stepmodel.ProfileNames() }, cobra.ShellCompDirectiveDefault)
		case choices[f.Name] != nil:
			values := choices[f.Name]
			register(f, func(string) []string { return values() }, cobra.ShellCompDirectiveNoFileComp)
		}
	})
	c.PersistentFlags().VisitAll(func(f *pflag.Flag) {
		if values := choices[f.Name]; values != nil {
			register(f, func(string) []string { return values() }, cobra.ShellCompDirectiveNoFileComp)
		}
	})
	for _, sub := range c.Commands() {
		registerCompletions(sub)
	}
}

// completeList completes the last item of a comma-separated list, keeping
// the items before it.
func completeList(items []string) func(toComplete string) []string {
	return func(toComplete string) []string {
		done, last := "", toComplete
		if i := strings.LastIndexByte(toComplete, ','); i >= 0 {
			done, last = toComplete[:i+1], toComplete[i+1:]
		}
		var out []string
		for _, it := range items {
			if strings.HasPrefix(it, last) {
				out = append(out, done+it)
			}
		}
		return out
	}
}
