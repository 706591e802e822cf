package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A file of secrets (API keys, a token, NATS credentials, a TLS key) that
// other users may read is refused, as ssh refuses such a private key, and
// the error says how to fix it (issue #56: such files were taken
// silently); --api-key on the command line is warned about, as the other
// secret flags are.
func TestSecretsOthersMayReadAreRefused(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(content), mode)
		os.Chmod(p, mode)
		return p
	}
	keys := write("keys", "sk-evolve-1\n", 0o644)
	token := write("token", "t0k\n", 0o640)
	creds := write("creds", "-----BEGIN NATS USER JWT-----\nx\n------END NATS USER JWT------\n-----BEGIN USER NKEY SEED-----\ny\n------END USER NKEY SEED------\n", 0o644)
	tlsKey := write("tls.key", "not read", 0o604)
	for _, c := range []struct {
		args []string
		file string
	}{
		{[]string{"orchestrator", "--api-key-file", keys}, keys},
		{[]string{"up", "--api-key-file", keys, "--engines", "1"}, keys},
		{[]string{"orchestrator", "--token-file", token}, token},
		{[]string{"orchestrator", "--nats-token-file", token}, token},
		{[]string{"engine", "--nats", "nats://127.0.0.1:1", "--nats-token-file", token}, token},
		{[]string{"engine", "--nats", "nats://127.0.0.1:1", "--nats-creds", creds}, creds},
		{[]string{"orchestrator", "--tls-cert-file", tlsKey, "--tls-key-file", tlsKey}, tlsKey},
	} {
		out, code := runBin(t, []string{"XDG_STATE_HOME=" + dir}, c.args...)
		if code != 2 || !strings.Contains(out, "other users of this machine may read "+c.file) || !strings.Contains(out, "chmod 600 "+c.file) {
			t.Errorf("evolve %s: exit %d\n%s", strings.Join(c.args, " "), code, out)
		}
	}
	// On the command line: warned, before anything else is said.
	for _, args := range [][]string{{"up", "--api-key", "sk-evolve-1", "--engines", "0"}, {"orchestrator", "--api-key", "sk-evolve-1", "--planner", "sometimes"},
		{"bench", "--api-key", "sk-evolve-1", "--duration", "-1s"}} {
		out, _ := runBin(t, []string{"XDG_STATE_HOME=" + dir}, args...)
		if !strings.Contains(out, "--api-key on the command line shows in ps to every user of this machine") {
			t.Errorf("evolve %s: no warning\n%s", strings.Join(args, " "), out)
		}
	}
}
