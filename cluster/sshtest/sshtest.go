// Package sshtest runs real OpenSSH servers on loopback ports for tests of
// the SSH bootstrap: each stands for a host with its own host key.
package sshtest

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// Server is a real OpenSSH server on a loopback port, standing for a host:
// its own host key, its own directory, key authentication only.
type Server struct {
	Port    int
	Dir     string
	HostKey ssh.PublicKey
}

// NewKey writes an ed25519 private key in OpenSSH format and returns its
// public half.
func NewKey(t *testing.T, path string) ssh.PublicKey {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	block, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
		t.Fatal(err)
	}
	p, _ := ssh.NewPublicKey(pub)
	return p
}

// Start starts sshd accepting clientKey; it is stopped at the test's
// end. Tests that need it skip where OpenSSH's server is not installed
// (.ci/run installs it).
func Start(t *testing.T, clientKey ssh.PublicKey) *Server {
	t.Helper()
	bin := "/usr/sbin/sshd"
	if _, err := os.Stat(bin); err != nil {
		t.Skip("OpenSSH server not installed (.ci/run installs openssh-server)")
	}
	if os.Geteuid() != 0 {
		t.Skip("sshd for the tests runs as root, as in CI")
	}
	os.MkdirAll("/run/sshd", 0o755) // its privilege separation directory
	dir := t.TempDir()
	s := &Server{Dir: dir, HostKey: NewKey(t, filepath.Join(dir, "host_key"))}
	if err := os.WriteFile(filepath.Join(dir, "authorized_keys"), ssh.MarshalAuthorizedKey(clientKey), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.Port = l.Addr().(*net.TCPAddr).Port
	l.Close()
	// The host's user has a home of its own, as on another machine: the
	// shell each session starts reads that home's rc files, not those of
	// the machine running the tests (where pyenv's or conda's setup would
	// cost every session half a second of CPU), and what evolve writes
	// under ~ stays in the test's folder.
	home := filepath.Join(dir, "home")
	if err := os.Mkdir(home, 0o700); err != nil {
		t.Fatal(err)
	}
	cfg := fmt.Sprintf(`Port %d
ListenAddress 127.0.0.1
HostKey %s/host_key
PidFile %s/sshd.pid
AuthorizedKeysFile %s/authorized_keys
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
UsePAM no
PermitRootLogin prohibit-password
StrictModes no
AllowTcpForwarding yes
Subsystem sftp internal-sftp
LogLevel ERROR
SetEnv HOME=%s
`, s.Port, dir, dir, dir, home)
	if err := os.WriteFile(filepath.Join(dir, "sshd_config"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-D", "-e", "-f", filepath.Join(dir, "sshd_config"))
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(s.Port))
		if err == nil {
			c.Close()
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("sshd did not start: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// KnownHostsLine is the known_hosts line for s.
func (s *Server) KnownHostsLine() string {
	return knownhosts.Line([]string{knownhosts.Normalize("127.0.0.1:" + strconv.Itoa(s.Port))}, s.HostKey)
}

// StartMute listens on a loopback port that accepts connections and never
// answers them, as a hung host or an sshd at MaxStartups does. It returns
// the port and a stop that closes it (called at the test's end too).
func StartMute(t *testing.T) (port int, stop func()) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var held []net.Conn
	stopped := false
	stop = func() {
		l.Close()
		mu.Lock()
		defer mu.Unlock()
		stopped = true
		for _, c := range held {
			c.Close()
		}
		held = nil
	}
	t.Cleanup(stop)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			if stopped { // accepted as it stopped: close it, as stop did the rest
				c.Close()
			} else {
				held = append(held, c)
			}
			mu.Unlock()
		}
	}()
	return l.Addr().(*net.TCPAddr).Port, stop
}
