package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/evolvellm/evolve/cluster"
)

func TestUpDryRunValidatesTheClusterFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "cluster.yaml")
	write := func(s string) {
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(`apiVersion: evolve/v1
kind: Cluster
metadata: {name: lab}
spec:
  defaults: {user: ubuntu, engine: {profile: gb300-kimi-k2}}
  hosts:
    - {name: gpu-01, address: 10.0.0.11, role: prefill}
    - {name: gpu-02, address: 10.0.0.12, bastion: {address: jump.lab}}
`)
	out, code := runBinOut(t, nil, "up", "-f", path, "--dry-run", "-o", "json")
	var res struct {
		Valid bool `json:"valid"`
		Hosts []struct {
			Host  string   `json:"host"`
			SSH   string   `json:"ssh"`
			Steps []string `json:"steps"`
		} `json:"hosts"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &res) != nil || !res.Valid || len(res.Hosts) != 3 {
		t.Fatalf("dry run: exit %d\n%s", code, out)
	}
	if res.Hosts[1].SSH != "ubuntu@10.0.0.12:22 via ubuntu@jump.lab:22" || res.Hosts[2].Host != "local" || !strings.Contains(strings.Join(res.Hosts[2].Steps, "\n"), "start the orchestrator") {
		t.Fatalf("plan %+v", res.Hosts)
	}
	// A bad file: exit 2, every problem with its line.
	write(`apiVersion: evolve/v2
kind: Cluster
metadata: {name: lab}
spec:
  hosts:
    - {name: gpu-01, address: 10.0.0.11, user: u, engine: {backend: tensorrt}}
`)
	out, code = runBinOut(t, nil, "up", "-f", path, "--dry-run")
	for _, want := range []string{"cluster.yaml:1: apiVersion", "cluster.yaml:6: spec.hosts[0].engine.backend", "want sim or vllm"} {
		if code != 2 || !strings.Contains(out, want) {
			t.Fatalf("bad file: exit %d, want %q in\n%s", code, want, out)
		}
	}
	// The orchestrator on a host: the dry run says it starts there.
	write(`apiVersion: evolve/v1
kind: Cluster
metadata: {name: lab}
spec:
  orchestrator: {host: gpu-01}
  hosts:
    - {name: gpu-01, address: 10.0.0.11, user: u, engine: {profile: tiny}}
`)
	if out, code := runBinOut(t, nil, "up", "-f", path, "--dry-run"); code != 0 || !strings.Contains(out, "start the orchestrator (router :8000") {
		t.Fatalf("orchestrator on a host: exit %d\n%s", code, out)
	}
	if out, code := runBinOut(t, nil, "up", "-f", filepath.Join(dir, "missing.yaml"), "--dry-run"); code != 2 || !strings.Contains(out, "no such file") {
		t.Fatalf("missing file: exit %d %s", code, out)
	}
}

// On a terminal each host keeps one line, redrawn in place; elsewhere a
// plain line per change.
func TestHostProgressLines(t *testing.T) {
	f := &cluster.File{}
	f.Spec.Hosts = []cluster.Host{{Name: "gpu-01"}, {Name: "gpu-02"}}
	var b strings.Builder
	p := newHostProgress(&b, f)
	p.update("gpu-02", "upload", "")
	if b.String() != "gpu-02           upload\n" {
		t.Fatalf("plain: %q", b.String())
	}
	b.Reset()
	p.tty = true
	p.update("gpu-01", "connect", "u@h:22")
	p.update("gpu-02", "start", "started")
	want := "\x1b[2Kgpu-01           connect u@h:22\n\x1b[2Kgpu-02           waiting\n" +
		"\x1b[2A\x1b[2Kgpu-01           connect u@h:22\n\x1b[2Kgpu-02           start started\n"
	if b.String() != want {
		t.Fatalf("terminal:\n%q\nwant\n%q", b.String(), want)
	}
}

// The README's example cluster file is valid, and its dry run says what
// each host would go through.
func TestREADMEClusterFileIsValid(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(readme), "```yaml\n")
	example, _, ok2 := strings.Cut(rest, "```")
	if !ok || !ok2 || !strings.Contains(example, "kind: Cluster") {
		t.Fatal("no example cluster file in the README")
	}
	file := filepath.Join(t.TempDir(), "lab.yaml")
	os.WriteFile(file, []byte(example), 0o600)
	out, code := runBinOut(t, nil, "up", "-f", file, "--dry-run", "-o", "json")
	var res struct {
		Valid bool `json:"valid"`
		Hosts []struct {
			Host  string   `json:"host"`
			Steps []string `json:"steps"`
		} `json:"hosts"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &res) != nil || !res.Valid || len(res.Hosts) < 2 || len(res.Hosts[0].Steps) == 0 {
		t.Fatalf("the README's cluster file: exit %d\n%s", code, out)
	}
}

// So is the small one in 'evolve up --help'.
func TestHelpClusterFileIsValid(t *testing.T) {
	help, _ := runBinOut(t, nil, "up", "--help")
	_, rest, ok := strings.Cut(help, "  apiVersion: evolve/v1\n")
	example, _, ok2 := strings.Cut(rest, "\n\n")
	if !ok || !ok2 {
		t.Fatalf("no example cluster file in up --help:\n%s", help)
	}
	var lines []string
	for _, l := range strings.Split("  apiVersion: evolve/v1\n"+example, "\n") {
		lines = append(lines, strings.TrimPrefix(l, "  "))
	}
	file := filepath.Join(t.TempDir(), "lab.yaml")
	os.WriteFile(file, []byte(strings.Join(lines, "\n")+"\n"), 0o600)
	if out, code := runBinOut(t, nil, "up", "-f", file, "--dry-run"); code != 0 || !strings.Contains(out, "valid") {
		t.Fatalf("the help's cluster file: exit %d\n%s", code, out)
	}
}
