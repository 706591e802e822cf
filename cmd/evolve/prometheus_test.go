package main

import (
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/evolvellm/evolve/internal/wait"
)

// prometheusBin is the Prometheus server that .ci/run unpacks beside
// promtool from Debian's prometheus package.
func prometheusBin(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("prometheus")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("prometheus is not on PATH: .ci/run unpacks it from Debian's prometheus package")
		}
		t.Skip("prometheus is not on PATH (Debian: apt-get download prometheus, then dpkg-deb -x)")
	}
	return p
}

// A real Prometheus, configured by evolve monitoring scrape --http-sd,
// finds the cluster's router and engines through the control API (with
// its token), scrapes them (the router over HTTPS, trusting the CA file it
// was given), and finds an engine that joins later with nothing run again.
func TestPrometheusFindsTheClusterThroughTheControlAPI(t *testing.T) {
	bin := prometheusBin(t)
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	writeCert(t, certFile, keyFile, 7)
	orch, _ := startOrchestratorLog(t, "--token", "ct", "--tls-cert-file", certFile, "--tls-key-file", keyFile)
	startEngine(t, "--profile", "tiny", "--speedup", "20", "--role", "prefill", "--id", "pre", "--nats", orch.NATSURL)
	startEngine(t, "--profile", "tiny", "--speedup", "20", "--role", "decode", "--id", "dec", "--nats", orch.NATSURL)

	tokenFile := filepath.Join(dir, "control-token")
	if err := os.WriteFile(tokenFile, []byte("ct\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, code := runBinOut(t, nil, "monitoring", "scrape", "--http-sd", "--server", orch.ControlURL, "--token", "wrong"); code != 1 || !strings.Contains(out, "wrong bearer token") {
		t.Fatalf("monitoring scrape --http-sd with a wrong token: exit %d\n%s", code, out)
	}
	out, code := runBinOut(t, nil, "monitoring", "scrape", "--http-sd", "--server", orch.ControlURL, "--token", "ct", "--token-file", tokenFile,
		"--ca-file", certFile, "--cluster", "lab")
	if code != 0 || !strings.Contains(out, "credentials_file: "+tokenFile) || !strings.Contains(out, "ca_file: "+certFile) {
		t.Fatalf("monitoring scrape --http-sd: exit %d\n%s", code, out)
	}
	// Scrape and refresh every second rather than every minute and 30 s.
	cfg := "global:\n  scrape_interval: 1s\n" + strings.Replace(out, "refresh_interval: 30s", "refresh_interval: 1s", 1)
	cfgFile := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgFile, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := freePort(t)
	prom := exec.Command(bin, "--config.file="+cfgFile, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	var promLog lockedLog
	prom.Stdout, prom.Stderr = &promLog, &promLog
	if err := prom.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		prom.Process.Signal(syscall.SIGTERM)
		prom.Wait()
		if t.Failed() {
			t.Logf("prometheus log:\n%s\nits configuration:\n%s", promLog.String(), cfg)
		}
	})

	// up: the scraped targets Prometheus found, by job and instance.
	up := func() map[string]bool {
		resp, err := http.Get("http://" + addr + "/api/v1/targets?state=active")
		if err != nil {
			return nil
		}
		defer resp.Body.Close()
		var body struct {
			Data struct {
				ActiveTargets []struct {
					Labels map[string]string `json:"labels"`
					Health string            `json:"health"`
				} `json:"activeTargets"`
			} `json:"data"`
		}
		if json.NewDecoder(resp.Body).Decode(&body) != nil {
			return nil
		}
		got := map[string]bool{}
		for _, tg := range body.Data.ActiveTargets {
			if tg.Health == "up" && tg.Labels["cluster"] == "lab" {
				got[tg.Labels["job"]+" "+tg.Labels["instance"]] = true
			}
		}
		return got
	}
	host := func(u string) string { return strings.TrimPrefix(strings.TrimPrefix(u, "https://"), "http://") }
	wait.Until(t, 60*time.Second, "Prometheus scraping the router and both engines", func() bool {
		got := up()
		return len(got) == 3 && got["evolve-router "+host(orch.RouterURL)]
	})
	late := startEngine(t, "--profile", "tiny", "--speedup", "20", "--role", "decode", "--id", "late", "--nats", orch.NATSURL)
	wait.Until(t, 60*time.Second, "Prometheus scraping the engine that joined", func() bool {
		return up()["evolve-engines "+host(late.url)]
	})
}
