package cluster

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/evolvellm/evolve/cluster/sshtest"
)

func TestSSHChecksHostKeysRunsAndUploads(t *testing.T) {
	dir := t.TempDir()
	keyPath := filepath.Join(dir, "id_ed25519")
	s := sshtest.Start(t, sshtest.NewKey(t, keyPath))
	kh := filepath.Join(dir, "known_hosts")
	h := Host{Name: "h1", Address: "127.0.0.1", Port: s.Port, User: "root", KeyPath: keyPath}
	ctx := context.Background()
	t.Setenv("SSH_AUTH_SOCK", "")

	// Unknown host: refused, nothing recorded, and the message says how
	// to check and accept it.
	_, err := DialSSH(ctx, h, SSHOptions{KnownHosts: kh})
	var he *HostKeyError
	if !errors.As(err, &he) || !he.Unknown || !strings.Contains(err.Error(), "--accept-new-host-keys") {
		t.Fatalf("unknown host: %v", err)
	}
	if b, _ := os.ReadFile(kh); len(b) != 0 {
		t.Fatalf("known_hosts written without consent: %s", b)
	}
	// Trust on first use, when asked: the key is recorded.
	c, err := DialSSH(ctx, h, SSHOptions{KnownHosts: kh, AcceptNewHostKeys: true})
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(kh); !strings.Contains(string(b), strings.TrimSpace(s.KnownHostsLine())) {
		t.Fatalf("known_hosts after accepting: %q, want %q", b, s.KnownHostsLine())
	}
	out, err := c.Run(ctx, "echo hello; echo to-stderr >&2")
	if err != nil || out != "hello\n" {
		t.Fatalf("run: %q %v", out, err)
	}
	if _, err := c.Run(ctx, "echo broken >&2; exit 3"); err == nil || !strings.Contains(err.Error(), "broken") {
		t.Fatalf("a failing command: %v", err)
	}
	target := filepath.Join(dir, "remote", "sub", "file")
	if err := c.Upload(ctx, strings.NewReader("payload"), target, 0o750); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(target); err != nil || string(b) != "payload" {
		t.Fatalf("uploaded %q %v", b, err)
	}
	if fi, _ := os.Stat(target); fi.Mode().Perm() != 0o750 {
		t.Fatalf("mode %v", fi.Mode())
	}
	if c.LocalAddr() != "127.0.0.1" {
		t.Fatalf("local address %q", c.LocalAddr())
	}
	c.Close()

	// A changed key fails hard, naming both fingerprints and the fix, even
	// with --accept-new-host-keys.
	other := sshtest.Start(t, sshtest.NewKey(t, filepath.Join(dir, "unused")))
	line := strings.Replace(other.KnownHostsLine(), "]:"+itoa(other.Port), "]:"+itoa(s.Port), 1)
	os.WriteFile(kh, []byte(line+"\n"), 0o600)
	_, err = DialSSH(ctx, h, SSHOptions{KnownHosts: kh, AcceptNewHostKeys: true})
	if !errors.As(err, &he) || he.Unknown || !strings.Contains(err.Error(), "MISMATCH") || !strings.Contains(err.Error(), "ssh-keygen -R") || he.Got == he.Want {
		t.Fatalf("changed key: %v", err)
	}
}

// A host behind a bastion: the connection hops through it.
func TestSSHThroughABastion(t *testing.T) {
	dir := t.TempDir()
	keyPath := filepath.Join(dir, "id_ed25519")
	pub := sshtest.NewKey(t, keyPath)
	jump, target := sshtest.Start(t, pub), sshtest.Start(t, pub)
	kh := filepath.Join(dir, "known_hosts")
	os.WriteFile(kh, []byte(jump.KnownHostsLine()+"\n"+target.KnownHostsLine()+"\n"), 0o600)
	t.Setenv("SSH_AUTH_SOCK", "")
	h := Host{Name: "h", Address: "127.0.0.1", Port: target.Port, User: "root", KeyPath: keyPath,
		Bastion: &Bastion{Address: "127.0.0.1", Port: jump.Port}}
	c, err := DialSSH(context.Background(), h, SSHOptions{KnownHosts: kh})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if out, err := c.Run(context.Background(), "echo via"); err != nil || out != "via\n" {
		t.Fatalf("%q %v", out, err)
	}
	if c.LocalAddr() != "" {
		t.Fatal("behind a bastion the host's view of this machine is unknown")
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// A host's address may be an alias of ~/.ssh/config: its HostName, Port,
// User and IdentityFile are used where the cluster file is silent.
func TestSSHHonoursTheClientConfig(t *testing.T) {
	dir := t.TempDir()
	keyPath := filepath.Join(dir, "id_ed25519")
	s := sshtest.Start(t, sshtest.NewKey(t, keyPath))
	kh := filepath.Join(dir, "known_hosts")
	os.WriteFile(kh, []byte(s.KnownHostsLine()+"\n"), 0o600)
	cfg := filepath.Join(dir, "config")
	os.WriteFile(cfg, []byte("Host lab-1\n  HostName 127.0.0.1\n  Port "+strconv.Itoa(s.Port)+"\n  User root\n  IdentityFile "+keyPath+"\n"), 0o600)
	t.Setenv("SSH_AUTH_SOCK", "")
	c, err := DialSSH(context.Background(), Host{Name: "h", Address: "lab-1", Port: 22}, SSHOptions{KnownHosts: kh, SSHConfig: cfg})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if out, err := c.Run(context.Background(), "whoami"); err != nil || strings.TrimSpace(out) != "root" {
		t.Fatalf("%q %v", out, err)
	}
	// Without the config the alias means nothing.
	if _, err := DialSSH(context.Background(), Host{Name: "h", Address: "lab-1", Port: 22, User: "root", KeyPath: keyPath}, SSHOptions{KnownHosts: kh, SSHConfig: "none", Timeout: 2e9}); err == nil {
		t.Fatal("dialed an alias with the config off")
	}
}

// A host that accepts the TCP connection and never speaks SSH (an sshd at
// MaxStartups, a hung machine) fails the dial at the timeout, and at once
// when the caller gives up, instead of holding it forever.
func TestSSHHandshakeThatNeverComesTimesOut(t *testing.T) {
	mute, _ := sshtest.StartMute(t)
	dir := t.TempDir()
	keyPath := filepath.Join(dir, "id_ed25519")
	sshtest.NewKey(t, keyPath)
	t.Setenv("SSH_AUTH_SOCK", "")
	h := Host{Name: "mute", Address: "127.0.0.1", Port: mute, User: "root", KeyPath: keyPath}
	opt := SSHOptions{KnownHosts: filepath.Join(dir, "known_hosts"), Timeout: 300 * time.Millisecond}

	done := make(chan error, 1)
	go func() { _, err := DialSSH(context.Background(), h, opt); done <- err }()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "no SSH handshake") {
			t.Fatalf("mute host: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the dial of a mute host never returned")
	}

	opt.Timeout = time.Hour
	ctx, cancel := context.WithCancel(context.Background())
	go func() { _, err := DialSSH(ctx, h, opt); done <- err }()
	time.Sleep(100 * time.Millisecond)
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled dial: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a cancelled dial never returned")
	}
}
