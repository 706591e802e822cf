package orchestrator

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/evolvellm/evolve/internal/wait"
	"github.com/evolvellm/evolve/roles"
)

func limitedCluster(t *testing.T, profiles ...string) *testCluster {
	t.Helper()
	tc := startTestClusterWith(t, Config{Limits: HTTPLimits{MaxConnections: 4, BodyTimeout: time.Second, BodyMinRate: 1 << 20,
		WriteIdle: 2 * time.Second, IdleTimeout: 1500 * time.Millisecond}}, profiles, roles.Decode)
	wait.Until(t, 10*time.Second, "the engine serving", func() bool { return tc.o.servingNodes() == 1 })
	return tc
}

// hostPort is a URL's host:port.
func hostPort(url string) string { return strings.TrimPrefix(url, "http://") }

// A client that sends its body a byte at a time is cut once the body is
// late, with 408; before, it held its connection for as long as it kept
// trickling.
func TestSlowBodyIsCut(t *testing.T) {
	tc := limitedCluster(t)
	conn, err := net.Dial("tcp", hostPort(tc.o.RouterURL()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")
	start := time.Now()
	answered := make(chan string, 1)
	go func() {
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			answered <- "closed: " + err.Error()
			return
		}
		answered <- resp.Status
	}()
	for {
		select {
		case got := <-answered:
			if !strings.HasPrefix(got, "408") {
				t.Fatalf("a slow body answered %q", got)
			}
			if d := time.Since(start); d > 4*time.Second {
				t.Fatalf("cut after %v", d)
			}
			return
		case <-time.After(300 * time.Millisecond):
			if time.Since(start) > 8*time.Second {
				t.Fatal("a body trickling in for 8 s still holds its connection")
			}
			conn.Write([]byte(" "))
		}
	}
}

// A streamed answer that lasts longer than the body timeout, and longer
// than the write-idle timeout, is not cut: only a stalled write is.
func TestLongStreamIsNotCut(t *testing.T) {
	tc := limitedCluster(t, "gb300-kimi-k2") // slow enough passes
	start := time.Now()
	resp, err := http.Post(tc.o.RouterURL()+"/v1/completions", "application/json",
		strings.NewReader(`{"prompt": "a long answer", "max_tokens": 4000, "stream": true, "ignore_eos": true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || !strings.Contains(string(b), "[DONE]") || strings.Contains(string(b), `"error"`) {
		t.Fatalf("after %v: %v\n%s", time.Since(start), err, tail(string(b)))
	}
	if d := time.Since(start); d < 2500*time.Millisecond {
		t.Fatalf("the answer took %v: too short to show the timeouts spare it", d)
	}
}

func tail(s string) string {
	if len(s) > 500 {
		return s[len(s)-500:]
	}
	return s
}

// Connections beyond the limit wait; an idle keep-alive connection is
// closed, which lets the next one in.
func TestConnectionsAreLimitedAndIdleOnesClosed(t *testing.T) {
	tc := limitedCluster(t)
	var held []net.Conn
	for range 4 {
		c, err := net.Dial("tcp", hostPort(tc.o.RouterURL()))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
		if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil || resp.StatusCode != 200 {
			t.Fatalf("health on a kept-alive connection: %v", err)
		}
		held = append(held, c)
	}
	fifth := &http.Client{Timeout: 400 * time.Millisecond, Transport: &http.Transport{DisableKeepAlives: true}}
	if resp, err := fifth.Get(tc.o.RouterURL() + "/health"); err == nil {
		resp.Body.Close()
		t.Fatal("a fifth connection was served past a limit of four")
	}
	// The four idle past the idle timeout are closed by the server.
	for _, c := range held {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err != io.EOF {
			t.Fatalf("an idle connection: %v, want closed by the server", err)
		}
	}
	fifth.Timeout = 5 * time.Second
	resp, err := fifth.Get(tc.o.RouterURL() + "/health")
	if err != nil {
		t.Fatalf("once the idle ones closed: %v", err)
	}
	resp.Body.Close()
}

// A body that declares more than the router takes is refused with 413 at
// once, its connection closed, and the router does not first read it, or
// wait for it, until the body deadline (issue #56: a 1 GB Content-Length
// with no body waited the 30 s body timeout for its 413). The deadline
// here is 10 minutes, the test's patience a tenth of it.
func TestDeclaredHugeBodyIsRefusedAtOnce(t *testing.T) {
	tc := startTestClusterWith(t, Config{Limits: HTTPLimits{BodyTimeout: 10 * time.Minute}}, nil, roles.Decode)
	for _, path := range []string{"/v1/completions", "/v1/chat/completions", "/v1/messages", "/v1/responses"} {
		t.Run(path, func(t *testing.T) {
			conn, err := net.Dial("tcp", hostPort(tc.o.RouterURL()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000000000\r\n\r\n", path)
			conn.SetReadDeadline(time.Now().Add(time.Minute))
			br := bufio.NewReader(conn)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("no answer while the 1 GB body was not sent: %v", err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 413 {
				t.Fatalf("answered %s, want 413", resp.Status)
			}
			if _, err := br.ReadByte(); err != io.EOF {
				t.Errorf("the connection stays open after the refusal (%v): its body would be read as the next request", err)
			}
		})
	}
}
