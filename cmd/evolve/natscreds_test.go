package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/evolvellm/evolve/internal/wait"
	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
)

// securedNATS starts a NATS server that takes only users of one account
// (operator mode, as nsc sets a deployment up), with JetStream for that
// account; it returns its URL and a user's credentials file.
func securedNATS(t *testing.T) (natsURL, creds string) {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	okp, err := nkeys.CreateOperator()
	must(err)
	opub, _ := okp.PublicKey()
	oc := jwt.NewOperatorClaims(opub)
	oc.Name = "ops"
	account := func(js bool) (nkeys.KeyPair, string, string) {
		kp, err := nkeys.CreateAccount()
		must(err)
		pub, _ := kp.PublicKey()
		ac := jwt.NewAccountClaims(pub)
		if js {
			ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
		}
		tok, err := ac.Encode(okp)
		must(err)
		return kp, pub, tok
	}
	_, sysPub, sysJWT := account(false)
	akp, apub, ajwt := account(true)
	oc.SystemAccount = sysPub
	resolver := &server.MemAccResolver{}
	must(resolver.Store(sysPub, sysJWT))
	must(resolver.Store(apub, ajwt))
	ukp, err := nkeys.CreateUser()
	must(err)
	upub, _ := ukp.PublicKey()
	ujwt, err := jwt.NewUserClaims(upub).Encode(akp)
	must(err)
	seed, _ := ukp.Seed()
	b, err := jwt.FormatUserConfig(ujwt, seed)
	must(err)
	creds = filepath.Join(t.TempDir(), "evolve.creds")
	must(os.WriteFile(creds, b, 0o600))
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoSigs: true, NoLog: true,
		TrustedOperators: []*jwt.OperatorClaims{oc}, AccountResolver: resolver, SystemAccount: sysPub})
	must(err)
	go ns.Start()
	t.Cleanup(ns.Shutdown)
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("the NATS server is not ready after 10 s")
	}
	return ns.ClientURL(), creds
}

// Orchestrators and engines on an existing NATS deployment secured with
// accounts present a credentials file (--nats-creds): without it the
// orchestrator stops at once, saying what the server wants; with it the
// engine registers over that NATS and requests are served.
func TestNATSCredentialsFile(t *testing.T) {
	natsURL, creds := securedNATS(t)
	if out, code := runBinOut(t, nil, "orchestrator", "--nats", natsURL, "--router-addr", "127.0.0.1:0", "--control-addr", "127.0.0.1:0", "--planner", "off"); code == 0 ||
		!strings.Contains(strings.ToLower(out), "authorization violation") || !strings.Contains(out, "--nats-creds") {
		t.Fatalf("an orchestrator without credentials: exit %d\n%s", code, out)
	}
	notCreds := filepath.Join(t.TempDir(), "token")
	os.WriteFile(notCreds, []byte("s3cret\n"), 0o600)
	for _, args := range [][]string{
		{"orchestrator", "--nats", natsURL, "--nats-creds", notCreds},
		{"orchestrator", "--nats-creds", creds},
		{"engine", "--nats", natsURL, "--nats-creds", filepath.Join(t.TempDir(), "missing.creds")},
	} {
		if out, code := runBinOut(t, nil, args...); code != 2 || !strings.Contains(out, "--nats-creds") {
			t.Fatalf("evolve %s: exit %d, want 2 with a word on --nats-creds\n%s", strings.Join(args, " "), code, out)
		}
	}

	o := launchOrchestrator(t, "--nats", natsURL, "--nats-creds", creds)
	info := o.waitReady(t, 20*time.Second)
	startEngine(t, "--id", "secured-1", "--profile", "tiny", "--nats", natsURL, "--nats-creds", creds)
	wait.Until(t, 10*time.Second, "the engine registered over the secured NATS", func() bool {
		out, code := runBinOut(t, nil, "nodes", "--server", info.ControlURL, "-o", "json")
		return code == 0 && strings.Contains(out, `"secured-1"`) && strings.Contains(out, `"serving"`)
	})
	if code, _, body := post(t, info.RouterURL+"/v1/completions", `{"prompt": "over a secured NATS", "max_tokens": 4}`); code != 200 {
		t.Fatalf("a request: %d %v", code, body)
	}
}
