package vllm

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

// writeExec writes an executable file.
func writeExec(t *testing.T, path, body string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
}

// A release is told to know a flag when its package's sources name the
// option, found through the Python its command's script names; what is
// no Python script, or names no package, cannot be told.
func TestKnowsFlag(t *testing.T) {
	dir := t.TempDir()
	pkg := filepath.Join(dir, "site", "vllm")
	os.MkdirAll(filepath.Join(pkg, "config"), 0o755)
	os.MkdirAll(filepath.Join(pkg, "engine"), 0o755)
	os.WriteFile(filepath.Join(pkg, "config", "observability.py"), []byte("class ObservabilityConfig:\n    otlp_traces_endpoint = None\n"), 0o644)
	// A stand-in Python: asked where vllm lies (-c), it says.
	python := filepath.Join(dir, "python3")
	writeExec(t, python, "#!/bin/sh\n[ \"$1\" = -c ] && echo 'a start-up hook speaks' && echo \"$VLLM_PKG\"\n")
	vllmScript := filepath.Join(dir, "vllm")
	writeExec(t, vllmScript, "#!"+python+"\nimport sys\n")
	t.Setenv("VLLM_PKG", pkg)
	ctx := context.Background()
	const flag = "--forward-pass-metrics-port"

	if knows, known := KnowsFlag(ctx, []string{vllmScript, "serve", "m"}, nil, flag); !known || knows {
		t.Fatalf("a release without the option: knows %v, known %v", knows, known)
	}
	// A release that keeps its engine arguments elsewhere: any source
	// naming the option will do.
	os.WriteFile(filepath.Join(pkg, "config", "observability.py"), []byte("class ObservabilityConfig:\n    forward_pass_metrics_port: int = 0\n"), 0o644)
	if knows, known := KnowsFlag(ctx, []string{vllmScript, "serve", "m"}, nil, flag); !known || !knows {
		t.Fatalf("a release with the option: knows %v, known %v", knows, known)
	}
	// Where the engine arguments are, a config field they do not take is
	// no flag; one they take is.
	args := filepath.Join(pkg, "engine", "arg_utils.py")
	os.WriteFile(args, []byte("class EngineArgs:\n    otlp_traces_endpoint = None\n"), 0o644)
	if knows, known := KnowsFlag(ctx, []string{vllmScript, "serve", "m"}, nil, flag); !known || knows {
		t.Fatalf("an option the engine arguments do not take: knows %v, known %v", knows, known)
	}
	os.WriteFile(args, []byte("class EngineArgs:\n    forward_pass_metrics_port: int = ObservabilityConfig.forward_pass_metrics_port\n"), 0o644)
	if knows, known := KnowsFlag(ctx, []string{vllmScript, "serve", "m"}, nil, flag); !known || !knows {
		t.Fatalf("an engine argument: knows %v, known %v", knows, known)
	}
	// python -m vllm.entrypoints.openai.api_server: the Python itself.
	if knows, known := KnowsFlag(ctx, []string{python, "-m", "vllm.entrypoints.openai.api_server"}, nil, flag); !known || !knows {
		t.Fatalf("a Python command: knows %v, known %v", knows, known)
	}
	// The server's env reaches the Python (a venv's PATH, say).
	if knows, known := KnowsFlag(ctx, []string{vllmScript}, []string{"VLLM_PKG=" + filepath.Join(dir, "nowhere")}, flag); known {
		t.Fatalf("a package that is not there: knows %v, known %v", knows, known)
	}
	binary := filepath.Join(dir, "vllm-bin")
	writeExec(t, binary, "\x7fELF not a script")
	for name, command := range map[string][]string{
		"a binary":        {binary, "serve", "m"},
		"a missing one":   {filepath.Join(dir, "absent")},
		"nothing at all":  nil,
		"a shell wrapper": {"/bin/sh", "-c", "vllm serve m"},
	} {
		t.Run(name, func(t *testing.T) {
			if _, known := KnowsFlag(ctx, command, nil, flag); known {
				t.Errorf("%s: told, but it cannot be", name)
			}
		})
	}
}
