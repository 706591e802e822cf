package purity

import (
	"go/build"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The import table of docs/architecture.md ("Packages and what each may
// import") is the law of the layout: every package of the module has a
// row, and imports of the module only what its row names. In the style of
// Go's go/build/deps_test.go, but the table is the document a reader
// already reads.

// importRules reads the table's rows: each package named in a row's first
// column, and what it may import (nil: everything; empty: the standard
// library and third-party modules only).
func importRules(doc string) (map[string][]string, error) {
	i := strings.Index(doc, "## Packages and what each may import")
	if i < 0 {
		return nil, os.ErrNotExist
	}
	rules := map[string][]string{}
	tick := regexp.MustCompile("`([^`]+)`")
	for _, line := range strings.Split(doc[i:], "\n")[1:] {
		if strings.HasPrefix(line, "## ") {
			break
		}
		cols := strings.Split(line, "|")
		if len(cols) < 5 || !strings.Contains(cols[1], "`") {
			continue
		}
		var may []string
		if strings.TrimSpace(cols[3]) != "everything" {
			may = []string{}
			for _, m := range tick.FindAllStringSubmatch(cols[3], -1) {
				may = append(may, m[1])
			}
		}
		for _, m := range tick.FindAllStringSubmatch(cols[1], -1) {
			rules[m[1]] = may
		}
	}
	return rules, nil
}

// importViolations lists, sorted, the packages under dir (import paths
// prefix/folder) with no row, and each import of the module a row does
// not allow; a package's own test files are not held to it.
func importViolations(t *testing.T, dir, prefix string, rules map[string][]string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		if name := d.Name(); p != dir && (name == "testdata" || strings.HasPrefix(name, ".")) {
			return filepath.SkipDir
		}
		bp, err := build.Default.ImportDir(p, 0)
		if err != nil {
			return nil // no Go files here
		}
		rel, _ := filepath.Rel(dir, p)
		pkg := filepath.ToSlash(rel)
		may, ok := rules[pkg]
		if !ok {
			out = append(out, pkg+": no row in the import table")
			return nil
		}
		for _, imp := range bp.Imports {
			own, ok := strings.CutPrefix(imp, prefix+"/")
			if !ok || may == nil || slices.Contains(may, own) {
				continue
			}
			out = append(out, pkg+" imports "+own+", which its row does not name")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

// TestImportsFollowTheArchitecture fails when a package imports a package
// of the module its row in docs/architecture.md does not name, or has no
// row.
func TestImportsFollowTheArchitecture(t *testing.T) {
	dir := root(t)
	doc, err := os.ReadFile(filepath.Join(dir, "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	rules, err := importRules(string(doc))
	if err != nil || len(rules) < 10 {
		t.Fatalf("the import table of docs/architecture.md: %v (%d rows read)", err, len(rules))
	}
	for _, v := range importViolations(t, dir, module, rules) {
		t.Error(v)
	}
}

// The check finds a forbidden import and a package with no row: the
// testdata module's "impure" imports "impure/deep", which a table that
// allows it nothing refuses.
func TestImportCheckFindsAForbiddenImport(t *testing.T) {
	dir := filepath.Join(root(t), "internal", "purity", "testdata")
	table := "## Packages and what each may import\n\n| package | what | may import |\n| --- | --- | --- |\n" +
		"| `impure` | x | standard library |\n"
	rules, err := importRules(table)
	if err != nil {
		t.Fatal(err)
	}
	got := importViolations(t, dir, module+"/internal/purity/testdata", rules)
	want := []string{"impure imports impure/deep, which its row does not name", "impure/deep: no row in the import table"}
	if !slices.Equal(got, want) {
		t.Fatalf("found:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	rules["impure"], rules["impure/deep"] = []string{"impure/deep"}, []string{}
	if got := importViolations(t, dir, module+"/internal/purity/testdata", rules); len(got) != 0 {
		t.Fatalf("with both rows allowing it: %v", got)
	}
}
