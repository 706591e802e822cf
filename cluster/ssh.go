package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/kevinburke/ssh_config"
	"github.com/pkg/sftp"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"
	"golang.org/x/crypto/ssh/knownhosts"
)

// Conn is a session with one host: commands and file uploads.
type Conn interface {
	// Run runs a shell command and returns its standard output; a failure
	// carries its standard error.
	Run(ctx context.Context, cmd string) (string, error)
	// Stream runs a shell command, writing its standard output to w as it
	// comes, until it ends or ctx does (then it returns nil).
	Stream(ctx context.Context, cmd string, w io.Writer) error
	// Upload writes r to path (through a temporary file renamed into
	// place) with mode.
	Upload(ctx context.Context, r io.Reader, path string, mode os.FileMode) error
	// LocalAddr is this machine's address as the host sees it.
	LocalAddr() string
	Close() error
}

// SSHOptions configure connections.
type SSHOptions struct {
	KnownHosts string // default ~/.ssh/known_hosts
	// AcceptNewHostKeys trusts a host seen for the first time and records
	// its key (trust on first use); a changed key always fails.
	AcceptNewHostKeys bool
	Timeout           time.Duration // dial timeout; default 10 s
	// SSHConfig is OpenSSH's client config (default ~/.ssh/config; "none"
	// ignores it): a host's address may be an alias there, whose HostName,
	// User, Port, IdentityFile and ProxyJump fill what the cluster file
	// leaves unset.
	SSHConfig string
}

// resolve applies the SSH client config to h.
func resolve(h Host, path string) (Host, error) {
	if path == "none" {
		return h, nil
	}
	if path == "" {
		home, _ := os.UserHomeDir()
		path = filepath.Join(home, ".ssh", "config")
	}
	f, err := os.Open(expandHome(path))
	if errors.Is(err, os.ErrNotExist) {
		return withLocalUser(h), nil
	}
	if err != nil {
		return h, err
	}
	defer f.Close()
	cfg, err := ssh_config.Decode(f)
	if err != nil {
		return h, fmt.Errorf("%s: %w", path, err)
	}
	alias := h.Address
	get := func(key string) string { v, _ := cfg.Get(alias, key); return v }
	if v := get("HostName"); v != "" {
		h.Address = strings.ReplaceAll(v, "%h", alias)
	}
	if h.User == "" {
		h.User = get("User")
	}
	if v := get("Port"); v != "" && h.Port == 22 {
		h.Port, _ = strconv.Atoi(v)
	}
	if v := get("IdentityFile"); v != "" && h.KeyPath == "" {
		h.KeyPath = v
	}
	if v := get("ProxyJump"); v != "" && v != "none" && h.Bastion == nil {
		b := &Bastion{Port: 22}
		hostPort := v
		if u, rest, ok := strings.Cut(v, "@"); ok {
			b.User, hostPort = u, rest
		}
		if host, port, err := net.SplitHostPort(hostPort); err == nil {
			b.Address = host
			b.Port, _ = strconv.Atoi(port)
		} else {
			b.Address = hostPort
		}
		h.Bastion = b
	}
	return withLocalUser(h), nil
}

// withLocalUser defaults the SSH user to the local one, as ssh does.
func withLocalUser(h Host) Host {
	if h.User == "" {
		h.User = os.Getenv("USER")
	}
	return h
}

// HostKeyError is a host key that does not match the one known.
type HostKeyError struct {
	Host, KnownHosts  string
	Got, Want, WantAt string // fingerprints, and where the known one is recorded
	Unknown           bool
}

func (e *HostKeyError) Error() string {
	if e.Unknown {
		return fmt.Sprintf("host key of %s is not known (%s, fingerprint %s): check the fingerprint with the host's owner, then run again with --accept-new-host-keys, or add it with: ssh-keyscan %s >> %s",
			e.Host, e.KnownHosts, e.Got, strings.Split(e.Host, ":")[0], e.KnownHosts)
	}
	return fmt.Sprintf("HOST KEY MISMATCH for %s: it presents %s but %s records %s (%s). Someone may be intercepting the connection, or the host was reinstalled; if you know which, remove the old key with: ssh-keygen -R %s -f %s",
		e.Host, e.Got, e.KnownHosts, e.Want, e.WantAt, strings.Split(e.Host, ":")[0], e.KnownHosts)
}

