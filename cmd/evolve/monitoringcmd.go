package main

import (
	"fmt"
	"net"
	"net/url"

	"github.com/evolvellm/evolve/monitoring"
	"github.com/evolvellm/evolve/orchestrator"
	"github.com/spf13/cobra"
)

func newMonitoringCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "monitoring",
		Short: "Print a Grafana dashboard, Prometheus alerts and scrape config for a cluster",
		Long: `Print what Prometheus and Grafana need to watch an evolve cluster.

  grafana  a Grafana dashboard (JSON; Dashboards > New > Import): the
           router's requests, TTFT and end-to-end latency, the split and
           the planner, the KV pool and lost reuse, each engine's KV,
           queue and tokens, and per API key usage and limits
  alerts   Prometheus alerting rules (YAML; rule_files): nodes down, no
           node serving a role, failing requests, slow first tokens, API
           keys refused at their limit, KV reuse lost, preempting engines,
           a TLS certificate near its end
  scrape   the scrape configuration of a running cluster's router and
           engines (YAML for prometheus.yml; -o json: file_sd targets),
           read from its control API as 'evolve nodes' does

The dashboard and the alerts read only metrics evolve exports: the
router's evolve_* and the engines' vllm:*, which evolve's simulated engines
and vLLM both export, so they serve clusters of either.`,
		Example: `  evolve monitoring grafana > evolve-dashboard.json
  evolve monitoring alerts > /etc/prometheus/evolve-rules.yaml
  evolve monitoring scrape >> prometheus-scrape.yaml
  evolve monitoring scrape -o json --server https://10.0.0.1:8001 --token "$TOKEN" > /etc/prometheus/evolve-targets.json`,
	}
	cmd.AddCommand(&cobra.Command{
		Use: "grafana", Short: "Print the Grafana dashboard (JSON)", Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := cmd.OutOrStdout().Write(monitoring.Dashboard())
			return err
		},
	}, &cobra.Command{
		Use: "alerts", Short: "Print the Prometheus alerting rules (YAML)", Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := cmd.OutOrStdout().Write(monitoring.Rules())
			return err
		},
	})
	scrape := &cobra.Command{
		Use:   "scrape",
		Short: "Print the scrape configuration of a running cluster's router and engines",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			format := flagOrConfig(cmd, "output")
			if format != "yaml" && format != "json" {
				return usageError{cmd: cmd.CommandPath(), err: fmt.Errorf("-o %q: want yaml (prometheus.yml's scrape_configs) or json (file_sd targets)", format)}
			}
			c := newControlClient(cmd)
			var st orchestrator.ClusterStatus
			if err := c.do(cmd.Context(), "GET", "/api/v1/cluster", nil, &st); err != nil {
				return err
			}
			var nodes []orchestrator.NodeStatus
			if err := c.do(cmd.Context(), "GET", "/api/v1/nodes", nil, &nodes); err != nil {
				return err
			}
			t := monitoring.Targets{Cluster: flagOrConfig(cmd, "cluster"), Router: reachableRouter(st.RouterURL, c.base)}
			for _, n := range nodes {
				if n.Address != "" {
					t.Engines = append(t.Engines, n.Address)
				}
			}
			out, err := monitoring.ScrapeConfig(t)
			if format == "json" {
				out, err = monitoring.FileSD(t)
			}
			if err != nil {
				return err
			}
			_, err = cmd.OutOrStdout().Write(out)
			return err
		},
	}
	scrape.Flags().StringP("output", "o", "yaml", "output format: yaml (scrape_configs) or json (file_sd targets)")
	scrape.Flags().String("cluster", "evolve", "the cluster label every scraped series gets")
	addClientFlags(scrape)
	cmd.AddCommand(scrape)
	return commandGroup(cmd)
}

// reachableRouter is the router's URL as others reach it: a router that
// listens on every interface (0.0.0.0, [::]) names no host, so the host
// of the control API, which runs in the same process, stands in.
func reachableRouter(routerURL, controlURL string) string {
	r, err := url.Parse(routerURL)
	if err != nil {
		return routerURL
	}
	if ip := net.ParseIP(r.Hostname()); ip == nil || !ip.IsUnspecified() {
		return routerURL
	}
	c, err := url.Parse(controlURL)
	if err != nil || c.Hostname() == "" {
		return routerURL
	}
	r.Host = net.JoinHostPort(c.Hostname(), r.Port())
	return r.String()
}
