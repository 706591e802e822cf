package natsconn

import (
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/evolvellm/evolve/internal/wait"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// Credentials takes a token, or a user and password, off the URLs, so
// that the client can present them to servers it learns of too.
func TestCredentials(t *testing.T) {
	for _, c := range []struct{ in, clean, user, password, token string }{
		{"nats://tok@a:4222,nats://tok@b:4222", "nats://a:4222,nats://b:4222", "", "", "tok"},
		{"tls://u:p@a:4222, nats://b:4222", "tls://a:4222,nats://b:4222", "u", "p", ""},
		{"nats://a:4222", "nats://a:4222", "", "", ""},
	} {
		t.Run(c.in, func(t *testing.T) {
			clean, user, password, token := Credentials(c.in)
			if strings.Join(clean, ",") != c.clean || user != c.user || password != c.password || token != c.token {
				t.Fatalf("got %v %q %q %q", clean, user, password, token)
			}
		})
	}
}

// startServer runs a NATS server on port that wants token.
func startServer(t *testing.T, port int, token string) *server.Server {
	t.Helper()
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: port, Authorization: token, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("NATS server did not start")
	}
	t.Cleanup(ns.Shutdown)
	return ns
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// A client that meets a server refusing its token while it reconnects
// (a cluster's server restarting with its authorization not yet loaded,
// or one an operator is rotating) keeps trying: when the server takes
// the token again the client is back. By default the NATS client closes
// the connection for good after the same authorization error twice.
func TestReconnectsPastAuthorizationErrors(t *testing.T) {
	port := freePort(t)
	first := startServer(t, port, "s3cret")
	servers, opts := Options(fmt.Sprintf("nats://s3cret@127.0.0.1:%d", port), "")
	if strings.Contains(servers, "s3cret") {
		t.Fatalf("the token stayed in the URL: %s", servers)
	}
	var authErrors atomic.Int32
	nc, err := nats.Connect(servers, append(opts, nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if strings.Contains(strings.ToLower(err.Error()), "authorization") {
				authErrors.Add(1)
			}
		}))...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()

	first.Shutdown()
	first.WaitForShutdown()
	refusing := startServer(t, port, "another")
	wait.Until(t, 10*time.Second, "three authorization errors in a row", func() bool { return authErrors.Load() >= 3 || nc.IsClosed() })
	if nc.IsClosed() {
		t.Fatalf("the client gave up after %d authorization errors: %v", authErrors.Load(), nc.LastError())
	}
	refusing.Shutdown()
	refusing.WaitForShutdown()
	startServer(t, port, "s3cret")
	wait.Until(t, 10*time.Second, "the client connected again", nc.IsConnected)
	if err := nc.Publish("x", []byte("y")); err != nil {
		t.Fatal(err)
	}
	if err := nc.FlushTimeout(5 * time.Second); err != nil {
		t.Fatal(err)
	}
}