// Resolver returns the address resolution of connections made with opt: a
// host's address as ~/.ssh/config names it (for UpOptions.Resolve).
func Resolver(opt SSHOptions) func(Host) Host {
	return func(h Host) Host {
		if r, err := resolve(h, opt.SSHConfig); err == nil {
			return r
		}
		return h
	}
}

// SSHDialer dials hosts with opt, for UpOptions.Dial.
func SSHDialer(opt SSHOptions) func(context.Context, Host) (Conn, error) {
	return func(ctx context.Context, h Host) (Conn, error) { return DialSSH(ctx, h, opt) }
}

// DialSSH connects to a host, through its bastion if it has one.
func DialSSH(ctx context.Context, h Host, opt SSHOptions) (Conn, error) {
	if opt.Timeout <= 0 {
		opt.Timeout = 10 * time.Second
	}
	h, err := resolve(h, opt.SSHConfig)
	if err != nil {
		return nil, err
	}
	kh := opt.KnownHosts
	if kh == "" {
		home, _ := os.UserHomeDir()
		kh = filepath.Join(home, ".ssh", "known_hosts")
	}
	hostAddr := net.JoinHostPort(h.Address, strconv.Itoa(h.Port))
	var base *ssh.Client
	// dial opens an SSH client to addr: directly, or through the bastion
	// once there is one.
	dial := func(addr string, cfg *ssh.ClientConfig) (*ssh.Client, error) {
		var c net.Conn
		var err error
		if base == nil {
			d := net.Dialer{Timeout: opt.Timeout}
			c, err = d.DialContext(ctx, "tcp", addr)
		} else {
			c, err = base.DialContext(ctx, "tcp", addr)
		}
		if err != nil {
			return nil, err
		}
		// The handshake has no deadline of its own: a host that accepts
		// the connection and never answers (an sshd at MaxStartups, a
		// hung machine) would hold the bootstrap forever. Closing the
		// connection at the timeout, or when the caller gives up, ends it.
		hctx, cancel := context.WithTimeout(ctx, opt.Timeout)
		defer cancel()
		stop := context.AfterFunc(hctx, func() { c.Close() })
		sc, chans, reqs, err := ssh.NewClientConn(c, addr, cfg)
		if !stop() {
			if err == nil {
				sc.Close()
			}
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("no SSH handshake from %s within %v: %w", addr, opt.Timeout, context.DeadlineExceeded)
		}
		if err != nil {
			c.Close()
			return nil, err
		}
		return ssh.NewClient(sc, chans, reqs), nil
	}
	if b := h.Bastion; b != nil {
		cfg, err := clientConfig(or(b.User, h.User), or(b.KeyPath, h.KeyPath), kh, opt)
		if err != nil {
			return nil, err
		}
		addr := net.JoinHostPort(b.Address, strconv.Itoa(b.Port))
		if base, err = dial(addr, cfg); err != nil {
			return nil, fmt.Errorf("bastion %s: %w", addr, err)
		}
	}
	cfg, err := clientConfig(h.User, h.KeyPath, kh, opt)
	if err != nil {
		return nil, err
	}
	c, err := dial(hostAddr, cfg)
	if err != nil {
		if base != nil {
			base.Close()
		}
		return nil, err
	}
	return &sshConn{c: c, base: base}, nil
}

