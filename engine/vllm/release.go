package vllm

import (
	"bufio"
	"bytes"
	"context"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// findPackage prints where the vllm package lies without importing it
// (importing vLLM takes seconds and initialises CUDA).
const findPackage = `import importlib.util as u; s = u.find_spec("vllm"); print(s.submodule_search_locations[0] if s and s.submodule_search_locations else "")`

// KnowsFlag says whether the vLLM release a command runs accepts the
// command-line flag name (--forward-pass-metrics-port), as far as can be
// told without starting it: the command's script names its Python on its
// #! line, that Python says where its vllm package lies, and the flag's
// option (forward_pass_metrics_port) is looked for where vLLM declares
// its command line, the engine arguments (engine/arg_utils.py; a config
// field they do not take is no flag), or in all the package's sources
// when a release keeps them elsewhere. known is false when it cannot
// tell: a command that is no Python script (a container, a wrapper), or
// a package it cannot find. env is added to the agent's environment, as
// the server gets it.
func KnowsFlag(ctx context.Context, command, env []string, name string) (knows, known bool) {
	if len(command) == 0 {
		return false, false
	}
	path, err := exec.LookPath(command[0])
	if err != nil {
		return false, false
	}
	python := interpreter(path)
	if len(python) == 0 {
		return false, false
	}
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, python[0], append(python[1:], "-c", findPackage)...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.Output()
	// The last line: a site's start-up hooks may print before it.
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	dir := strings.TrimSpace(lines[len(lines)-1])
	if err != nil || dir == "" || !filepath.IsAbs(dir) {
		return false, false
	}
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return false, false
	}
	option := []byte(strings.ReplaceAll(strings.TrimLeft(name, "-"), "-", "_"))
	if b, err := os.ReadFile(filepath.Join(dir, "engine", "arg_utils.py")); err == nil {
		return bytes.Contains(b, option), true
	}
	found := false
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // unreadable: looked past
		}
		if d.IsDir() || !strings.HasSuffix(p, ".py") {
			return nil
		}
		if b, err := os.ReadFile(p); err == nil && bytes.Contains(b, option) {
			found = true
			return filepath.SkipAll
		}
		return nil
	})
	return found, true
}

// interpreter is the Python that runs the script at path, from its #!
// line ("/usr/bin/env python3" included), or path itself when it is a
// Python; nil when it is neither.
func interpreter(path string) []string {
	if strings.HasPrefix(filepath.Base(path), "python") {
		return []string{path}
	}
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	line, err := bufio.NewReader(f).ReadString('\n')
	if err != nil && line == "" {
		return nil
	}
	rest, ok := strings.CutPrefix(line, "#!")
	if !ok {
		return nil
	}
	return strings.Fields(rest)
}
