package cluster

import (
	"fmt"
	"reflect"
	"regexp"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// shapeErrors checks a cluster file's fields and values against File's
// shape before it is decoded, and names each problem by its path and
// line, as an operator reads the file: spec.hosts[1].adress: unknown
// field (did you mean address?); spec.defaults.gpus: want a number, got
// "four". (The YAML decoder names Go types and misses the path.)
func shapeErrors(file string, n *yaml.Node, t reflect.Type, at string) []FieldError {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	fail := func(msg string) []FieldError {
		field := at
		if field == "" {
			field = "the file"
		}
		return []FieldError{{File: file, Line: n.Line, Field: field, Msg: msg}}
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil // left empty: the zero value, which validation judges
	}
	switch t.Kind() {
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			return fail("want a mapping of fields, got " + describe(n))
		}
		fields := yamlFields(t)
		var out []FieldError
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Tag == "!!merge" {
				// <<: *anchor (or a list of them) merges mappings here.
				if v.Kind == yaml.SequenceNode {
					for _, m := range v.Content {
						out = append(out, shapeErrors(file, m, t, at)...)
					}
				} else {
					out = append(out, shapeErrors(file, v, t, at)...)
				}
				continue
			}
			p := join(at, k.Value)
			f, ok := fields[k.Value]
			if !ok {
				msg := "unknown field"
				if near := nearest(k.Value, fields); near != "" {
					msg += " (did you mean " + near + "?)"
				}
				out = append(out, FieldError{File: file, Line: k.Line, Field: p, Msg: msg})
				continue
			}
			out = append(out, shapeErrors(file, v, f.Type, p)...)
		}
		return out
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			return fail("want a list, got " + describe(n))
		}
		var out []FieldError
		for i, c := range n.Content {
			out = append(out, shapeErrors(file, c, t.Elem(), fmt.Sprintf("%s[%d]", at, i))...)
		}
		return out
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			return fail("want a mapping, got " + describe(n))
		}
		var out []FieldError
		for i := 0; i+1 < len(n.Content); i += 2 {
			out = append(out, shapeErrors(file, n.Content[i+1], t.Elem(), join(at, n.Content[i].Value))...)
		}
		return out
	}
	if n.Kind != yaml.ScalarNode {
		return fail("want " + kindName(t) + ", got " + describe(n))
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int64, reflect.Int32, reflect.Uint16:
		if _, err := strconv.ParseInt(strings.ReplaceAll(n.Value, "_", ""), 0, 64); err != nil {
			return fail(fmt.Sprintf("want a whole number, got %q", n.Value))
		}
	case reflect.Float64:
		if _, err := strconv.ParseFloat(n.Value, 64); err != nil {
			return fail(fmt.Sprintf("want a number, got %q", n.Value))
		}
	case reflect.Bool:
		if n.Tag != "!!bool" {
			return fail(fmt.Sprintf("want true or false, got %q", n.Value))
		}
	}
	return nil
}

// yamlFields maps a struct's YAML field names to its fields.
func yamlFields(t reflect.Type) map[string]reflect.StructField {
	out := map[string]reflect.StructField{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "-" {
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		out[name] = f
	}
	return out
}

// nearest is the known field a mistyped name most likely meant: the same
// but for case, or within two edits; "" when none is close.
func nearest(name string, fields map[string]reflect.StructField) string {
	best, bestD := "", 3
	for k := range fields {
		if strings.EqualFold(k, name) {
			return k
		}
		if d := editDistance(strings.ToLower(name), strings.ToLower(k)); d < bestD || d == bestD && k < best {
			best, bestD = k, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance of two short strings.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}

func join(at, key string) string {
	if at == "" {
		return key
	}
	return at + "." + key
}

// describe names what a node is, for "want X, got Y".
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	}
	return strconv.Quote(n.Value)
}

// kindName names what a field of type t holds.
func kindName(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Int, reflect.Int64, reflect.Int32, reflect.Uint16, reflect.Float64:
		return "a number"
	case reflect.Bool:
		return "true or false"
	}
	return "a string"
}

// parserLineRE finds the line of a YAML parser error, which yaml.v3 counts
// from 0 (its scanner errors count from 1).
var parserLineRE = regexp.MustCompile(`^yaml: line (\d+): (did not find expected|found undefined tag|found duplicate|found incompatible)`)

// syntaxError says where the YAML of a file is broken, on the line an
// editor shows.
func syntaxError(file string, err error) error {
	msg := err.Error()
	if m := parserLineRE.FindStringSubmatch(msg); m != nil {
		n, _ := strconv.Atoi(m[1])
		msg = strings.Replace(msg, "line "+m[1]+":", "line "+strconv.Itoa(n+1)+":", 1)
	}
	msg = strings.TrimPrefix(msg, "yaml: ")
	if m := lineRE.FindStringSubmatch(msg); m != nil {
		return fmt.Errorf("%s:%s: not valid YAML: %s", file, m[1], stripLine(msg))
	}
	return fmt.Errorf("%s: not valid YAML: %s", file, msg)
}
