package main

import (
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// envKeys maps a config key to its environment variable's name, after
// EVOLVE_: viper and envName both use it.
var envKeys = strings.NewReplacer(".", "_", "-", "_")

// configList is a list flag's value: its items, whichever source set it
// (the environment's value reaches config as one comma-separated string).
func configList(key string) []string {
	// Split on commas only: viper would split a string (from the
	// environment) on spaces too, and an API key entry is NAME KEY.
	var values []string
	switch v := config.Get(key).(type) {
	case string:
		values = []string{v}
	case []string:
		values = v
	default:
		values = config.GetStringSlice(key)
	}
	var out []string
	for _, v := range values {
		for _, item := range strings.Split(v, ",") {
			if item = strings.TrimSpace(item); item != "" {
				out = append(out, item)
			}
		}
	}
	return out
}

// envName is the environment variable that sets the config key key.
func envName(key string) string {
	return "EVOLVE_" + strings.ToUpper(envKeys.Replace(key))
}

// flagKey is the config key of cmd's flag f: its bare name for the root's
// persistent flags, "<command>.<name>" otherwise.
func flagKey(cmd *cobra.Command, f *pflag.Flag) string {
	if cmd.Root().PersistentFlags().Lookup(f.Name) != nil {
		return f.Name
	}
	return cfgKey(cmd) + "." + f.Name
}

// applyConfigToFlags gives every flag not set on the command line the value
// the environment or the config file sets for it, parsed by the flag
// itself. So a malformed value is refused with its source named (viper
// would read EVOLVE_SIM_GPUS=abc as 0, and a duration of 600 as 600ns), and
// commands that read a flag directly see the same value as those that ask
// config (a list in the file sets a comma-separated flag). The flag stays
// unchanged in cobra's sense: a value from the environment or the file is
// a default, which a preset given on the command line still overrides.
func applyConfigToFlags(cmd *cobra.Command, file string) error {
	var err error
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if err != nil || f.Changed || f.Name == "config" || f.Name == "help" {
			return
		}
		key := flagKey(cmd, f)
		var val, src string
		if v, ok := os.LookupEnv(envName(key)); ok && v != "" {
			val, src = v, envName(key)
		} else if config.InConfig(key) {
			src = fmt.Sprintf("%s (%s)", file, key)
			raw := config.Get(key)
			switch v := raw.(type) {
			case map[string]any:
				err = fmt.Errorf("config file %s: %s: want a value for --%s, not a table", file, key, f.Name)
				return
			case []any:
				items := make([]string, len(v))
				for i, x := range v {
					items[i] = fmt.Sprint(x)
				}
				if sv, ok := f.Value.(pflag.SliceValue); ok {
					if e := sv.Replace(items); e != nil {
						err = fmt.Errorf("invalid value %q for --%s from %s: %v", items, f.Name, src, e)
						return
					}
					config.Set(key, sv.GetSlice())
					return
				}
				val = strings.Join(items, ",")
			case nil:
				return
			default:
				val = fmt.Sprint(v)
			}
		} else {
			return
		}
		if e := f.Value.Set(val); e != nil {
			err = fmt.Errorf("invalid value %q for --%s from %s: %v", val, f.Name, src, e)
			return
		}
		// config must answer with the parsed value too: it would read a
		// list from the file as no string at all.
		config.Set(key, val)
	})
	return err
}

// warnUnknownConfigKeys names, on w, each key of the config file that no
// command's flag reads, with the nearest known key: a misspelt key would
// otherwise be ignored without a word. It warns rather than fails, so that
// one file can serve several versions of evolve.
func warnUnknownConfigKeys(root *cobra.Command, file string, w io.Writer) {
	known := knownConfigKeys(root)
	var unknown []string
	for _, k := range config.AllKeys() {
		if config.InConfig(k) && !known[k] {
			unknown = append(unknown, k)
		}
	}
	sort.Strings(unknown)
	for _, k := range unknown {
		msg := fmt.Sprintf("evolve: config file %s: unknown key %q, ignored", file, k)
		if near := nearestKey(k, known); near != "" {
			msg += fmt.Sprintf(" (did you mean %q?)", near)
		}
		fmt.Fprintln(w, msg)
	}
}

// knownConfigKeys is every key some command's flag reads.
func knownConfigKeys(root *cobra.Command) map[string]bool {
	known := map[string]bool{}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		add := func(f *pflag.Flag) {
			if f.Name != "help" {
				known[flagKey(c, f)] = true
			}
		}
		c.LocalFlags().VisitAll(add)
		c.InheritedFlags().VisitAll(add)
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	return known
}

// nearestKey is the known key nearest to k by edit distance, if it is near
// enough to be a likely misspelling ("" otherwise).
func nearestKey(k string, known map[string]bool) string {
	best, bestD := "", 3
	for c := range known {
		if d := editDistance(k, c); d < bestD || (d == bestD && best != "" && c < best) {
			best, bestD = c, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			sub := prev[j-1]
			if a[i-1] != b[j-1] {
				sub++
			}
			cur[j] = min(sub, prev[j]+1, cur[j-1]+1)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
