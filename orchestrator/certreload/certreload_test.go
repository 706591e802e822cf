package certreload

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log/slog"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// writePair writes a self-signed certificate for name, ending at end, and
// its key.
func writePair(t *testing.T, certFile, keyFile, name string, end time.Time) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: end, DNSNames: []string{name}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, _ := x509.MarshalECPrivateKey(key)
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600)
}

// served is the common name of the certificate a handshake gets.
func served(t *testing.T, r *Reloader) string {
	t.Helper()
	c, err := r.Config().GetCertificate(nil)
	if err != nil || c == nil {
		t.Fatalf("no certificate: %v", err)
	}
	leaf, err := x509.ParseCertificate(c.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	return leaf.Subject.CommonName
}

// A pair renewed in place is served from the next handshake on; a renewal
// that does not load leaves the last good pair serving; one file without
// the other, or a pair that does not load, is refused at the start.
func TestRenewedCertificateIsServedWithoutARestart(t *testing.T) {
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if r, err := New("", "", log); r != nil || err != nil {
		t.Fatalf("no files: %v, %v; want plain HTTP", r, err)
	}
	if _, err := New(cert, "", log); err == nil {
		t.Fatal("a certificate without its key was accepted")
	}
	if _, err := New(cert, key, log); err == nil {
		t.Fatal("missing files were accepted")
	}
	end := time.Now().Add(90 * 24 * time.Hour).Truncate(time.Second)
	writePair(t, cert, key, "first", end)
	r, err := New(cert, key, log)
	if err != nil {
		t.Fatal(err)
	}
	if got := served(t, r); got != "first" {
		t.Fatalf("served %q", got)
	}
	if !r.NotAfter().Equal(end) || r.Expiry() != float64(end.Unix()) {
		t.Fatalf("ends %v (%v), want %v", r.NotAfter(), r.Expiry(), end)
	}
	time.Sleep(certRecheck) // the files are looked at once a recheck
	writePair(t, cert, key, "renewed", end.Add(24*time.Hour))
	if got := served(t, r); got != "renewed" {
		t.Fatalf("after a renewal in place: served %q", got)
	}
	time.Sleep(certRecheck)
	os.WriteFile(key, []byte("half-written"), 0o600)
	if got := served(t, r); got != "renewed" {
		t.Fatalf("after a renewal that does not load: served %q, want the last good one", got)
	}
}
