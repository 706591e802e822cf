package purity

import (
	"go/ast"
	"go/build"
	"go/parser"
	"go/token"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/evolvellm/evolve"

// Pure is the decision code: these packages, and every evolve package they
// import, must do no I/O and read no clock.
var Pure = []string{"kv", "planner", "orchestrator/routing", "engine/stepmodel", "sim", "workload"}

// forbidden reports whether importing path gives a pure package a network,
// a file system or processes.
func forbidden(path string) bool {
	for _, p := range []string{"net", "os", "io/ioutil", "io/fs", "github.com/nats-io"} {
		if path == p || strings.HasPrefix(path, p+"/") {
			return true
		}
	}
	return false
}

// clockFuncs read the clock or wait on it.
var clockFuncs = []string{"Now", "Since", "Until", "Sleep", "After", "AfterFunc", "Tick", "NewTicker", "NewTimer"}

// root is the module's folder.
func root(t *testing.T) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// TestDecisionCodeIsPure fails when a pure package, or an evolve package
// it imports, imports net, os, os/exec (and their kin) or NATS, or calls
// time.Now, time.Sleep and the like.
func TestDecisionCodeIsPure(t *testing.T) {
	dir := root(t)
	for _, v := range violations(t, dir, module, Pure) {
		t.Error(v)
	}
}

// The check finds what it is for: an impure package under testdata, pure
// by import but not by deed, and importing one that is neither.
func TestPurityCheckFindsImpureCode(t *testing.T) {
	got := violations(t, filepath.Join(root(t), "internal", "purity", "testdata"), module+"/internal/purity/testdata", []string{"impure"})
	want := []string{
		`impure (via impure/deep) imports "os"`,
		`impure/deep/deep.go:10: calls time.Since`,
		`impure/impure.go:11: calls time.Now`,
	}
	if !slices.Equal(got, want) {
		t.Fatalf("found:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// violations walks pkgs (folders under dir, whose import paths are
// prefix/folder) and the packages under prefix they import, and lists what
// makes each impure, sorted.
func violations(t *testing.T, dir, prefix string, pkgs []string) []string {
	t.Helper()
	var out []string
	seen := map[string]bool{}
	var walk func(pkg, via string)
	walk = func(pkg, via string) {
		if seen[pkg] {
			return
		}
		seen[pkg] = true
		bp, err := build.Default.ImportDir(filepath.Join(dir, filepath.FromSlash(pkg)), 0)
		if err != nil {
			t.Fatalf("%s: %v", pkg, err)
		}
		name := pkg
		if via != "" {
			name = via + " (via " + pkg + ")"
		}
		for _, imp := range bp.Imports {
			switch {
			case forbidden(imp):
				out = append(out, name+" imports "+strconv.Quote(imp))
			case strings.HasPrefix(imp, prefix+"/"):
				next := via
				if next == "" {
					next = pkg
				}
				walk(strings.TrimPrefix(imp, prefix+"/"), next)
			}
		}
		for _, f := range bp.GoFiles {
			out = append(out, clockCalls(t, filepath.Join(bp.Dir, f), path.Join(pkg, f))...)
		}
	}
	for _, p := range pkgs {
		walk(p, "")
	}
	slices.Sort(out)
	return out
}

// clockCalls lists the calls of the time package's clock functions in a
// file (under whatever name it imports time as).
func clockCalls(t *testing.T, file, name string) []string {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, file, nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	timeName := ""
	for _, imp := range f.Imports {
		if p, _ := strconv.Unquote(imp.Path.Value); p == "time" {
			timeName = "time"
			if imp.Name != nil {
				timeName = imp.Name.Name
			}
		}
	}
	if timeName == "" {
		return nil
	}
	var out []string
	ast.Inspect(f, func(n ast.Node) bool {
		sel, ok := n.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		if x, ok := sel.X.(*ast.Ident); ok && x.Name == timeName && slices.Contains(clockFuncs, sel.Sel.Name) {
			out = append(out, name+":"+strconv.Itoa(fset.Position(sel.Pos()).Line)+": calls time."+sel.Sel.Name)
		}
		return true
	})
	return out
}
