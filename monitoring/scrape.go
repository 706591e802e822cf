package monitoring

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"

	"gopkg.in/yaml.v3"
)

// Targets are what Prometheus scrapes of one cluster: its router (where
// the orchestrator's metrics are served) and its engines, by base URL.
type Targets struct {
	Cluster string   // the cluster label every series gets
	Router  string   // e.g. https://10.0.0.1:8000
	Engines []string // e.g. http://10.0.0.5:8000
}

// group is the targets of one scheme, as Prometheus lists them.
type group struct {
	scheme  string
	targets []string
}

// groups splits URLs by scheme (host:port each), in their order.
func groups(urls []string) ([]group, error) {
	var out []group
	for _, raw := range urls {
		u, err := url.Parse(raw)
		if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
			return nil, fmt.Errorf("target %q: want http://HOST:PORT or https://HOST:PORT", raw)
		}
		i := len(out) - 1
		for ; i >= 0 && out[i].scheme != u.Scheme; i-- {
		}
		if i < 0 {
			out = append(out, group{scheme: u.Scheme})
			i = len(out) - 1
		}
		out[i].targets = append(out[i].targets, u.Host)
	}
	return out, nil
}

type scrapeJob struct {
	JobName       string         `yaml:"job_name"`
	Scheme        string         `yaml:"scheme,omitempty"`
	StaticConfigs []staticConfig `yaml:"static_configs"`
}

type staticConfig struct {
	Targets []string          `yaml:"targets" json:"targets"`
	Labels  map[string]string `yaml:"labels" json:"labels"`
}

// ScrapeConfig is the scrape_configs section of prometheus.yml for the
// cluster: a job for its router and one for its engines, per scheme.
func ScrapeConfig(t Targets) ([]byte, error) {
	var jobs []scrapeJob
	add := func(name string, urls []string) error {
		gs, err := groups(urls)
		if err != nil {
			return err
		}
		for _, g := range gs {
			j := scrapeJob{JobName: name, StaticConfigs: []staticConfig{{Targets: g.targets, Labels: map[string]string{"cluster": t.Cluster}}}}
			if g.scheme == "https" {
				j.Scheme = "https"
			}
			if len(gs) > 1 {
				j.JobName += "-" + g.scheme
			}
			jobs = append(jobs, j)
		}
		return nil
	}
	if err := add("evolve-router", []string{t.Router}); err != nil {
		return nil, err
	}
	if len(t.Engines) > 0 {
		if err := add("evolve-engines", t.Engines); err != nil {
			return nil, err
		}
	}
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(map[string]any{"scrape_configs": jobs}); err != nil {
		return nil, err
	}
	b := buf.Bytes()
	head := "# Prometheus scrape configuration for evolve cluster " + t.Cluster + " (evolve monitoring scrape):\n" +
		"# a prometheus.yml of its own, or merge its scrape_configs into yours; -o json gives file_sd_configs targets.\n" +
		"# Engines that join later are not listed: run it again, or list them in the file_sd file.\n"
	if strings.HasPrefix(t.Router, "https://") {
		head += "# The router serves HTTPS: trust a private CA with tls_config: {ca_file: ca.pem} under its job.\n"
	}
	return append([]byte(head), b...), nil
}

// FileSD is the cluster's targets in Prometheus's file_sd format (JSON),
// for a file_sd_configs file that is rewritten as engines come and go:
// each group's __scheme__ and job say what it is.
func FileSD(t Targets) ([]byte, error) {
	var out []staticConfig
	for _, part := range []struct {
		job  string
		urls []string
	}{{"evolve-router", []string{t.Router}}, {"evolve-engines", t.Engines}} {
		gs, err := groups(part.urls)
		if err != nil {
			return nil, err
		}
		for _, g := range gs {
			out = append(out, staticConfig{Targets: g.targets, Labels: map[string]string{"cluster": t.Cluster, "job": part.job, "__scheme__": g.scheme}})
		}
	}
	b, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}
