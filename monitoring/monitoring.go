// Package monitoring is what evolve gives an operator's Prometheus and
// Grafana: alerting rules for a cluster (Rules), a Grafana dashboard of
// the router's and the engines' metrics (Dashboard), and the scrape
// configuration of a cluster's targets (ScrapeConfig, FileSD). The rules
// and the dashboard read only metrics evolve exports: the router's
// evolve_* and the engines' vllm:* (which evolve's simulated engines and
// vLLM both export); a test checks every name against the registries.
package monitoring

import (
	_ "embed"
	"encoding/json"
	"regexp"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
)

//go:embed rules.yaml
var rules []byte

// Rules is the Prometheus alerting rules file.
func Rules() []byte { return slices.Clone(rules) }

// target is one query of a panel.
type target struct {
	expr, legend string
}

// panel is one graph of the dashboard.
type panel struct {
	title, unit, desc string
	targets           []target
	stat              bool // a single figure rather than a time series
}

// row is a titled group of panels.
type row struct {
	title  string
	panels []panel
}

const rate = "[$__rate_interval]"

// rows are the dashboard's content, in order.
var rows = []row{
	{"Router", []panel{
		{title: "Requests by outcome", unit: "reqps", desc: "ok, bad_request, client_gone, no_engine, failed, unauthorized, rate_limited.",
			targets: []target{{"sum by (outcome) (rate(evolve_router_requests_total" + rate + "))", "{{outcome}}"}}},
		{title: "Time to first token", unit: "s", desc: "At the router, wall clock.", targets: []target{
			{"histogram_quantile(0.5, sum by (le) (rate(evolve_router_time_to_first_token_seconds_bucket" + rate + ")))", "P50"},
			{"histogram_quantile(0.95, sum by (le) (rate(evolve_router_time_to_first_token_seconds_bucket" + rate + ")))", "P95"}}},
		{title: "End-to-end latency", unit: "s", desc: "Arrival to the last byte, at the router.", targets: []target{
			{"histogram_quantile(0.5, sum by (le) (rate(evolve_router_e2e_request_latency_seconds_bucket" + rate + ")))", "P50"},
			{"histogram_quantile(0.95, sum by (le) (rate(evolve_router_e2e_request_latency_seconds_bucket" + rate + ")))", "P95"}}},
		{title: "Answers in flight", unit: "short", desc: "Completions, chats and messages the router is writing now: what a shutdown waits for.",
			targets: []target{{"sum(evolve_router_in_flight)", "in flight"}}},
		{title: "Prompt tokens by where their KV came from", unit: "short", desc: "gpu, local_host, remote_host (fetched while the request waited), recomputed.",
			targets: []target{{"sum by (source) (rate(evolve_router_prompt_tokens_total" + rate + "))", "{{source}}"}}},
	}},
	{"Cluster and planner", []panel{
		{title: "Serving nodes by role", unit: "short", targets: []target{{`max by (role) (sum by (role, instance) (evolve_nodes{state="serving"}))`, "{{role}}"}}},
		{title: "Nodes not serving", unit: "short", desc: "Switching roles, draining, down or rejected.",
			targets: []target{{`max by (state) (sum by (state, instance) (evolve_nodes{state!="serving"}))`, "{{state}}"}}},
		{title: "Split: current and recommended", unit: "short", desc: "The online planner's view (prefill nodes).", targets: []target{
			{`evolve_planner_nodes{role="prefill"}`, "prefill, {{kind}}"}}},
		{title: "Role switches", unit: "short", targets: []target{{"sum by (to) (increase(evolve_role_switches_total" + rate + "))", "to {{to}}"}}},
		{title: "Predicted latency", unit: "s", desc: "The planner's prediction under the current and the best split.",
			targets: []target{{`evolve_planner_predicted_seconds{metric="e2e"}`, "E2E, {{split}}"}, {`evolve_planner_predicted_seconds{metric="ttft"}`, "TTFT, {{split}}"}}},
	}},
	{"KV", []panel{
		{title: "KV pool", unit: "short", desc: "Block copies cached against capacity, per tier, over the serving nodes.", targets: []target{
			{"max by (tier) (evolve_kv_pool_cached_blocks)", "cached, {{tier}}"}, {"max by (tier) (evolve_kv_pool_capacity_blocks)", "capacity, {{tier}}"}}},
		{title: "Referenced KV and live branches", unit: "short", targets: []target{
			{"evolve_kv_referenced_blocks", "blocks live branches reference"}, {"evolve_kv_directory_blocks", "blocks in the directory"},
			{"evolve_branches_live", "live branches"}}},
		{title: "Lost KV reuse", unit: "short", desc: "Prompt tokens per second recomputed that some engine had computed before.",
			targets: []target{{"rate(evolve_kv_lost_reuse_tokens_total" + rate + ")", "tokens/s"}}},
		{title: "KV moved between nodes", unit: "Bps", targets: []target{{"rate(evolve_kv_moved_bytes_total" + rate + ")", "bytes/s"}}},
	}},
	{"Engines", []panel{
		{title: "GPU KV in use", unit: "percentunit", targets: []target{{"vllm:kv_cache_usage_perc", "{{instance}}"}}},
		{title: "Requests waiting and running", unit: "short", targets: []target{
			{"vllm:num_requests_waiting", "waiting {{instance}}"}, {"vllm:num_requests_running", "running {{instance}}"}}},
		{title: "Tokens per second", unit: "short", targets: []target{
			{"sum by (instance) (rate(vllm:generation_tokens_total" + rate + "))", "generated {{instance}}"},
			{"sum by (instance) (rate(vllm:prompt_tokens_total" + rate + "))", "prompt {{instance}}"}}},
		{title: "Preemptions", unit: "short", targets: []target{{"sum by (instance) (rate(vllm:num_preemptions_total" + rate + "))", "{{instance}}"}}},
	}},
	{"API keys", []panel{
		{title: "Requests by key", unit: "reqps", targets: []target{{"sum by (key) (rate(evolve_router_key_requests_total" + rate + "))", "{{key}}"}}},
		{title: "Tokens by key", unit: "short", targets: []target{{"sum by (key, kind) (rate(evolve_router_key_tokens_total" + rate + "))", "{{key}} {{kind}}"}}},
		{title: "In flight against max-concurrency", unit: "short", targets: []target{
			{"evolve_router_key_in_flight", "in flight {{key}}"}, {"evolve_router_key_waiting", "waiting {{key}}"},
			{"evolve_router_key_max_concurrency", "limit {{key}}"}}},
		{title: "TLS certificate", unit: "s", stat: true, desc: "Time left before the router's certificate ends.",
			targets: []target{{"evolve_tls_certificate_expiry_seconds - time()", "left"}}},
	}},
}

