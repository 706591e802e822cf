package cluster

import (
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// fakeELF writes the header of a linux ELF executable for machine.
func fakeELF(t *testing.T, path string, machine uint16) string {
	h := make([]byte, 64)
	copy(h, "\x7fELF")
	h[4], h[5], h[6] = 2, 1, 1 // 64-bit, little endian, version 1
	binary.LittleEndian.PutUint16(h[16:], 2)
	binary.LittleEndian.PutUint16(h[18:], machine)
	binary.LittleEndian.PutUint32(h[20:], 1)
	binary.LittleEndian.PutUint16(h[52:], 64)
	if err := os.WriteFile(path, h, 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestBinaryArch(t *testing.T) {
	dir := t.TempDir()
	self, _ := os.Executable()
	if runtime.GOOS == "linux" && BinaryArch(self) != runtime.GOARCH {
		t.Fatalf("this test binary: %q, want %s", BinaryArch(self), runtime.GOARCH)
	}
	if a := BinaryArch(fakeELF(t, filepath.Join(dir, "arm"), 183)); a != "arm64" {
		t.Fatalf("an aarch64 ELF: %q", a)
	}
	if a := BinaryArch(fakeBinary(t, dir, "script")); a != "" {
		t.Fatalf("a shell script: %q", a)
	}
}

// A host of another architecture gets a binary built for it, each
// architecture built once however many hosts need it; a failed build fails
// those hosts at upload with the cause, before anything is installed.
func TestUpCrossCompilesForAnotherArchitecture(t *testing.T) {
	dir := t.TempDir()
	hosts := &fakeHosts{homes: map[string]string{"a": filepath.Join(dir, "a"), "b": filepath.Join(dir, "b")}}
	f := testFile(t, "a", "b")
	var builds atomic.Int32
	built := fakeBinary(t, dir, "built-for-host")
	opt := UpOptions{Service: "process", Dial: hosts.dial, Binary: fakeBinary(t, dir, "operator"), BinaryArch: "darwin/arm64", NATS: "nats://x:1",
		Build: (&countingBuilder{path: built, n: &builds}).Build}
	ctx := context.Background()
	t.Cleanup(func() { Down(ctx, f, opt) })
	res := Up(ctx, f, opt)
	for _, r := range res {
		if r.Err() != nil || r.Upload != "uploaded" {
			t.Fatalf("up: %+v", r)
		}
		b, _ := os.ReadFile(filepath.Join(dir, r.Host, ".local/state/evolve/engine/bin/evolve"))
		if !strings.Contains(string(b), "built-for-host") {
			t.Fatalf("%s got %q, not the binary built for it", r.Host, b)
		}
	}
	if n := builds.Load(); n != 1 {
		t.Fatalf("built %d times for two hosts of one architecture", n)
	}

	Down(ctx, f, opt)
	opt.Build = func(context.Context, string) (string, error) { return "", os.ErrNotExist }
	res = Up(ctx, f, opt)
	if res[0].Phase != PhaseUpload || !strings.Contains(res[0].Error, "binary darwin/arm64; cross-compiling") {
		t.Fatalf("failed build: %+v", res[0])
	}
	if _, err := os.Stat(filepath.Join(dir, "a/.local/state/evolve/engine/bin/evolve")); err == nil {
		t.Fatal("installed a binary after the build failed")
	}
}

// countingBuilder is a SourceBuilder's stand-in: it counts builds per call
// the way SourceBuilder does, once per architecture.
type countingBuilder struct {
	mu   sync.Mutex
	seen map[string]bool
	path string
	n    *atomic.Int32
}

func (b *countingBuilder) Build(_ context.Context, arch string) (string, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.seen == nil {
		b.seen = map[string]bool{}
	}
	if !b.seen[arch] {
		b.seen[arch] = true
		b.n.Add(1)
	}
	return b.path, nil
}

// The source builder compiles evolve from this checkout with the Go
// toolchain, once per architecture, and the same source gives the same
// bytes (so re-runs upload nothing).
func TestSourceBuilderCompilesOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles evolve")
	}
	wd, _ := os.Getwd()
	src, ok := FindSource(wd)
	if !ok {
		t.Fatalf("no evolve checkout above %s", wd)
	}
	if _, ok := FindSource(t.TempDir()); ok {
		t.Fatal("found a checkout above a temporary folder")
	}
	b := &SourceBuilder{Dir: src, Out: t.TempDir()}
	var wg sync.WaitGroup
	paths := make([]string, 3)
	errs := make([]error, 3)
	for i := range paths {
		wg.Add(1)
		go func() { defer wg.Done(); paths[i], errs[i] = b.Build(context.Background(), runtime.GOARCH) }()
	}
	wg.Wait()
	for i := range paths {
		if errs[i] != nil || paths[i] != paths[0] {
			t.Fatalf("build %d: %q %v", i, paths[i], errs[i])
		}
	}
	if BinaryArch(paths[0]) != runtime.GOARCH {
		t.Fatalf("built %q for %s", BinaryArch(paths[0]), runtime.GOARCH)
	}
	first, _ := os.ReadFile(paths[0])
	again, err := (&SourceBuilder{Dir: src, Out: t.TempDir()}).Build(context.Background(), runtime.GOARCH)
	second, _ := os.ReadFile(again)
	if err != nil || string(first) != string(second) {
		t.Fatalf("two builds of the same source differ (%d and %d bytes): %v", len(first), len(second), err)
	}
	none := &SourceBuilder{Out: t.TempDir()}
	if _, err := none.Build(context.Background(), "arm64"); err == nil || !strings.Contains(err.Error(), "--binary") {
		t.Fatalf("no checkout: %v", err)
	}
}
