package cluster

import (
	"bufio"
	"context"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
)

// Module is evolve's Go module path.
const Module = "github.com/evolvellm/evolve"

// BinaryArch is the architecture (Go's name) a linux binary is built for;
// "" for anything that is not a linux ELF binary of a known architecture
// (a macOS build, say), which fits no host.
func BinaryArch(path string) string {
	f, err := elf.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	if f.OSABI != elf.ELFOSABI_NONE && f.OSABI != elf.ELFOSABI_LINUX {
		return ""
	}
	switch f.Machine {
	case elf.EM_X86_64:
		return "amd64"
	case elf.EM_AARCH64:
		return "arm64"
	case elf.EM_PPC64:
		return "ppc64le"
	case elf.EM_S390:
		return "s390x"
	case elf.EM_RISCV:
		return "riscv64"
	}
	return ""
}

// FindSource returns the root of the evolve source checkout that holds dir
// (dir or a folder above it whose go.mod declares evolve's module).
func FindSource(dir string) (string, bool) {
	for {
		if f, err := os.Open(filepath.Join(dir, "go.mod")); err == nil {
			sc := bufio.NewScanner(f)
			for sc.Scan() {
				if line := strings.TrimSpace(sc.Text()); strings.HasPrefix(line, "module ") {
					mod := strings.Trim(strings.TrimSpace(strings.TrimPrefix(line, "module ")), `"`)
					f.Close()
					if mod == Module {
						return dir, true
					}
					break
				}
			}
			f.Close()
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", false
		}
		dir = parent
	}
}

// SourceBuilder cross-compiles evolve for hosts of another architecture
// with the Go toolchain, from a source checkout; each architecture once.
// Its Build is UpOptions.Build.
type SourceBuilder struct {
	Dir string    // the checkout's root (see FindSource)
	Out string    // where the binaries go
	Log io.Writer // the compiler's output (may be nil)

	mu    sync.Mutex
	built map[string]*build
}

type build struct {
	done chan struct{}
	path string
	err  error
}

// Build returns evolve built for linux/arch, building it on the first call
// for that architecture (later calls wait for it).
func (b *SourceBuilder) Build(ctx context.Context, arch string) (string, error) {
	b.mu.Lock()
	if b.built == nil {
		b.built = map[string]*build{}
	}
	x := b.built[arch]
	if x == nil {
		x = &build{done: make(chan struct{})}
		b.built[arch] = x
		b.mu.Unlock()
		x.path, x.err = b.compile(ctx, arch)
		close(x.done)
	} else {
		b.mu.Unlock()
	}
	select {
	case <-x.done:
		return x.path, x.err
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

func (b *SourceBuilder) compile(ctx context.Context, arch string) (string, error) {
	if b.Dir == "" {
		return "", fmt.Errorf("no evolve source checkout to build from: run evolve up from the source tree, or build one with GOOS=linux GOARCH=%s go build ./cmd/evolve and pass it with --binary", arch)
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("no Go toolchain on this machine: install Go, or build evolve with GOOS=linux GOARCH=%s go build ./cmd/evolve elsewhere and pass it with --binary", arch)
	}
	if err := os.MkdirAll(b.Out, 0o700); err != nil {
		return "", err
	}
	out := filepath.Join(b.Out, "evolve-linux-"+arch)
	// No VCS stamp: the same source gives the same bytes, so a re-run
	// finds the hosts' binary unchanged.
	cmd := exec.CommandContext(ctx, goBin, "build", "-buildvcs=false", "-o", out+".tmp", "./cmd/evolve")
	cmd.Dir = b.Dir
	cmd.Env = append(os.Environ(), "GOOS=linux", "GOARCH="+arch, "CGO_ENABLED=0")
	var msg strings.Builder
	w := io.Writer(&msg)
	if b.Log != nil {
		w = io.MultiWriter(&msg, b.Log)
	}
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go build for linux/%s in %s: %w: %s", arch, b.Dir, err, strings.TrimSpace(msg.String()))
	}
	return out, os.Rename(out+".tmp", out)
}
