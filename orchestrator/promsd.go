package orchestrator

import (
	"net/http"

	"github.com/evolvellm/evolve/monitoring"
)

// servePrometheusTargets lists the routers (of several orchestrators,
// each one's) and the engines as they are now,
// in the format of Prometheus's http_sd_configs (see monitoring.FileSD):
// a Prometheus that asks here scrapes engines that join, leave or move
// without its configuration changing. ?cluster=NAME sets the cluster label
// (evolve by default). A router that listens on every interface is listed
// at the host the request reached.
func (o *Orchestrator) servePrometheusTargets(w http.ResponseWriter, r *http.Request) {
	cluster := r.URL.Query().Get("cluster")
	if cluster == "" {
		cluster = "evolve"
	}
	t := monitoring.Targets{Cluster: cluster, Routers: o.RouterTargets(r.Host)}
	for _, n := range o.Nodes() {
		if n.Address != "" {
			t.Engines = append(t.Engines, n.Address)
		}
	}
	b, err := monitoring.FileSD(t)
	if err != nil {
		apiError(w, http.StatusInternalServerError, "prometheus targets: %v", err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(b)
}
