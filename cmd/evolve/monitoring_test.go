package main

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/evolvellm/evolve/internal/wait"
	"github.com/evolvellm/evolve/monitoring"
	"gopkg.in/yaml.v3"
)

// Every metric the dashboard and the alerts read is served by a real
// cluster (an orchestrator with TLS, API keys with a limit and its planner,
// and two engines, after requests and a role switch), so that a metric
// renamed or dropped breaks this test rather than an operator's graphs.
// evolve monitoring scrape lists that cluster's targets.
func TestMonitoringReadsOnlyMetricsACLusterServes(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	writeCert(t, certFile, keyFile, 48)
	keys := filepath.Join(dir, "keys")
	if err := os.WriteFile(keys, []byte("team-a sk-a max-concurrency=4\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	orch, _ := startOrchestratorLog(t, "--tls-cert-file", certFile, "--tls-key-file", keyFile, "--api-key-file", keys, "--planner", "recommend")
	pre := startEngine(t, "--profile", "tiny", "--speedup", "20", "--role", "prefill", "--id", "pre", "--nats", orch.NATSURL)
	startEngine(t, "--profile", "tiny", "--speedup", "20", "--role", "decode", "--id", "dec", "--nats", orch.NATSURL)
	wait.Until(t, 10*time.Second, "both engines serving", func() bool { return servingNodes(t, orch.ControlURL) == 2 })
	anyCert := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	req, _ := http.NewRequest("POST", orch.RouterURL+"/v1/completions", strings.NewReader(`{"prompt": "Watch the cluster", "max_tokens": 4}`))
	req.Header.Set("Authorization", "Bearer sk-a")
	if resp, err := anyCert.Do(req); err != nil || resp.StatusCode != 200 {
		t.Fatalf("a request through the router: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	// Prompts, one after another (each its own prefill pass), until the
	// planner has learned its costs and predicts.
	n := 0
	wait.Until(t, 60*time.Second, "the planner's predictions", func() bool {
		for range 10 {
			n++
			body := fmt.Sprintf(`{"prompt": "Step %d: %s", "max_tokens": 2}`, n, strings.Repeat("read the log ", 20+n%50))
			req, _ := http.NewRequest("POST", orch.RouterURL+"/v1/completions", strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer sk-a")
			if resp, err := anyCert.Do(req); err == nil {
				resp.Body.Close()
			}
		}
		return strings.Contains(strings.Join(scrape(t, anyCert, orch.RouterURL), "\n"), "evolve_planner_predicted_seconds{")
	})
	if out, code := runBin(t, nil, "role", "set", "pre", "decode", "--server", orch.ControlURL); code != 0 {
		t.Fatalf("role set: exit %d\n%s", code, out)
	}

	families := func(c *http.Client, base string) map[string]bool {
		got := map[string]bool{}
		for _, line := range scrape(t, c, base) {
			if f := strings.Fields(line); len(f) >= 3 && f[0] == "#" && f[1] == "TYPE" {
				got[f[2]] = true
				if f[3] == "histogram" {
					got[f[2]+"_bucket"], got[f[2]+"_sum"], got[f[2]+"_count"] = true, true, true
				}
			}
		}
		return got
	}
	// The role switch's counter shows once it has ended: look a few times.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		served := families(anyCert, orch.RouterURL)
		for n := range families(http.DefaultClient, pre.url) {
			served[n] = true
		}
		var missing []string
		for _, n := range monitoring.Metrics() {
			if !served[n] {
				missing = append(missing, n)
			}
		}
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("metrics the dashboard or the alerts read that the cluster does not serve: %v", missing)
		}
	}

	// The scrape configuration of this cluster: its router over HTTPS,
	// its engines.
	out, code := runBin(t, []string{"SSL_CERT_FILE=" + certFile}, "monitoring", "scrape", "--server", orch.ControlURL, "--cluster", "lab")
	var cfg struct {
		ScrapeConfigs []struct {
			JobName       string `yaml:"job_name"`
			Scheme        string `yaml:"scheme"`
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	if code != 0 || yaml.Unmarshal([]byte(out), &cfg) != nil || len(cfg.ScrapeConfigs) != 2 || cfg.ScrapeConfigs[0].Scheme != "https" ||
		cfg.ScrapeConfigs[0].StaticConfigs[0].Targets[0] != strings.TrimPrefix(orch.RouterURL, "https://") ||
		len(cfg.ScrapeConfigs[1].StaticConfigs[0].Targets) != 2 {
		t.Fatalf("monitoring scrape: exit %d\n%s", code, out)
	}
	out, code = runBin(t, nil, "monitoring", "scrape", "-o", "json", "--server", orch.ControlURL)
	var sd []map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &sd) != nil || len(sd) != 2 {
		t.Fatalf("monitoring scrape -o json: exit %d\n%s", code, out)
	}
	// Prometheus's http_sd: the control API lists the targets as they are
	// now, and an engine that joins is listed with nothing run again.
	sdTargets := func() (router, engines []string) {
		resp, err := anyCert.Get(orch.ControlURL + monitoring.TargetsPath + "?cluster=lab")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var sd []struct {
			Targets []string          `json:"targets"`
			Labels  map[string]string `json:"labels"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&sd); err != nil || resp.StatusCode != 200 {
			t.Fatalf("the control API's Prometheus targets: %d %v", resp.StatusCode, err)
		}
		for _, g := range sd {
			if g.Labels["cluster"] != "lab" {
				t.Fatalf("targets without the cluster label asked for: %+v", sd)
			}
			switch g.Labels["job"] {
			case "evolve-router":
				router = append(router, g.Targets...)
			case "evolve-engines":
				engines = append(engines, g.Targets...)
			}
		}
		return router, engines
	}
	if router, engines := sdTargets(); len(router) != 1 || router[0] != strings.TrimPrefix(orch.RouterURL, "https://") || len(engines) != 2 {
		t.Fatalf("http_sd targets: router %v, engines %v", router, engines)
	}
	late := startEngine(t, "--profile", "tiny", "--speedup", "20", "--role", "decode", "--id", "late", "--nats", orch.NATSURL)
	wait.Until(t, 10*time.Second, "the engine that joined, among the http_sd targets", func() bool {
		_, engines := sdTargets()
		return len(engines) == 3 && slices.Contains(engines, strings.TrimPrefix(late.url, "http://"))
	})
	out, code = runBin(t, nil, "monitoring", "scrape", "--http-sd", "--server", orch.ControlURL, "--cluster", "lab")
	if code != 0 || !strings.Contains(out, "url: "+orch.ControlURL+monitoring.TargetsPath+"?cluster=lab\n") || strings.Contains(out, "authorization") {
		t.Fatalf("monitoring scrape --http-sd: exit %d\n%s", code, out)
	}
	if out, code = runBin(t, nil, "monitoring", "scrape", "--http-sd", "-o", "json", "--server", orch.ControlURL); code != 2 {
		t.Fatalf("monitoring scrape --http-sd -o json: exit %d\n%s", code, out)
	}
	if out, code = runBin(t, nil, "monitoring", "scrape", "-o", "table"); code != 2 {
		t.Fatalf("monitoring scrape -o table: exit %d\n%s", code, out)
	}
	if out, code := runBin(t, nil, "monitoring", "grafan"); code != 2 || !strings.Contains(out, `unknown command "grafan": want one of alerts, grafana, scrape`) {
		t.Fatalf("monitoring with a misspelt subcommand: exit %d\n%s", code, out)
	}
	if out, code := runBin(t, nil, "role", "sett"); code != 2 || !strings.Contains(out, "want one of auto, set") {
		t.Fatalf("role with a misspelt subcommand: exit %d\n%s", code, out)
	}
	for _, sub := range []string{"grafana", "alerts"} {
		if out, code := runBin(t, nil, "monitoring", sub); code != 0 || len(out) < 1000 {
			t.Fatalf("monitoring %s: exit %d\n%s", sub, code, out)
		}
	}
}
