package main

import (
	"fmt"

	"github.com/evolvellm/evolve/monitoring"
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
           read from its control API as 'evolve nodes' does; --http-sd:
           Prometheus asks the control API for them as engines come and go

The dashboard and the alerts read only metrics evolve exports: the
router's evolve_* and the engines' vllm:*, which evolve's simulated engines
and vLLM both export, so they serve clusters of either.`,
		Example: `  evolve monitoring grafana > evolve-dashboard.json
  evolve monitoring alerts > /etc/prometheus/evolve-rules.yaml
  evolve monitoring scrape >> prometheus-scrape.yaml
  evolve monitoring scrape --http-sd --server http://10.0.0.1:8001 > /etc/prometheus/evolve.yml
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
		Long: `Print the scrape configuration of a running cluster's router and engines,
read from its control API as 'evolve nodes' does.

By default the configuration lists the targets as they are now (YAML for
prometheus.yml, or -o json for a file_sd_configs file): engines that join
later need it run again. With --http-sd it tells Prometheus to ask the
control API itself (` + monitoring.TargetsPath + `, every 30 s), so engines
that join, leave or move are scraped with nothing run again; a control API
that takes a token gets it from --token-file, which Prometheus must be
able to read (a local cluster's: the file in its state directory, for a
Prometheus run by its user).`,
		Args: noArgs,
		RunE: runScrape,
	}
	scrape.Flags().StringP("output", "o", "yaml", "output format: yaml (scrape_configs) or json (file_sd targets)")
	scrape.Flags().String("cluster", "evolve", "the cluster label every scraped series gets")
	scrape.Flags().Bool("http-sd", false, "have Prometheus ask the control API for the targets as they change (http_sd_configs)")
	scrape.Flags().String("token-file", "/etc/prometheus/evolve-control-token", "with --http-sd and a control token: the file Prometheus reads the token from")
	scrape.Flags().String("ca-file", "", "the CA file, on Prometheus's host, that HTTPS certificates (the router's, and with --http-sd the control API's) are checked against (default: the system's)")
	addClientFlags(scrape)
	cmd.AddCommand(scrape)
	return commandGroup(cmd)
}

// runScrape is evolve monitoring scrape: the scrape configuration of a
// running cluster, as targets now or as HTTP service discovery.
func runScrape(cmd *cobra.Command, _ []string) error {
	format := flagOrConfig(cmd, "output")
	httpSD := config.GetBool(cfgKey(cmd) + ".http-sd")
	if format != "yaml" && format != "json" {
		return usageError{cmd: cmd.CommandPath(), err: fmt.Errorf("-o %q: want yaml (prometheus.yml's scrape_configs) or json (file_sd targets)", format)}
	}
	if httpSD && format == "json" {
		return usageError{cmd: cmd.CommandPath(), err: fmt.Errorf("--http-sd prints YAML for prometheus.yml; file_sd targets (-o json) are for a cluster's targets as they are now")}
	}
	c := newControlClient(cmd)
	if httpSD {
		// Ask once, as Prometheus will: a wrong token or an old
		// orchestrator shows here rather than in Prometheus's log.
		var sd []struct {
			Labels map[string]string `json:"labels"`
		}
		if err := c.do(cmd.Context(), "GET", monitoring.TargetsPath, nil, &sd); err != nil {
			return fmt.Errorf("the control API's Prometheus targets: %w", err)
		}
		h := monitoring.HTTPSD{ControlURL: c.base, Cluster: flagOrConfig(cmd, "cluster"), CAFile: flagOrConfig(cmd, "ca-file")}
		for _, g := range sd {
			h.TargetsTLS = h.TargetsTLS || g.Labels["__scheme__"] == "https"
		}
		if c.token != "" {
			h.TokenFile = flagOrConfig(cmd, "token-file")
			if c.tokenFile != "" && !cmd.Flags().Changed("token-file") {
				h.TokenFile = c.tokenFile // the local cluster's, which Prometheus run by this user may read
			}
		}
		out, err := monitoring.HTTPSDConfig(h)
		if err != nil {
			return err
		}
		_, err = cmd.OutOrStdout().Write(out)
		return err
	}
	// The control API lists them as Prometheus would find them: every
	// orchestrator's router, named as this machine reached it, and the
	// engines.
	var sd []struct {
		Targets []string          `json:"targets"`
		Labels  map[string]string `json:"labels"`
	}
	if err := c.do(cmd.Context(), "GET", monitoring.TargetsPath, nil, &sd); err != nil {
		return fmt.Errorf("the control API's Prometheus targets: %w", err)
	}
	t := monitoring.Targets{Cluster: flagOrConfig(cmd, "cluster"), CAFile: flagOrConfig(cmd, "ca-file")}
	for _, g := range sd {
		for _, host := range g.Targets {
			u := g.Labels["__scheme__"] + "://" + host
			if g.Labels["job"] == "evolve-router" {
				t.Routers = append(t.Routers, u)
			} else {
				t.Engines = append(t.Engines, u)
			}
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
}
