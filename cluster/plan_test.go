package cluster

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/evolvellm/evolve/cluster/sshtest"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// writeFile writes a file under dir and returns its path.
func writeFile(t *testing.T, dir, name, text string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// A host whose SSH key this machine does not have, or that names a
// public key in its place, could not be logged in to: the checks say so,
// for the host's key and its jump host's; a key that is there passes.
func TestPreflightChecksTheKeyFiles(t *testing.T) {
	dir := t.TempDir()
	key := filepath.Join(dir, "id_ed25519")
	sshtest.NewKey(t, key)
	pub := writeFile(t, dir, "id_ed25519.pub", "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI test\n")
	notKey := writeFile(t, dir, "notes.txt", "hello\n")
	missing := filepath.Join(dir, "missing")
	kh := writeFile(t, dir, "known_hosts", "")
	opt := SSHOptions{KnownHosts: kh, SSHConfig: "none", AcceptNewHostKeys: true}
	keyChecks := func(h Host) string {
		var keys []string
		for _, c := range Preflight(h, opt) {
			if !strings.Contains(c, "host key") {
				keys = append(keys, c)
			}
		}
		return strings.Join(keys, "\n")
	}
	if got := keyChecks(Host{Name: "a", Address: "h", Port: 22, User: "u", KeyPath: key}); got != "" {
		t.Fatalf("a key that is there: %s", got)
	}
	got := keyChecks(Host{Name: "a", Address: "h", Port: 22, User: "u", KeyPath: missing, Bastion: &Bastion{Address: "j", Port: 22, KeyPath: pub}})
	for _, want := range []string{
		"a: keyPath " + missing + " does not exist on this machine, so the bring-up cannot log in",
		"a: bastion.keyPath " + pub + " is a public key: it takes the private one (" + key + ")",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("checks lack %q:\n%s", want, got)
		}
	}
	if got := keyChecks(Host{Name: "a", Address: "h", Port: 22, User: "u", KeyPath: notKey}); !strings.Contains(got, "is not an SSH private key") {
		t.Errorf("a file that is no key: %s", got)
	}
}

// The dry run's plan is grouped: hosts that are alike share their steps,
// a host's engines are lines of one step, not five steps each, and every
// line fits 80 columns.
func TestPlanGroupsAlikeHostsAndTheirEngines(t *testing.T) {
	f, err := Parse("lab.yaml", []byte(`apiVersion: evolve/v1
kind: Cluster
metadata: {name: lab}
spec:
  defaults: {user: ubuntu, gpus: 8, engine: {backend: vllm, args: [moonshotai/Kimi-K2-Instruct, --tensor-parallel-size, "2"]}}
  hosts:
    - {name: gpu-01, address: 10.0.0.11, engines: 4, role: prefill}
    - {name: gpu-02, address: 10.0.0.12, engines: 4}
    - {name: gpu-03, address: 10.0.0.13, engines: 4}
`))
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("SSH_AUTH_SOCK", "")
	kh := filepath.Join(t.TempDir(), "known_hosts")
	groups := f.PlanGroups(SSHOptions{KnownHosts: kh, SSHConfig: "none"})
	if len(groups) != 3 || strings.Join(groups[1].Hosts, " ") != "gpu-02 gpu-03" || groups[2].Hosts[0] != "local" {
		t.Fatalf("groups %+v", groups)
	}
	var b strings.Builder
	WritePlan(&b, groups, 80)
	out := b.String()
	for _, l := range strings.Split(out, "\n") {
		if n := utf8.RuneCountInString(l); n > 80 && !strings.Contains(l, kh) { // a path is as long as it is
			t.Fatalf("a line of %d columns:\n%s", n, out)
		}
	}
	flat := strings.Join(strings.Fields(out), " ")
	if !strings.Contains(flat, "the host keys of 10.0.0.12:22, 10.0.0.13:22 are not in "+kh) || !strings.Contains(flat, "ssh-keyscan -p 22 10.0.0.12 10.0.0.13 >> "+kh) {
		t.Errorf("the unknown keys of a group are not one line with one ssh-keyscan:\n%s", out)
	}
	if !strings.Contains(flat, "! gpu-02, gpu-03: no SSH key to log in with") || strings.Count(flat, "no SSH key") != 2 {
		t.Errorf("a finding of several hosts is not one line naming them:\n%s", out)
	}
	for _, want := range []string{
		"gpu-01: 4 engines (ubuntu@10.0.0.11:22)",
		"gpu-02, gpu-03: 2 hosts, 4 engines each (ubuntu@10.0.0.12:22, ubuntu@10.0.0.13:22)", // on two lines
		"role the planner's choice",
		"engine 3: port 8103, GPUs 6,7",
		"free port 8100-8103",
		"start each engine on its port",
		"start the orchestrator (router :8000",
	} {
		if !strings.Contains(strings.Join(strings.Fields(out), " "), want) {
			t.Errorf("the plan lacks %q:\n%s", want, out)
		}
	}
	// Twelve engines on three hosts: connected to in two groups, not
	// twelve times over.
	if n := strings.Count(out, "connect over SSH"); n != 2 || len(f.Plan()) != 13 {
		t.Errorf("%d connect steps for 3 hosts in 2 groups:\n%s", n, out)
	}
}

