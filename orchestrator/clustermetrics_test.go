package orchestrator

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/evolvellm/evolve/internal/wait"
	"github.com/evolvellm/evolve/roles"
)

// routerMetrics is the router's /metrics text.
func routerMetrics(t *testing.T, o *Orchestrator) string {
	t.Helper()
	resp, err := http.Get(o.RouterURL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// /metrics keeps the cluster's nodes by role and state, every state of
// every role at 0 when no node has it, and follows an engine going down;
// the KV directory and pool are there too.
func TestClusterMetricsFollowTheNodes(t *testing.T) {
	tc := startTestCluster(t, roles.Prefill, roles.Decode)
	m := routerMetrics(t, tc.o)
	for _, want := range []string{`evolve_nodes{role="prefill",state="serving"} 1`, `evolve_nodes{role="decode",state="serving"} 1`,
		`evolve_nodes{role="decode",state="down"} 0`, `evolve_nodes{role="both",state="switching"} 0`,
		`evolve_kv_pool_capacity_blocks{tier="gpu"} 1024`, "evolve_kv_lost_reuse_tokens_total 0", "evolve_branches_live 0"} {
		if !strings.Contains(m, want+"\n") {
			t.Fatalf("/metrics lacks %q:\n%s", want, m)
		}
	}
	tc.engines[1]() // the decode engine stops
	wait.Until(t, 10*time.Second, "the decode node down in /metrics", func() bool {
		m := routerMetrics(t, tc.o)
		return strings.Contains(m, `evolve_nodes{role="decode",state="down"} 1`+"\n") &&
			strings.Contains(m, `evolve_nodes{role="decode",state="serving"} 0`+"\n")
	})
}
