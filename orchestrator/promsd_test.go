package orchestrator

import (
	"encoding/json"
	"net/http/httptest"
	"testing"
)

// The control API lists the cluster's Prometheus targets behind its token,
// with the cluster label asked for, and a router that listens on every
// interface at the host the request reached.
func TestPrometheusTargetsAreServedBehindTheControlToken(t *testing.T) {
	o, err := New(Config{NATSURL: "nats://127.0.0.1:1", ControlAddr: "127.0.0.1:0", ControlToken: "ct", PlannerMode: PlannerOff})
	if err != nil {
		t.Fatal(err)
	}
	o.routerURL = "http://0.0.0.0:8000"
	h := o.controlHandler()
	get := func(path, token string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("GET", "http://10.0.0.1:8001"+path, nil)
		if token != "" {
			r.Header.Set("Authorization", "Bearer "+token)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	if w := get("/api/v1/prometheus/targets", ""); w.Code != 401 {
		t.Fatalf("without the token: %d %s", w.Code, w.Body)
	}
	for _, c := range []struct{ query, cluster string }{{"", "evolve"}, {"?cluster=lab", "lab"}} {
		t.Run(c.query, func(t *testing.T) {
			w := get("/api/v1/prometheus/targets"+c.query, "ct")
			var sd []struct {
				Targets []string          `json:"targets"`
				Labels  map[string]string `json:"labels"`
			}
			if w.Code != 200 || w.Header().Get("Content-Type") != "application/json" || json.Unmarshal(w.Body.Bytes(), &sd) != nil {
				t.Fatalf("targets%s: %d %q %s", c.query, w.Code, w.Header().Get("Content-Type"), w.Body)
			}
			if len(sd) != 1 || len(sd[0].Targets) != 1 || sd[0].Targets[0] != "10.0.0.1:8000" || sd[0].Labels["job"] != "evolve-router" ||
				sd[0].Labels["cluster"] != c.cluster || sd[0].Labels["__scheme__"] != "http" {
				t.Fatalf("targets%s: %s", c.query, w.Body)
			}
		})
	}
}
