package monitoring

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// promtool is Prometheus's checker, when this machine has it (.ci/run
// unpacks Debian's); without it the test is skipped, but not in CI.
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("promtool is not on PATH: .ci/run unpacks it from Debian's prometheus package")
		}
		t.Skip("promtool is not on PATH (Debian: apt-get download prometheus, then dpkg-deb -x)")
	}
	return p
}

// checkRules runs promtool check rules on a rules file's content.
func checkRules(t *testing.T, tool string, content []byte) {
	t.Helper()
	f := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(f, content, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(tool, "check", "rules", f).CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
}

// Prometheus takes the alerting rules, and every query of the dashboard
// parses as PromQL (checked as recording rules, Grafana's
// $__rate_interval read as 5m).
func TestPromtoolTakesTheRulesAndTheDashboardsQueries(t *testing.T) {
	tool := promtool(t)
	checkRules(t, tool, Rules())

	type rule struct {
		Record string `yaml:"record"`
		Expr   string `yaml:"expr"`
	}
	var rules []rule
	for _, q := range dashboardQueries(t) {
		rules = append(rules, rule{Record: "dashboard:query", Expr: strings.ReplaceAll(q, "$__rate_interval", "5m")})
	}
	b, err := yaml.Marshal(map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}})
	if err != nil {
		t.Fatal(err)
	}
	checkRules(t, tool, b)

	// And a query that is not PromQL fails: the check is a real one.
	bad, _ := yaml.Marshal(map[string]any{"groups": []any{map[string]any{"name": "bad", "rules": []rule{{"bad:query", "sum by (le (rate(x[5m])"}}}}})
	f := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(f, bad, 0o644)
	if err := exec.Command(tool, "check", "rules", f).Run(); err == nil {
		t.Fatal("promtool took a query that is not PromQL")
	}
}

// Both scrape configurations are a prometheus.yml Prometheus takes, with
// the files they name (a CA, a token) in place.
func TestPromtoolTakesTheScrapeConfigs(t *testing.T) {
	tool := promtool(t)
	dir := t.TempDir()
	ca, tok := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "token")
	for _, f := range []string{ca, tok} {
		if err := os.WriteFile(f, []byte("x\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	static, err := ScrapeConfig(Targets{Cluster: "lab", Routers: []string{"https://10.0.0.1:8000"},
		Engines: []string{"http://10.0.0.5:8000", "https://10.0.0.6:8000"}, CAFile: ca})
	if err != nil {
		t.Fatal(err)
	}
	httpSD, err := HTTPSDConfig(HTTPSD{ControlURL: "https://10.0.0.1:8001", Cluster: "lab", TokenFile: tok, TargetsTLS: true, CAFile: ca})
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{"static": static, "http_sd": httpSD} {
		t.Run(name, func(t *testing.T) {
			f := filepath.Join(dir, name+".yml")
			if err := os.WriteFile(f, b, 0o644); err != nil {
				t.Fatal(err)
			}
			if out, err := exec.Command(tool, "check", "config", f).CombinedOutput(); err != nil {
				t.Errorf("promtool check config, %s: %v\n%s\n%s", name, err, out, b)
			}
		})
	}
}

// The orchestrators' alerts fire on the series an orchestrator exports:
// no leader for a minute, and one silent for two; a node down that two
// routers both report is one node; and each alert is its cluster's, so
// that a cluster with no prefill node alerts beside one that has some
// (promtool test rules).
func TestPromtoolFiresTheOrchestratorAlerts(t *testing.T) {
	tool := promtool(t)
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "rules.yaml"), Rules(), 0o644)
	tests := `rule_files: [rules.yaml]
evaluation_interval: 15s
tests:
  - interval: 15s
    input_series:
      - series: 'evolve_planner_leaders{cluster="lab",instance="a"}'
        values: '1 1 0x8'
      - series: 'evolve_planner_leaders{cluster="lab",instance="b"}'
        values: '1 1 0x8'
      - series: 'evolve_planner_leaders{cluster="prod",instance="c"}'
        values: '1x10'
      - series: 'evolve_orchestrators{cluster="lab",instance="a",state="silent"}'
        values: '0 0 1x12'
      - series: 'evolve_nodes{cluster="lab",instance="a",role="decode",state="down"}'
        values: '1x12'
      - series: 'evolve_nodes{cluster="lab",instance="b",role="decode",state="down"}'
        values: '1x12'
      - series: 'evolve_nodes{cluster="prod",instance="c",role="decode",state="down"}'
        values: '0x12'
      - series: 'evolve_nodes{cluster="lab",instance="a",role="prefill",state="serving"}'
        values: '0x12'
      - series: 'evolve_nodes{cluster="lab",instance="a",role="decode",state="serving"}'
        values: '2x12'
      - series: 'evolve_nodes{cluster="prod",instance="c",role="prefill",state="serving"}'
        values: '3x12'
      - series: 'evolve_nodes{cluster="prod",instance="c",role="decode",state="serving"}'
        values: '5x12'
    alert_rule_test:
      - eval_time: 2m
        alertname: EvolveNodeDown
        exp_alerts:
          - exp_labels: {severity: warning, cluster: lab}
            exp_annotations:
              summary: "1 evolve node(s) down in cluster lab"
              description: "The router routes around them. 'evolve nodes' says which and why; 'evolve logs NAME' (-f cluster.yaml for a host) shows the engine's log."
      - eval_time: 2m
        alertname: EvolveNoServingRole
        exp_alerts:
          - exp_labels: {severity: critical, cluster: lab}
            exp_annotations:
              summary: "No evolve node serves prefill, or none serves decode, in cluster lab"
              description: "Requests fail with no_engine. 'evolve nodes' shows the roles; 'evolve role set NAME prefill|decode' moves one by hand."
      - {eval_time: 30s, alertname: EvolveNoPlannerLeader, exp_alerts: []}
      - eval_time: 2m
        alertname: EvolveNoPlannerLeader
        exp_alerts:
          - exp_labels: {severity: critical, cluster: lab}
            exp_annotations:
              summary: "No evolve orchestrator leads the planner of cluster lab"
              description: "Nodes keep their roles and routers serve, but nothing moves nodes between roles and operators' role changes are refused (503). A leader's loss moves the lease within 5 s; longer means a majority of the orchestrators (JetStream) is gone: see evolve status and the orchestrators' logs."
      - {eval_time: 1m, alertname: EvolveOrchestratorSilent, exp_alerts: []}
      - eval_time: 3m
        alertname: EvolveOrchestratorSilent
        exp_alerts:
          - exp_labels: {severity: warning, cluster: lab}
            exp_annotations:
              summary: "1 evolve orchestrator(s) of cluster lab silent on the event plane"
              description: "Another orchestrator has not been heard for 3 s: stopped, or cut off from NATS. Agents through its router fail; the others serve on. evolve status lists them."
`
	os.WriteFile(filepath.Join(dir, "tests.yaml"), []byte(tests), 0o644)
	cmd := exec.Command(tool, "test", "rules", "tests.yaml")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
}
