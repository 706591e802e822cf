package monitoring

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
)

// Targets are what Prometheus scrapes of one cluster: its router (where
// the orchestrator's metrics are served) and its engines, by base URL.
type Targets struct {
	Cluster string // the cluster label every series gets
	// Routers: e.g. https://10.0.0.1:8000; of several orchestrators,
	// each one's router (each counts the requests it routes).
	Routers []string
	Engines []string // e.g. http://10.0.0.5:8000
	// CAFile is the CA that HTTPS targets' certificates are checked
	// against, as a path on Prometheus's host ("": the system's).
	CAFile string
}

// group is the targets of one job and one scheme, as Prometheus lists
// them; split says the job's targets come in more than one scheme.
type group struct {
	job, scheme string
	split       bool
	targets     []string
}

// groups are the cluster's router and engines, by job and then scheme
// (host:port each), in their order.
func (t Targets) groups() ([]group, error) {
	var out []group
	for _, part := range []struct {
		job  string
		urls []string
	}{{"evolve-router", t.Routers}, {"evolve-engines", t.Engines}} {
		first := len(out)
		for _, raw := range part.urls {
			u, err := parseBase("target", raw)
			if err != nil {
				return nil, err
			}
			i := len(out) - 1
			for ; i >= first && out[i].scheme != u.Scheme; i-- {
			}
			if i < first {
				out = append(out, group{job: part.job, scheme: u.Scheme})
				i = len(out) - 1
			}
			out[i].targets = append(out[i].targets, u.Host)
		}
		for i := first; i < len(out); i++ {
			out[i].split = len(out)-first > 1
		}
	}
	return out, nil
}

type scrapeJob struct {
	JobName       string         `yaml:"job_name"`
	Scheme        string         `yaml:"scheme,omitempty"`
	TLSConfig     *tlsConfig     `yaml:"tls_config,omitempty"`
	StaticConfigs []staticConfig `yaml:"static_configs"`
}

type tlsConfig struct {
	CAFile string `yaml:"ca_file"`
}

// trust is the tls_config that checks certificates against caFile, or
// nil for the system's CAs.
func trust(caFile string) *tlsConfig {
	if caFile == "" {
		return nil
	}
	return &tlsConfig{CAFile: caFile}
}

type staticConfig struct {
	Targets []string          `yaml:"targets" json:"targets"`
	Labels  map[string]string `yaml:"labels" json:"labels"`
}

// ScrapeConfig is the scrape_configs section of prometheus.yml for the
// cluster: a job for its router and one for its engines, per scheme.
func ScrapeConfig(t Targets) ([]byte, error) {
	gs, err := t.groups()
	if err != nil {
		return nil, err
	}
	var jobs []scrapeJob
	for _, g := range gs {
		j := scrapeJob{JobName: g.job, StaticConfigs: []staticConfig{{Targets: g.targets, Labels: map[string]string{"cluster": t.Cluster}}}}
		if g.scheme == "https" {
			j.Scheme, j.TLSConfig = "https", trust(t.CAFile)
		}
		if g.split {
			j.JobName += "-" + g.scheme
		}
		jobs = append(jobs, j)
	}
	head := "# Prometheus scrape configuration for evolve cluster " + t.Cluster + " (evolve monitoring scrape):\n" +
		"# a prometheus.yml of its own, or merge its scrape_configs into yours; -o json gives file_sd_configs targets.\n" +
		"# Engines that join later are not listed: run it again, or use --http-sd, which asks the cluster as it changes.\n"
	if slices.ContainsFunc(t.Routers, func(r string) bool { return strings.HasPrefix(r, "https://") }) && t.CAFile == "" {
		head += "# The router serves HTTPS: trust a private CA with --ca-file, or tls_config: {ca_file: ca.pem} under its job.\n"
	}
	return scrapeConfigs(head, jobs)
}

// scrapeConfigs is a prometheus.yml of jobs alone, after the comment head.
func scrapeConfigs(head string, jobs any) ([]byte, error) {
	buf := bytes.NewBufferString(head)
	enc := yaml.NewEncoder(buf)
	enc.SetIndent(2)
	if err := enc.Encode(map[string]any{"scrape_configs": jobs}); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// parseBase reads the base URL of a server Prometheus reaches (what names
// it in errors): http or https, with a host.
func parseBase(what, raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return nil, fmt.Errorf("%s %q: want http://HOST:PORT or https://HOST:PORT", what, raw)
	}
	return u, nil
}

// FileSD is the cluster's targets in Prometheus's file_sd format (JSON),
// for a file_sd_configs file that is rewritten as engines come and go:
// each group's __scheme__ and job say what it is.
func FileSD(t Targets) ([]byte, error) {
	gs, err := t.groups()
	if err != nil {
		return nil, err
	}
	var out []staticConfig
	for _, g := range gs {
		out = append(out, staticConfig{Targets: g.targets, Labels: map[string]string{"cluster": t.Cluster, "job": g.job, "__scheme__": g.scheme}})
	}
	b, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}
