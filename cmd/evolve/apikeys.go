package main

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/evolvellm/evolve/orchestrator/apikeys"
	"github.com/spf13/pflag"
)

// addAPIKeyFlags adds the flags that give the agents' API its keys
// (evolve orchestrator and evolve up share them).
func addAPIKeyFlags(f *pflag.FlagSet) {
	f.StringSlice("api-key", nil, "a key the agents' API (/v1/) requires, as Authorization: Bearer KEY or x-api-key: KEY (repeat, or separate with commas; a command line shows in ps: prefer --api-key-file or $EVOLVE_<COMMAND>_API_KEY)")
	f.String("api-key-file", "", "a file of keys the agents' API requires, one per line, KEY or NAME KEY: the name labels the key's requests and tokens in the router's metrics (evolve_router_key_*; a key without one is labelled sha256:<fingerprint>); NAME KEY max-concurrency=N [max-wait=30s] shares the cluster fairly: the name's requests beyond N in flight wait up to max-wait, then get a 429; blank lines and lines starting with # are skipped; the file is read again when it changes (keys added, revoked or given other limits with no restart)")
}

// apiKeys are the keys cmd's --api-key and --api-key-file give (config
// key prefix cmd), in that order, checked.
func apiKeys(cmd string) ([]string, error) {
	keys := configList(cmd + ".api-key")
	if path := config.GetString(cmd + ".api-key-file"); path != "" {
		if err := checkPrivate("api-key-file", path); err != nil {
			return nil, err
		}
		file, err := apikeys.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("--api-key-file: %w", err)
		}
		keys = append(keys, file...)
	}
	if err := apikeys.Check(keys); err != nil {
		return nil, fmt.Errorf("--api-key or --api-key-file: %w", err)
	}
	return keys, nil
}

// apiKeyFile is cmd's --api-key-file as an absolute path, for an
// orchestrator that reads it again when it changes ("" for none).
func apiKeyFile(cmd string) (string, error) {
	path := config.GetString(cmd + ".api-key-file")
	if path == "" {
		return "", nil
	}
	return filepath.Abs(path)
}

// apiKeyEnv is the environment that gives an orchestrator the keys: not
// its command line, which ps shows.
func apiKeyEnv(keys []string) []string {
	if len(keys) == 0 {
		return nil
	}
	return []string{"EVOLVE_ORCHESTRATOR_API_KEY=" + strings.Join(keys, ",")}
}