// clientConfig authenticates with the key file and the ssh-agent, and
// checks host keys against known_hosts.
func clientConfig(user, keyPath, knownHostsPath string, opt SSHOptions) (*ssh.ClientConfig, error) {
	var auth []ssh.AuthMethod
	if keyPath != "" {
		b, err := os.ReadFile(expandHome(keyPath))
		if err != nil {
			return nil, fmt.Errorf("SSH key: %w", err)
		}
		signer, err := ssh.ParsePrivateKey(b)
		if err != nil {
			return nil, fmt.Errorf("SSH key %s: %w (a key with a passphrase goes through ssh-agent)", keyPath, err)
		}
		auth = append(auth, ssh.PublicKeys(signer))
	}
	if sock := os.Getenv("SSH_AUTH_SOCK"); sock != "" {
		if c, err := net.Dial("unix", sock); err == nil {
			auth = append(auth, ssh.PublicKeysCallback(agent.NewClient(c).Signers))
		}
	}
	if len(auth) == 0 {
		return nil, errors.New("no SSH key: set keyPath or run an ssh-agent")
	}
	if _, err := os.Stat(knownHostsPath); errors.Is(err, os.ErrNotExist) {
		os.MkdirAll(filepath.Dir(knownHostsPath), 0o700)
		if err := os.WriteFile(knownHostsPath, nil, 0o600); err != nil {
			return nil, err
		}
	}
	check, err := knownhosts.New(knownHostsPath)
	if err != nil {
		return nil, fmt.Errorf("known hosts %s: %w", knownHostsPath, err)
	}
	cb := func(hostname string, remote net.Addr, key ssh.PublicKey) error {
		err := check(hostname, remote, key)
		var ke *knownhosts.KeyError
		if !errors.As(err, &ke) {
			return err
		}
		he := &HostKeyError{Host: hostname, KnownHosts: knownHostsPath, Got: ssh.FingerprintSHA256(key), Unknown: len(ke.Want) == 0}
		if !he.Unknown {
			he.Want = ssh.FingerprintSHA256(ke.Want[0].Key)
			he.WantAt = fmt.Sprintf("%s:%d", ke.Want[0].Filename, ke.Want[0].Line)
			return he
		}
		if !opt.AcceptNewHostKeys {
			return he
		}
		// Trust on first use, recorded.
		f, err := os.OpenFile(knownHostsPath, os.O_APPEND|os.O_WRONLY, 0o600)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = fmt.Fprintln(f, knownhosts.Line([]string{knownhosts.Normalize(hostname)}, key))
		return err
	}
	return &ssh.ClientConfig{User: user, Auth: auth, HostKeyCallback: cb, Timeout: opt.Timeout}, nil
}

func expandHome(p string) string {
	if rest, ok := strings.CutPrefix(p, "~/"); ok {
		home, _ := os.UserHomeDir()
		return filepath.Join(home, rest)
	}
	return p
}

type sshConn struct {
	c, base *ssh.Client
}

func (s *sshConn) Run(ctx context.Context, cmd string) (string, error) {
	sess, err := s.c.NewSession()
	if err != nil {
		return "", err
	}
	defer sess.Close()
	var out, errb bytes.Buffer
	sess.Stdout, sess.Stderr = &out, &errb
	done := make(chan error, 1)
	go func() { done <- sess.Run(cmd) }()
	select {
	case err = <-done:
	case <-ctx.Done():
		sess.Signal(ssh.SIGKILL)
		return out.String(), ctx.Err()
	}
	if err != nil {
		msg := strings.TrimSpace(errb.String())
		if msg == "" {
			msg = strings.TrimSpace(out.String())
		}
		return out.String(), fmt.Errorf("%w: %s", err, msg)
	}
	return out.String(), nil
}

func (s *sshConn) Stream(ctx context.Context, cmd string, w io.Writer) error {
	sess, err := s.c.NewSession()
	if err != nil {
		return err
	}
	defer sess.Close()
	var errb bytes.Buffer
	sess.Stdout, sess.Stderr = w, &errb
	done := make(chan error, 1)
	go func() { done <- sess.Run(cmd) }()
	select {
	case err = <-done:
	case <-ctx.Done():
		// Closing the session closes the command's output: a tail -F
		// there ends at its next write.
		sess.Signal(ssh.SIGTERM)
		return nil
	}
	if err != nil {
		return fmt.Errorf("%w: %s", err, strings.TrimSpace(errb.String()))
	}
	return nil
}

func (s *sshConn) Upload(ctx context.Context, r io.Reader, path string, mode os.FileMode) (err error) {
	c, err := sftp.NewClient(s.c)
	if err != nil {
		return fmt.Errorf("sftp: %w", err)
	}
	defer c.Close()
	// A binary takes a while over a slow link: giving up closes the
	// session, which ends the copy (the file at path is untouched; the
	// next upload overwrites the partial one beside it).
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer func() {
		if !stop() && err != nil {
			err = ctx.Err()
		}
	}()
	if err := c.MkdirAll(filepath.Dir(path)); err != nil {
		return err
	}
	tmp := path + ".upload"
	f, err := c.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC)
	if err != nil {
		return err
	}
	// The mode before the content: a private file is never readable by
	// others, not even while it is written.
	if err := c.Chmod(tmp, mode); err != nil {
		f.Close()
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return c.PosixRename(tmp, path)
}

func (s *sshConn) LocalAddr() string {
	if s.base != nil {
		return ""
	}
	host, _, _ := net.SplitHostPort(s.c.LocalAddr().String())
	return host
}

func (s *sshConn) Close() error {
	err := s.c.Close()
	if s.base != nil {
		s.base.Close()
	}
	return err
}
