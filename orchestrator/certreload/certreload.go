// Package certreload serves a TLS key pair from two files and reads it
// again when either changes, so that a certificate renewed in place
// (cert-manager, certbot, a secret mounted into a pod) is served from the
// next connection on, without a restart; a renewal that does not load (a
// key that does not match, a half-written file) is logged, and the last
// good pair goes on serving. The orchestrator's router, control API and
// event plane serve HTTPS and TLS with it.
package certreload

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
)

// certRecheck is how often a handshake looks at the files again.
const certRecheck = time.Second

// certWarnBefore is how long before its end a certificate is warned of,
// at most every certWarnEvery.
const (
	certWarnBefore = 14 * 24 * time.Hour
	certWarnEvery  = time.Hour
)

// Reloader serves the key pair in two files, reloading it when they
// change.
type Reloader struct {
	certFile, keyFile string
	log               *slog.Logger

	mu      sync.Mutex
	cert    *tls.Certificate
	stamp   []byte // the files' sizes and modification times when loaded
	checked time.Time
	failed  []byte // the stamp whose load failed (logged once)
	warned  time.Time
}

// New loads the pair, refusing one that does not load; with neither file
// it returns nil (plain HTTP), and one file without the other is an error.
func New(certFile, keyFile string, log *slog.Logger) (*Reloader, error) {
	if (certFile == "") != (keyFile == "") {
		return nil, errors.New("TLS needs both a certificate and its key (--tls-cert-file and --tls-key-file)")
	}
	if certFile == "" {
		return nil, nil
	}
	r := &Reloader{certFile: certFile, keyFile: keyFile, log: log}
	stamp, err := r.fileStamp()
	if err != nil {
		return nil, fmt.Errorf("TLS: %w", err)
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("TLS certificate %s and key %s: %w", certFile, keyFile, err)
	}
	r.cert, r.stamp, r.checked = &cert, stamp, time.Now()
	r.warnIfEnding(r.checked)
	return r, nil
}

// NotAfter is when the served certificate ends (zero if unknown).
func (r *Reloader) NotAfter() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cert.Leaf == nil {
		return time.Time{}
	}
	return r.cert.Leaf.NotAfter
}

// Expiry is NotAfter in Unix seconds, for the
// evolve_tls_certificate_expiry_seconds gauge.
func (r *Reloader) Expiry() float64 {
	if end := r.NotAfter(); !end.IsZero() {
		return float64(end.Unix())
	}
	return 0
}

// warnIfEnding logs, at most every certWarnEvery, that the served
// certificate has ended or soon will; r.mu is held (or r is new).
func (r *Reloader) warnIfEnding(now time.Time) {
	leaf := r.cert.Leaf
	if leaf == nil || leaf.NotAfter.Sub(now) > certWarnBefore || now.Sub(r.warned) < certWarnEvery {
		return
	}
	r.warned = now
	if now.After(leaf.NotAfter) {
		r.log.Error("the TLS certificate has expired: clients refuse it; renew it in place", "cert_file", r.certFile, "not_after", leaf.NotAfter)
		return
	}
	r.log.Warn("the TLS certificate expires soon; renew it in place", "cert_file", r.certFile, "not_after", leaf.NotAfter,
		"left", leaf.NotAfter.Sub(now).Round(time.Minute).String())
}

// fileStamp is what changes when either file is rewritten.
func (r *Reloader) fileStamp() ([]byte, error) {
	var b bytes.Buffer
	for _, f := range []string{r.certFile, r.keyFile} {
		st, err := os.Stat(f)
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(&b, "%d %d;", st.Size(), st.ModTime().UnixNano())
	}
	return b.Bytes(), nil
}

// certificate is tls.Config.GetCertificate: the pair, reloaded first when
// the files changed since it was loaded.
func (r *Reloader) certificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if now := time.Now(); now.Sub(r.checked) >= certRecheck {
		r.checked = now
		r.reload()
		r.warnIfEnding(now)
	}
	return r.cert, nil
}

// reload loads the pair again if the files changed; r.mu is held.
func (r *Reloader) reload() {
	stamp, err := r.fileStamp()
	if err != nil || bytes.Equal(stamp, r.stamp) || bytes.Equal(stamp, r.failed) {
		return
	}
	cert, err := tls.LoadX509KeyPair(r.certFile, r.keyFile)
	if err != nil {
		// Often the files are between two writes: try again at the next
		// change, and say so once per change.
		r.failed = stamp
		r.log.Warn("TLS certificate changed but does not load; serving the previous one", "cert_file", r.certFile, "key_file", r.keyFile, "err", err)
		return
	}
	r.cert, r.stamp, r.failed, r.warned = &cert, stamp, nil, time.Time{}
	r.log.Info("TLS certificate reloaded", "cert_file", r.certFile)
}

// Config is the servers' TLS configuration: the pair, reloaded when its
// files change.
func (r *Reloader) Config() *tls.Config {
	return &tls.Config{GetCertificate: r.certificate, MinVersion: tls.VersionTLS12}
}
