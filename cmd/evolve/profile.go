package main

import (
	"fmt"
	"os"

	"github.com/evolvellm/evolve/engine/stepmodel"
)

// loadProfile returns the built-in engine profile of that name, or reads
// the YAML file nameOrPath names (a path, or a name ending in .yaml).
func loadProfile(nameOrPath string) (*stepmodel.Profile, error) {
	if !stepmodel.IsProfileFile(nameOrPath) {
		return stepmodel.BuiltinProfile(nameOrPath)
	}
	data, err := os.ReadFile(nameOrPath)
	if err != nil {
		return nil, fmt.Errorf("read profile: %w", err)
	}
	return stepmodel.ParseProfile(data)
}