// What can be checked here is: a host key known_hosts does not know (the
// bring-up stops there without --accept-new-host-keys), a jump host's
// too, and no key at all to log in with.
func TestPreflightSaysWhatWouldStopTheBringUp(t *testing.T) {
	dir := t.TempDir()
	known := sshtest.NewKey(t, filepath.Join(dir, "host_key"))
	kh := writeFile(t, dir, "known_hosts", knownhosts.Line([]string{knownhosts.Normalize("10.0.0.11:22")}, known)+"\n"+
		knownhosts.Line([]string{knownhosts.Normalize("jump.lab:22")}, known)+"\n")
	opt := SSHOptions{KnownHosts: kh, SSHConfig: "none"}
	t.Setenv("SSH_AUTH_SOCK", "/agent.sock")
	if got := Preflight(Host{Name: "gpu-01", Address: "10.0.0.11", Port: 22, User: "u"}, opt); len(got) != 0 {
		t.Fatalf("a known host: %q", got)
	}
	got := strings.Join(Preflight(Host{Name: "gpu-02", Address: "10.0.0.12", Port: 2222, User: "u",
		Bastion: &Bastion{Address: "jump.lab", Port: 22}}, opt), "\n")
	if !strings.Contains(got, "gpu-02: the host key of 10.0.0.12:2222 is not in "+kh+", so the bring-up stops there") ||
		!strings.Contains(got, "ssh-keyscan -p 2222 10.0.0.12 >> "+kh) || strings.Contains(got, "jump.lab") {
		t.Fatalf("an unknown host behind a known jump host: %s", got)
	}
	opt.AcceptNewHostKeys = true
	if got := strings.Join(Preflight(Host{Name: "gpu-02", Address: "10.0.0.12", Port: 22, User: "u"}, opt), "\n"); !strings.Contains(got, "--accept-new-host-keys records it on first use") {
		t.Fatalf("with --accept-new-host-keys: %s", got)
	}
	t.Setenv("SSH_AUTH_SOCK", "")
	if got := strings.Join(Preflight(Host{Name: "gpu-01", Address: "10.0.0.11", Port: 22, User: "u"}, opt), "\n"); !strings.Contains(got, "no SSH key to log in with") {
		t.Fatalf("no key, no agent: %s", got)
	}
	// A known_hosts file that is not there knows no host.
	opt.KnownHosts = filepath.Join(dir, "none")
	t.Setenv("SSH_AUTH_SOCK", "/agent.sock")
	if got := Preflight(Host{Name: "h", Address: "10.0.0.11", Port: 22, User: "u"}, opt); len(got) != 1 || !strings.Contains(got[0], "10.0.0.11:22 is not in") {
		t.Fatalf("no known_hosts: %q", got)
	}
}

var _ ssh.PublicKey = probeKey
