package monitoring

import (
	"net"
	"net/url"
	"strings"
)

// TargetsPath is where a cluster's control API serves its targets, live,
// in the format of Prometheus's http_sd_configs (the file_sd JSON of
// FileSD); ?cluster=NAME sets the cluster label.
const TargetsPath = "/api/v1/prometheus/targets"

// HTTPSD says where Prometheus finds a cluster's targets itself.
type HTTPSD struct {
	ControlURL string // the control API, e.g. http://10.0.0.1:8001
	Cluster    string // the cluster label every series gets
	// TokenFile is where Prometheus reads the control API's bearer token
	// ("" when the control API takes no token).
	TokenFile string
	// TargetsTLS says some target (the router, an engine) serves HTTPS.
	TargetsTLS bool
	// CAFile is the CA that the control API's and the HTTPS targets'
	// certificates are checked against, as a path on Prometheus's host
	// ("": the system's).
	CAFile string
}

type httpSDJob struct {
	JobName       string         `yaml:"job_name"`
	TLSConfig     *tlsConfig     `yaml:"tls_config,omitempty"` // for HTTPS targets
	HTTPSDConfigs []httpSDConfig `yaml:"http_sd_configs"`
}

type httpSDConfig struct {
	URL             string         `yaml:"url"`
	RefreshInterval string         `yaml:"refresh_interval"`
	Authorization   *authorization `yaml:"authorization,omitempty"`
	TLSConfig       *tlsConfig     `yaml:"tls_config,omitempty"` // for the control API
}

// authorization names its type: Prometheus 2.42 (Debian 12's) sends a
// service discovery's credentials without "Bearer " unless told.
type authorization struct {
	Type            string `yaml:"type"`
	CredentialsFile string `yaml:"credentials_file"`
}

// HTTPSDConfig is the scrape_configs section of prometheus.yml for a
// cluster whose targets Prometheus asks its control API for: engines that
// join, leave or move are scraped within the refresh interval, with
// nothing to run again. Each target's job (evolve-router, evolve-engines)
// and scheme come with it.
func HTTPSDConfig(h HTTPSD) ([]byte, error) {
	u, err := parseBase("control API", h.ControlURL)
	if err != nil {
		return nil, err
	}
	u.Path, u.RawQuery = strings.TrimSuffix(u.Path, "/")+TargetsPath, url.Values{"cluster": {h.Cluster}}.Encode()
	sd := httpSDConfig{URL: u.String(), RefreshInterval: "30s"}
	if h.TokenFile != "" {
		sd.Authorization = &authorization{Type: "Bearer", CredentialsFile: h.TokenFile}
	}
	job := httpSDJob{JobName: "evolve"}
	if u.Scheme == "https" {
		sd.TLSConfig = trust(h.CAFile)
	}
	if h.TargetsTLS {
		job.TLSConfig = trust(h.CAFile)
	}
	job.HTTPSDConfigs = []httpSDConfig{sd}
	head := "# Prometheus scrape configuration for evolve cluster " + h.Cluster + " (evolve monitoring scrape --http-sd):\n" +
		"# Prometheus asks the control API for the router and the engines every 30 s, so engines that\n" +
		"# join or leave need nothing run again. A prometheus.yml of its own, or merge its scrape_configs into yours.\n"
	if h.TokenFile != "" {
		head += "# Write the control API's token to " + h.TokenFile + ", readable by Prometheus\n" +
			"# (evolve up -f keeps a cluster's in the state file it names, as control_token).\n"
	}
	if u.Scheme == "https" && h.CAFile == "" {
		head += "# The control API serves HTTPS: trust a private CA with --ca-file, or tls_config: {ca_file: ca.pem} under http_sd_configs.\n"
	}
	if h.TargetsTLS && h.CAFile == "" {
		head += "# Targets serve HTTPS: trust a private CA with --ca-file, or tls_config: {ca_file: ca.pem} under the job.\n"
	}
	return scrapeConfigs(head, []httpSDJob{job})
}

// ReachableRouter is the router's URL as others reach it: a router that
// listens on every interface (0.0.0.0, [::]) names no host, so the host
// of the control API (host, or host:port), which runs in the same process,
// stands in.
func ReachableRouter(routerURL, controlHost string) string {
	r, err := url.Parse(routerURL)
	if err != nil {
		return routerURL
	}
	if ip := net.ParseIP(r.Hostname()); ip == nil || !ip.IsUnspecified() {
		return routerURL
	}
	host := controlHost
	if h, _, err := net.SplitHostPort(controlHost); err == nil {
		host = h
	}
	host = strings.Trim(host, "[]")
	if host == "" {
		return routerURL
	}
	r.Host = net.JoinHostPort(host, r.Port())
	return r.String()
}
