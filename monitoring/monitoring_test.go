package monitoring

import (
	"encoding/json"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// The dashboard is a Grafana dashboard: panels with unique ids, in a grid
// 24 wide that they do not overlap, each querying the data source chosen
// on import with at least one expression.
func TestDashboardIsAWellFormedGrafanaDashboard(t *testing.T) {
	var d struct {
		Title         string `json:"title"`
		UID           string `json:"uid"`
		SchemaVersion int    `json:"schemaVersion"`
		Templating    struct {
			List []struct{ Name, Type string } `json:"list"`
		} `json:"templating"`
		Panels []struct {
			ID      int                      `json:"id"`
			Type    string                   `json:"type"`
			Title   string                   `json:"title"`
			GridPos struct{ H, W, X, Y int } `json:"gridPos"`
			Targets []struct {
				RefID      string            `json:"refId"`
				Expr       string            `json:"expr"`
				Datasource map[string]string `json:"datasource"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(Dashboard(), &d); err != nil {
		t.Fatal(err)
	}
	if d.Title == "" || d.UID == "" || d.SchemaVersion == 0 || len(d.Templating.List) != 2 || d.Templating.List[0].Type != "datasource" || d.Templating.List[1].Name != "cluster" {
		t.Fatalf("dashboard head: %+v", d)
	}
	ids := map[int]bool{}
	cells := map[[2]int]string{}
	queries := 0
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Fatalf("panel id %d twice", p.ID)
		}
		ids[p.ID] = true
		if p.GridPos.X+p.GridPos.W > 24 || p.GridPos.W == 0 || p.GridPos.H == 0 {
			t.Fatalf("panel %q: grid %+v", p.Title, p.GridPos)
		}
		for x := p.GridPos.X; x < p.GridPos.X+p.GridPos.W; x++ {
			for y := p.GridPos.Y; y < p.GridPos.Y+p.GridPos.H; y++ {
				if other, ok := cells[[2]int{x, y}]; ok {
					t.Fatalf("panels %q and %q overlap at %d,%d", other, p.Title, x, y)
				}
				cells[[2]int{x, y}] = p.Title
			}
		}
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Fatalf("panel %q queries nothing", p.Title)
		}
		refs := map[string]bool{}
		for _, q := range p.Targets {
			if q.Expr == "" || refs[q.RefID] || q.Datasource["uid"] != "${datasource}" || strings.Count(q.Expr, "(") != strings.Count(q.Expr, ")") {
				t.Fatalf("panel %q: query %+v", p.Title, q)
			}
			refs[q.RefID] = true
			queries++
		}
	}
	if queries < 20 {
		t.Fatalf("%d queries: the dashboard lost its panels", queries)
	}
}

// Every alert has a name, an expression, a severity and a summary, and the
// file is the rule_files format Prometheus reads.
func TestAlertRulesAreWellFormed(t *testing.T) {
	var f struct {
		Groups []struct {
			Name  string           `yaml:"name"`
			Rules []map[string]any `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(Rules(), &f); err != nil {
		t.Fatal(err)
	}
	if len(f.Groups) != 1 || f.Groups[0].Name == "" {
		t.Fatalf("groups: %+v", f.Groups)
	}
	seen := map[string]bool{}
	for _, r := range alertRules() {
		sev := r.Labels["severity"]
		if r.Alert == "" || seen[r.Alert] || r.Expr == "" || (sev != "info" && sev != "warning" && sev != "critical") ||
			r.Annotations["summary"] == "" || r.Annotations["description"] == "" || strings.Count(r.Expr, "(") != strings.Count(r.Expr, ")") {
			t.Fatalf("rule %+v", r)
		}
		seen[r.Alert] = true
	}
	for _, want := range []string{"EvolveNodeDown", "EvolveRequestsFailing", "EvolveTLSCertificateExpiresSoon", "EvolveAPIKeyAtItsLimit"} {
		if !seen[want] {
			t.Errorf("no alert %s", want)
		}
	}
	for _, r := range f.Groups[0].Rules {
		for k := range r {
			switch k {
			case "alert", "expr", "for", "labels", "annotations":
			default:
				t.Errorf("rule %v: field %q is not Prometheus's", r["alert"], k)
			}
		}
	}
}

func TestMetricsNamesWhatTheQueriesRead(t *testing.T) {
	m := Metrics()
	for _, want := range []string{"evolve_nodes", "evolve_router_e2e_request_latency_seconds_bucket", "vllm:kv_cache_usage_perc", "evolve_tls_certificate_expiry_seconds"} {
		found := false
		for _, n := range m {
			found = found || n == want
		}
		if !found {
			t.Errorf("Metrics() lacks %s: %v", want, m)
		}
	}
}

// The scrape configuration lists the router and the engines, by scheme,
// and file_sd carries the same targets with their job and scheme.
func TestScrapeConfigListsTheClustersTargets(t *testing.T) {
	tg := Targets{Cluster: "lab", Routers: []string{"https://10.0.0.1:8000"}, Engines: []string{"http://10.0.0.5:8000", "http://10.0.0.6:8000"}}
	b, err := ScrapeConfig(tg)
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		ScrapeConfigs []struct {
			JobName       string `yaml:"job_name"`
			Scheme        string `yaml:"scheme"`
			StaticConfigs []struct {
				Targets []string          `yaml:"targets"`
				Labels  map[string]string `yaml:"labels"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	if err := yaml.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	sc := cfg.ScrapeConfigs
	if len(sc) != 2 || sc[0].JobName != "evolve-router" || sc[0].Scheme != "https" || sc[0].StaticConfigs[0].Targets[0] != "10.0.0.1:8000" ||
		sc[1].JobName != "evolve-engines" || sc[1].Scheme != "" || len(sc[1].StaticConfigs[0].Targets) != 2 || sc[1].StaticConfigs[0].Labels["cluster"] != "lab" {
		t.Fatalf("scrape config:\n%s", b)
	}
	if !strings.Contains(string(b), "ca_file") {
		t.Fatalf("an HTTPS router's scrape config says nothing of trusting its CA:\n%s", b)
	}
	j, err := FileSD(tg)
	if err != nil {
		t.Fatal(err)
	}
	var sd []struct {
		Targets []string          `json:"targets"`
		Labels  map[string]string `json:"labels"`
	}
	if err := json.Unmarshal(j, &sd); err != nil || len(sd) != 2 || sd[0].Labels["__scheme__"] != "https" || sd[1].Labels["job"] != "evolve-engines" ||
		len(sd[1].Targets) != 2 {
		t.Fatalf("file_sd: %v\n%s", err, j)
	}
	// With a CA file, the HTTPS job trusts it and the HTTP one has no TLS.
	tg.CAFile = "/etc/prometheus/evolve-ca.pem"
	if b, err = ScrapeConfig(tg); err != nil {
		t.Fatal(err)
	}
	var withCA struct {
		ScrapeConfigs []struct {
			TLSConfig map[string]string `yaml:"tls_config"`
		} `yaml:"scrape_configs"`
	}
	if err := yaml.Unmarshal(b, &withCA); err != nil || len(withCA.ScrapeConfigs) != 2 || withCA.ScrapeConfigs[0].TLSConfig["ca_file"] != tg.CAFile ||
		withCA.ScrapeConfigs[1].TLSConfig != nil || strings.Contains(string(b), "--ca-file") {
		t.Fatalf("scrape config with a CA file: %v\n%s", err, b)
	}
	if _, err := ScrapeConfig(Targets{Routers: []string{"10.0.0.1:8000"}}); err == nil {
		t.Fatal("a router without a scheme was taken")
	}
}

// A router listening on every interface is scraped at the control API's
// host; one with a host keeps it.
func TestReachableRouter(t *testing.T) {
	for _, c := range [][3]string{
		{"https://0.0.0.0:8000", "10.0.0.1:8001", "https://10.0.0.1:8000"},
		{"http://[::]:8000", "orch.lab:8001", "http://orch.lab:8000"},
		{"http://[::]:8000", "[fd00::1]:8001", "http://[fd00::1]:8000"},
		{"http://0.0.0.0:8000", "orch.lab", "http://orch.lab:8000"},
		{"http://10.0.0.2:8000", "10.0.0.1:8001", "http://10.0.0.2:8000"},
		{"http://0.0.0.0:8000", "", "http://0.0.0.0:8000"},
	} {
		if got := ReachableRouter(c[0], c[1]); got != c[2] {
			t.Errorf("ReachableRouter(%q, %q) = %q, want %q", c[0], c[1], got, c[2])
		}
	}
}

// The http_sd configuration asks the control API for the targets, with
// the cluster label, the token file when there is a token, and a word on
// trusting a private CA where something serves HTTPS.
func TestHTTPSDConfigAsksTheControlAPI(t *testing.T) {
	b, err := HTTPSDConfig(HTTPSD{ControlURL: "https://10.0.0.1:8001", Cluster: "lab a", TokenFile: "/etc/prometheus/tok", TargetsTLS: true})
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		ScrapeConfigs []struct {
			JobName       string `yaml:"job_name"`
			HTTPSDConfigs []struct {
				URL           string            `yaml:"url"`
				Authorization map[string]string `yaml:"authorization"`
			} `yaml:"http_sd_configs"`
		} `yaml:"scrape_configs"`
	}
	if err := yaml.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	if sc := cfg.ScrapeConfigs; len(sc) != 1 || len(sc[0].HTTPSDConfigs) != 1 ||
		sc[0].HTTPSDConfigs[0].URL != "https://10.0.0.1:8001/api/v1/prometheus/targets?cluster=lab+a" ||
		sc[0].HTTPSDConfigs[0].Authorization["credentials_file"] != "/etc/prometheus/tok" || sc[0].HTTPSDConfigs[0].Authorization["type"] != "Bearer" {
		t.Fatalf("http_sd config:\n%s", b)
	}
	if strings.Count(string(b), "ca_file") != 2 {
		t.Fatalf("an HTTPS control API and router, and not two words on trusting their CA:\n%s", b)
	}
	b, err = HTTPSDConfig(HTTPSD{ControlURL: "http://10.0.0.1:8001/", Cluster: "evolve"})
	if err != nil || strings.Contains(string(b), "authorization") || strings.Contains(string(b), "ca_file") ||
		!strings.Contains(string(b), "url: http://10.0.0.1:8001/api/v1/prometheus/targets?cluster=evolve\n") {
		t.Fatalf("http_sd config without a token or TLS: %v\n%s", err, b)
	}
	// With a CA file, both the control API and the router are checked
	// against it, and nothing is left to the reader.
	b, err = HTTPSDConfig(HTTPSD{ControlURL: "https://10.0.0.1:8001", Cluster: "lab", TargetsTLS: true, CAFile: "/etc/prometheus/ca.pem"})
	var withCA struct {
		ScrapeConfigs []struct {
			TLSConfig     map[string]string `yaml:"tls_config"`
			HTTPSDConfigs []struct {
				TLSConfig map[string]string `yaml:"tls_config"`
			} `yaml:"http_sd_configs"`
		} `yaml:"scrape_configs"`
	}
	if err != nil || yaml.Unmarshal(b, &withCA) != nil || len(withCA.ScrapeConfigs) != 1 || withCA.ScrapeConfigs[0].TLSConfig["ca_file"] != "/etc/prometheus/ca.pem" ||
		withCA.ScrapeConfigs[0].HTTPSDConfigs[0].TLSConfig["ca_file"] != "/etc/prometheus/ca.pem" || strings.Contains(string(b), "--ca-file") {
		t.Fatalf("http_sd config with a CA file: %v\n%s", err, b)
	}
	if _, err := HTTPSDConfig(HTTPSD{ControlURL: "10.0.0.1:8001"}); err == nil {
		t.Fatal("a control API without a scheme was taken")
	}
}

// The dashboard shows one cluster at a time, All by default: every
// selector of every query carries the Cluster variable's matcher, beside
// the selector's own.
func TestDashboardChoosesACluster(t *testing.T) {
	var d struct {
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				IncludeAll bool   `json:"includeAll"`
				AllValue   string `json:"allValue"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(Dashboard(), &d); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, v := range d.Templating.List {
		found = found || v.Name == "cluster" && v.IncludeAll && v.AllValue == ".*"
	}
	if !found {
		t.Fatalf("no cluster variable with All: %+v", d.Templating.List)
	}
	n := 0
	for _, q := range dashboardQueries(t) {
		names := metricRE.FindAllString(q, -1)
		if len(names) == 0 || strings.Count(q, `{cluster=~"$cluster"`) != len(names) {
			t.Errorf("%s: %d selectors, %d limited to the cluster", q, len(names), strings.Count(q, `cluster=~"$cluster"`))
		}
		n++
	}
	if got := inCluster(`max by (role) (sum by (role, instance) (evolve_nodes{state="serving"}))`); got != `max by (role) (sum by (role, instance) (evolve_nodes{cluster=~"$cluster",state="serving"}))` {
		t.Errorf("a selector with labels: %s", got)
	}
	if n < 20 {
		t.Fatalf("%d queries", n)
	}
}

// dashboardQueries are the expressions of every panel's queries, as the
// dashboard's JSON gives them.
func dashboardQueries(t *testing.T) []string {
	t.Helper()
	var d struct {
		Panels []struct {
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(Dashboard(), &d); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range d.Panels {
		for _, q := range p.Targets {
			out = append(out, q.Expr)
		}
	}
	return out
}
