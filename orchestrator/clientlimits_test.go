package orchestrator

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/evolvellm/evolve/internal/wait"
	"github.com/evolvellm/evolve/roles"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// One client holding more slow-header connections than the router's
// whole budget does not make another client wait: its connections past
// its share are closed as they come, and a request from another address
// is answered while they hang. Before, the router's budget was all the
// slow client's, and a request waited for its header timeout (10 s).
func TestOneClientCannotTakeTheRouter(t *testing.T) {
	tc := startTestClusterWith(t, Config{Limits: HTTPLimits{MaxConnections: 64}, MaxConnectionsPerClient: 16}, nil, roles.Decode)
	addr := strings.TrimPrefix(tc.o.RouterURL(), "http://")
	var held []net.Conn
	t.Cleanup(func() {
		for _, c := range held {
			c.Close()
		}
	})
	for i := 0; i < 200; i++ { // three times the budget, headers never ended
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
		held = append(held, c)
	}
	wait.Until(t, 10*time.Second, "the slow client's connections past its share closed", func() bool {
		return testutil.ToFloat64(tc.o.met.perClientRefused) >= 200-16
	})
	other := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: (&net.Dialer{
		LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}).DialContext}}
	req, _ := http.NewRequestWithContext(context.Background(), "POST", tc.o.RouterURL()+"/v1/completions",
		strings.NewReader(`{"prompt": "hello", "max_tokens": 2}`))
	resp, err := other.Do(req)
	if err != nil {
		t.Fatalf("another client's request while one holds slow connections: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("another client's request: %d", resp.StatusCode)
	}
}
