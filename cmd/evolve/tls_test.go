package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/evolvellm/evolve/internal/wait"
)

// writeCert writes a self-signed certificate for 127.0.0.1 and its key,
// serial numbered serial and valid for serial hours from now, and returns
// when it ends.
func writeCert(t *testing.T, certFile, keyFile string, serial int64) time.Time {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "evolve test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Duration(serial) * time.Hour).Truncate(time.Second),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, BasicConstraintsValid: true, IsCA: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
	return tmpl.NotAfter
}

// An orchestrator given a certificate serves the agents' API over HTTPS
// (a plain request is refused), with the control API too when it is off
// loopback; evolve's commands trust a private certificate through
// SSL_CERT_FILE. A certificate renewed in place is served from the next
// connection on, and a renewal that does not load leaves the last good one
// serving.
func TestOrchestratorServesHTTPSAndReloadsItsCertificate(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	ends := writeCert(t, certFile, keyFile, 1)
	info, log := startOrchestratorLog(t, "--tls-cert-file", certFile, "--tls-key-file", keyFile,
		"--control-addr", "0.0.0.0:0", "--token", "ctl-secret")
	// An hour left: the log warns, and the metric says when, for alerts.
	if !strings.Contains(log.String(), "expires soon") {
		t.Errorf("no warning of a certificate with an hour left in\n%s", log.String())
	}
	anyCert := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	expiry := func() float64 { return metricVia(t, anyCert, info.RouterURL, "evolve_tls_certificate_expiry_seconds") }
	if got := expiry(); got != float64(ends.Unix()) {
		t.Errorf("evolve_tls_certificate_expiry_seconds %v, want %d", got, ends.Unix())
	}
	if !strings.HasPrefix(info.RouterURL, "https://127.0.0.1:") || !strings.HasPrefix(info.ControlURL, "https://") {
		t.Fatalf("ready file: router %s, control %s; want both https", info.RouterURL, info.ControlURL)
	}
	controlURL := strings.NewReplacer("0.0.0.0", "127.0.0.1", "[::]", "127.0.0.1").Replace(info.ControlURL)

	// served returns the serial of the certificate a new connection gets,
	// trusting any (the test checks which one it is).
	served := func() int64 {
		conn, err := tls.Dial("tcp", strings.TrimPrefix(info.RouterURL, "https://"), &tls.Config{InsecureSkipVerify: true})
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].SerialNumber.Int64()
	}
	trusting := func(certFile string) *http.Client {
		pool := x509.NewCertPool()
		b, _ := os.ReadFile(certFile)
		pool.AppendCertsFromPEM(b)
		return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	}
	// An agent's streamed answer over HTTPS, as the SDKs ask for it
	// (HTTP/2 where the server offers it).
	startEngine(t, "--profile", "tiny", "--speedup", "20", "--nats", info.NATSURL)
	agent := trusting(certFile)
	agent.Transport.(*http.Transport).ForceAttemptHTTP2 = true
	wait.Until(t, 20*time.Second, "the engine serving", func() bool {
		resp, err := agent.Get(info.RouterURL + "/v1/models")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode == 200 && strings.Contains(string(b), "evolve-tiny")
	})
	resp, err := agent.Post(info.RouterURL+"/v1/completions", "application/json",
		strings.NewReader(`{"prompt": "Hello over TLS", "max_tokens": 12, "stream": true}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Proto != "HTTP/2.0" || strings.Count(string(body), `"finish_reason":null`) != 12 || !strings.Contains(string(body), `"finish_reason":"length"`) || !strings.HasSuffix(strings.TrimSpace(string(body)), "data: [DONE]") {
		t.Fatalf("a streamed completion over HTTPS: %s %s\n%s", resp.Proto, resp.Status, body)
	}
	resp, err = http.Get(strings.Replace(info.RouterURL, "https://", "http://", 1) + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 400 || !strings.Contains(string(body), "HTTPS") {
		t.Fatalf("plain HTTP to the router: %s %q; want a 400 that says it serves HTTPS", resp.Status, body)
	}

	// evolve's own commands trust the certificate through SSL_CERT_FILE,
	// and not without it.
	out, code := runBin(t, []string{"SSL_CERT_FILE=" + certFile, "EVOLVE_TOKEN=ctl-secret"}, "nodes", "--server", controlURL, "-o", "json")
	if code != 0 || !strings.Contains(out, `"role"`) {
		t.Fatalf("evolve nodes over HTTPS with SSL_CERT_FILE: exit %d\n%s", code, out)
	}
	if out, code = runBin(t, []string{"SSL_CERT_FILE=/dev/null", "EVOLVE_TOKEN=ctl-secret"}, "nodes", "--server", controlURL); code == 0 || !strings.Contains(out, "SSL_CERT_FILE=ca.pem") {
		t.Fatalf("evolve nodes trusting nothing: exit %d\n%s", code, out)
	}

	// So does evolve bench, which says how when it does not.
	if out, code = runBin(t, []string{"SSL_CERT_FILE=/dev/null"}, "bench", "--url", info.RouterURL, "--workload", "math", "--agents", "1", "--duration", "1s"); code == 0 || !strings.Contains(out, "SSL_CERT_FILE=ca.pem") {
		t.Fatalf("evolve bench trusting nothing: exit %d\n%s", code, out)
	}
	out, code = runBin(t, []string{"SSL_CERT_FILE=" + certFile}, "bench", "--url", info.RouterURL, "--workload", "math", "--agents", "2", "--duration", "2s", "-o", "json")
	var res struct {
		Requests int `json:"requests_completed"`
		Errors   int `json:"errors"`
	}
	if code != 0 || json.Unmarshal([]byte(lastJSON(out)), &res) != nil || res.Requests == 0 || res.Errors != 0 {
		t.Fatalf("evolve bench over HTTPS: exit %d, %+v\n%s", code, res, out)
	}

	// evolve status says when the certificate ends.
	out, code = runBin(t, []string{"SSL_CERT_FILE=" + certFile, "EVOLVE_TOKEN=ctl-secret"}, "status", "--server", controlURL, "-o", "json")
	var status struct {
		TLSNotAfter time.Time `json:"tls_not_after"`
		APIKeys     int       `json:"api_keys"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &status) != nil || !status.TLSNotAfter.Equal(ends) || status.APIKeys != 0 {
		t.Fatalf("evolve status -o json: exit %d, %+v; want the certificate's end %v\n%s", code, status, ends, out)
	}

	// Renewed in place: the next connection gets the new certificate.
	if s := served(); s != 1 {
		t.Fatalf("serving certificate %d, want 1", s)
	}
	time.Sleep(10 * time.Millisecond) // a modification time the first write did not have
	ends = writeCert(t, certFile, keyFile, 2)
	wait.Until(t, 10*time.Second, "the renewed certificate served", func() bool { return served() == 2 })
	if got := expiry(); got != float64(ends.Unix()) {
		t.Errorf("after the renewal, evolve_tls_certificate_expiry_seconds %v, want %d", got, ends.Unix())
	}
	if resp, err = trusting(certFile).Get(info.RouterURL + "/health"); err != nil {
		t.Fatalf("a client trusting the renewed certificate: %v", err)
	}
	resp.Body.Close()

	// A renewal that does not load (the key of another certificate): the
	// last good pair goes on serving, and the log says why.
	other := filepath.Join(dir, "other.key")
	writeCert(t, filepath.Join(dir, "other.crt"), other, 3)
	b, _ := os.ReadFile(other)
	if err := os.WriteFile(keyFile, b, 0o600); err != nil {
		t.Fatal(err)
	}
	wait.Until(t, 10*time.Second, "a warning about the certificate that does not load", func() bool {
		// (A handshake looks at the files: make one first.)
		s := served()
		return s == 2 && strings.Contains(log.String(), "does not load")
	})
	// The next good pair is taken (a failed load blocks only itself).
	writeCert(t, certFile, keyFile, 4)
	wait.Until(t, 10*time.Second, "the next renewal served", func() bool { return served() == 4 })
}

// A certificate without its key, or one that does not load, stops the
// orchestrator before it serves, with the reason.
func TestOrchestratorRefusesABadCertificate(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	writeCert(t, certFile, keyFile, 1)
	if err := os.WriteFile(keyFile, []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--tls-cert-file", certFile}, "both a certificate and its key"},
		{[]string{"--tls-cert-file", certFile, "--tls-key-file", keyFile}, "tls.key"},
		{[]string{"--tls-cert-file", filepath.Join(dir, "absent.crt"), "--tls-key-file", keyFile}, "absent.crt"},
	} {
		t.Run(tc.want, func(t *testing.T) {
			out, code := runBin(t, nil, append([]string{"orchestrator", "--router-addr", "127.0.0.1:0", "--control-addr", "127.0.0.1:0",
				"--nats-listen", "127.0.0.1:0", "--data-dir", filepath.Join(dir, "data")}, tc.args...)...)
			if code != 2 || !strings.Contains(out, tc.want) {
				t.Errorf("orchestrator %q: exit %d, want 2 and %q in\n%s", tc.args, code, tc.want, out)
			}
		})
	}
}
