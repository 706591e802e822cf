package main

import (
	"fmt"
	"os"

	enginesim "github.com/evolvellm/evolve/engine/sim"
)

// loadProfile returns the built-in engine profile of that name, or reads
// the YAML file nameOrPath names (a path, or a name ending in .yaml).
func loadProfile(nameOrPath string) (*enginesim.Profile, error) {
	if !enginesim.IsProfileFile(nameOrPath) {
		return enginesim.BuiltinProfile(nameOrPath)
	}
	data, err := os.ReadFile(nameOrPath)
	if err != nil {
		return nil, fmt.Errorf("read profile: %w", err)
	}
	return enginesim.ParseProfile(data)
}