// Dashboard is the Grafana dashboard (JSON, for Dashboards > Import), its
// Prometheus data source chosen on import.
func Dashboard() []byte {
	var panels []any
	id, y := 1, 0
	for _, r := range rows {
		panels = append(panels, map[string]any{"type": "row", "id": id, "title": r.title, "collapsed": false,
			"gridPos": map[string]int{"h": 1, "w": 24, "x": 0, "y": y}, "panels": []any{}})
		id++
		y++
		for i, p := range r.panels {
			var targets []any
			for j, t := range p.targets {
				targets = append(targets, map[string]any{"refId": string(rune('A' + j)), "expr": inCluster(t.expr), "legendFormat": t.legend,
					"datasource": datasource})
			}
			kind := "timeseries"
			if p.stat {
				kind = "stat"
			}
			panels = append(panels, map[string]any{"type": kind, "id": id, "title": p.title, "description": p.desc,
				"datasource": datasource, "targets": targets,
				"fieldConfig": map[string]any{"defaults": map[string]any{"unit": p.unit}, "overrides": []any{}},
				"gridPos":     map[string]int{"h": 8, "w": 12, "x": 12 * (i % 2), "y": y + 8*(i/2)}})
			id++
		}
		y += 8 * ((len(r.panels) + 1) / 2)
	}
	d := map[string]any{
		"title": "evolve", "uid": "evolve-cluster", "tags": []string{"evolve", "llm"}, "timezone": "browser",
		"schemaVersion": 39, "refresh": "30s", "time": map[string]string{"from": "now-3h", "to": "now"},
		"description": "An evolve cluster: its router, planner, KV pool, engines and API keys (evolve monitoring grafana).",
		"templating": map[string]any{"list": []any{
			map[string]any{"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus"},
			// The scrape jobs label every series with its cluster; All
			// (also series without the label) sums every cluster.
			map[string]any{"name": "cluster", "label": "Cluster", "type": "query", "datasource": datasource,
				"query":      map[string]string{"query": "label_values(evolve_nodes, cluster)", "refId": "cluster"},
				"definition": "label_values(evolve_nodes, cluster)", "refresh": 2, "includeAll": true, "allValue": ".*", "multi": false,
				"current": map[string]any{"text": "All", "value": "$__all"}, "sort": 1}}},
		"panels": panels,
	}
	b, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		panic(err) // maps of strings and numbers always marshal
	}
	return append(b, '\n')
}

var datasource = map[string]string{"type": "prometheus", "uid": "${datasource}"}

// selectorRE finds a metric selector, evolve's or vLLM's: its name
// (metricRE) and its label matchers, if it has any.
var selectorRE = regexp.MustCompile(metricRE.String() + `(?:\{[^}]*\})?`)

// inCluster limits every selector of a dashboard query to the cluster the
// dashboard's Cluster variable names.
func inCluster(expr string) string {
	return selectorRE.ReplaceAllStringFunc(expr, func(sel string) string {
		name, labels, _ := strings.Cut(sel, "{")
		if labels = strings.TrimSuffix(labels, "}"); labels != "" {
			labels = "," + labels
		}
		return name + `{cluster=~"$cluster"` + labels + "}"
	})
}

// metricRE finds metric names in an expression: evolve's and vLLM's.
var metricRE = regexp.MustCompile(`\b(evolve_[a-z0-9_]+|vllm:[a-z0-9_]+)`)

// Metrics are the metric names the dashboard and the rules read, each
// once, sorted; a histogram's series (_bucket) are named as such.
func Metrics() []string {
	var names []string
	for _, r := range rows {
		for _, p := range r.panels {
			for _, t := range p.targets {
				names = append(names, metricRE.FindAllString(t.expr, -1)...)
			}
		}
	}
	for _, r := range alertRules() {
		names = append(names, metricRE.FindAllString(r.Expr, -1)...)
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// AlertRule is one rule of the rules file.
type AlertRule struct {
	Alert       string            `yaml:"alert"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

// alertRules are the rules of the rules file.
func alertRules() []AlertRule {
	var f struct {
		Groups []struct {
			Name  string      `yaml:"name"`
			Rules []AlertRule `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(rules, &f); err != nil {
		panic("monitoring: rules.yaml: " + err.Error()) // a test reads it
	}
	var out []AlertRule
	for _, g := range f.Groups {
		out = append(out, g.Rules...)
	}
	return out
}
