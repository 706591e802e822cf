package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// maxFuncLines bounds a function of the commands: a command parses,
// validates, runs (in the libraries) and prints, each a function a reader
// holds in mind.
const maxFuncLines = 120

// The commands stay thin: no function here is longer than maxFuncLines.
func TestCommandsAreThin(t *testing.T) {
	files, _ := filepath.Glob("*.go")
	fset := token.NewFileSet()
	checked := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range af.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok {
				continue
			}
			checked++
			if n := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1; n > maxFuncLines {
				t.Errorf("%s: %s is %d lines (at most %d): split it into parse, validate, run and print", f, fd.Name.Name, n, maxFuncLines)
			}
		}
	}
	if checked < 100 {
		t.Fatalf("only %d functions found: is the test running in cmd/evolve?", checked)
	}
}
