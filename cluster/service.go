package cluster

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"path"
	"sort"
	"strings"
)

// service is a long-lived process evolve up runs on a host: an engine or
// an orchestrator. Where systemd runs and evolve may write system units
// (as root or with sudo -n) it becomes a systemd unit; elsewhere a
// supervisor script started in the background restarts it when it exits.
// Either way its files live in dir: the script or the environment file,
// its log (<name>.log), the config hash, and for a unit a marker
// (service.unit) naming the unit file, so that stop and status work
// without knowing how it was installed.
type service struct {
	name   string // engine, orchestrator: its files in dir are NAME.env, NAME.log
	unitAs string // its systemd unit is evolve-UNITAS.service; default name
	what   string // for people: "the engine of host gpu-01"
	bin    string
	dir    string
	env    map[string]string
	args   []string
}

// Defaults of Systemd.
const (
	systemdRunDir  = "/run/systemd/system" // exists when systemd is PID 1
	systemdUnitDir = "/etc/systemd/system"
)

// Systemd is how a host runs units: where to look for a running systemd
// and where unit files go (the defaults, except in tests), and the sudo
// prefix its commands need ("" as root).
type Systemd struct {
	RunDir, UnitDir string
	sudo            string
}

// detectSystemd says whether the host runs systemd and evolve may manage
// system units there: as root, or with passwordless sudo. nil means a
// supervised background process.
func detectSystemd(ctx context.Context, c Conn, sd Systemd) *Systemd {
	if sd.RunDir == "" {
		sd.RunDir = systemdRunDir
	}
	if sd.UnitDir == "" {
		sd.UnitDir = systemdUnitDir
	}
	out, err := c.Run(ctx, fmt.Sprintf(`[ -d %s ] && command -v systemctl >/dev/null 2>&1 && { [ "$(id -u)" = 0 ] && echo root || { sudo -n true 2>/dev/null && echo sudo; }; }; true`, shellQuote(sd.RunDir)))
	if err != nil {
		return nil
	}
	switch strings.TrimSpace(out) {
	case "root":
		return &sd
	case "sudo":
		sd.sudo = "sudo -n "
		return &sd
	}
	return nil
}

func (s service) unitName() string { return "evolve-" + cmp.Or(s.unitAs, s.name) + ".service" }

// unit is the systemd unit of s, running as user (empty: root).
func (s service) unit(user string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Written by evolve up: %s. evolve down removes it.\n", s.what)
	fmt.Fprintf(&b, "[Unit]\nDescription=evolve %s (%s)\nAfter=network-online.target\nWants=network-online.target\n\n[Service]\nType=simple\n", s.name, s.what)
	if user != "" && user != "root" {
		fmt.Fprintf(&b, "User=%s\n", user)
	}
	fmt.Fprintf(&b, "WorkingDirectory=%s\nEnvironmentFile=%s/%s.env\nExecStart=%s", s.dir, s.dir, s.name, unitQuote(s.bin))
	for _, a := range s.args {
		b.WriteString(" " + unitQuote(a))
	}
	// mixed: SIGTERM to the main process only (an engine drains, a vLLM
	// agent stops its server), SIGKILL to what is left after the timeout.
	fmt.Fprintf(&b, "\nRestart=always\nRestartSec=1\nKillMode=mixed\nTimeoutStopSec=60\n")
	fmt.Fprintf(&b, "StandardOutput=append:%[1]s/%[2]s.log\nStandardError=append:%[1]s/%[2]s.log\n\n[Install]\nWantedBy=multi-user.target\n", s.dir, s.name)
	return b.String()
}

// envFile is s's environment in systemd's EnvironmentFile syntax (which a
// POSIX shell also reads).
func (s service) envFile() string {
	var b strings.Builder
	for _, k := range sortedKeys(s.env) {
		fmt.Fprintf(&b, "%s=%s\n", k, envQuote(s.env[k]))
	}
	return b.String()
}

// script is s's supervisor script: it runs the binary with args and env,
// and again a second after it exits, until it is stopped.
func (s service) script() string {
	var b strings.Builder
	b.WriteString("#!/bin/sh\n# Written by evolve up: " + s.what + ", restarted when it exits.\n")
	for _, k := range sortedKeys(s.env) {
		fmt.Fprintf(&b, "export %s=%s\n", k, shellQuote(s.env[k]))
	}
	fmt.Fprintf(&b, "trap 'kill $child 2>/dev/null; wait $child; exit 0' TERM INT\n")
	fmt.Fprintf(&b, "while true; do\n  %s", s.bin)
	for _, a := range s.args {
		b.WriteString(" " + shellQuote(a))
	}
	fmt.Fprintf(&b, " &\n  child=$!\n  echo $child > %s/child.pid\n  wait $child\n  sleep 1\ndone\n", s.dir)
	return b.String()
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// unitQuote quotes one word of an ExecStart line: systemd splits on
// spaces, reads double quotes with backslash escapes, and expands $ and %.
func unitQuote(s string) string {
	s = strings.ReplaceAll(s, "%", "%%")
	s = strings.ReplaceAll(s, "$", "$$")
	if s != "" && !strings.ContainsAny(s, " \t\"'\\;") {
		return s
	}
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"`
}

// envQuote quotes a value of an environment file.
func envQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./:=,@") == "" {
		return s
	}
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`, "$", `\$`, "`", "\\`").Replace(s) + `"`
}

// ensureService runs s on the host, as a unit when sd is not nil: its
// files written 0700/0600, started, or restarted when they or the binary
// changed (binSum), left alone otherwise. It returns started, restarted or
// unchanged, or the phase that failed.
func ensureService(ctx context.Context, c Conn, sd *Systemd, s service, binSum string, phase func(string)) (action, failedPhase string, err error) {
	if sd != nil {
		// A unit names absolute paths.
		home, err := c.Run(ctx, "printf %s "+s.dir)
		if err != nil {
			return "failed", PhaseConfig, err
		}
		s.dir = strings.TrimSpace(home)
		bin, err := c.Run(ctx, "printf %s "+s.bin)
		if err != nil {
			return "failed", PhaseConfig, err
		}
		s.bin = strings.TrimSpace(bin)
	}
	user := ""
	definition := "process\n" + s.script()
	if sd != nil {
		u, err := c.Run(ctx, "id -un")
		if err != nil {
			return "failed", PhaseConfig, err
		}
		user = strings.TrimSpace(u)
		definition = "systemd " + path.Join(sd.UnitDir, s.unitName()) + "\n" + s.unit(user) + s.envFile()
	}
	hash := sha256.Sum256([]byte(binSum + "\n" + definition))
	cfgHash := hex.EncodeToString(hash[:])
	old, _ := c.Run(ctx, fmt.Sprintf("cat %s/config.hash 2>/dev/null", s.dir))
	running := isRunning(ctx, c, s.dir)
	if strings.TrimSpace(old) == cfgHash && running {
		return "unchanged", "", nil
	}
	phase(PhaseConfig)
	if sd != nil {
		unitPath := path.Join(sd.UnitDir, s.unitName())
		// A unit of that name for another folder is not ours to replace.
		check := fmt.Sprintf(`[ ! -f %[1]s ] || grep -qx 'WorkingDirectory=%[2]s' %[1]s || { grep '^WorkingDirectory=' %[1]s; exit 3; }`, unitPath, s.dir)
		if out, err := c.Run(ctx, check); err != nil {
			return "failed", PhaseConfig, fmt.Errorf("%s on the host belongs to another evolve (%s): run evolve down for it, or set spec.hosts[].dir to its folder",
				unitPath, strings.TrimSpace(out))
		}
		write := fmt.Sprintf("mkdir -p %[1]s && umask 077 && cat > %[1]s/%[2]s.env <<'EVOLVE_EOF'\n%[3]sEVOLVE_EOF\ncat > %[1]s/%[4]s.new <<'EVOLVE_EOF'\n%[5]sEVOLVE_EOF\n",
			s.dir, s.name, s.envFile(), s.unitName(), s.unit(user))
		if _, err := c.Run(ctx, write); err != nil {
			return "failed", PhaseConfig, err
		}
	} else {
		write := fmt.Sprintf("mkdir -p %[1]s && cat > %[1]s/run.sh.new <<'EVOLVE_EOF'\n%[2]sEVOLVE_EOF\nchmod 700 %[1]s/run.sh.new && mv %[1]s/run.sh.new %[1]s/run.sh", s.dir, s.script())
		if _, err := c.Run(ctx, write); err != nil {
			return "failed", PhaseConfig, err
		}
	}
	phase(PhaseStart)
	action = "started"
	if running {
		action = "restarted"
	}
	// Whatever ran before, under either kind of service, stops first.
	if _, err := c.Run(ctx, stopCommand(s.dir)); err != nil {
		return "failed", PhaseStart, fmt.Errorf("stop the old %s: %w", s.name, err)
	}
	if sd != nil {
		unitPath := path.Join(sd.UnitDir, s.unitName())
		start := fmt.Sprintf("%[1]sinstall -m 0644 %[2]s/%[3]s.new %[4]s && rm -f %[2]s/%[3]s.new && %[1]ssystemctl daemon-reload && %[1]ssystemctl enable %[3]s && %[1]ssystemctl restart %[3]s && echo %[4]s > %[2]s/service.unit && echo %[5]s > %[2]s/config.hash",
			sd.sudo, s.dir, s.unitName(), unitPath, cfgHash)
		if out, err := c.Run(ctx, start); err != nil {
			return "failed", PhaseStart, fmt.Errorf("install and start %s: %w %s", s.unitName(), err, strings.TrimSpace(out))
		}
		return action, "", nil
	}
	// Only the supervisor goes to the background, its descriptors off the
	// SSH session, so that the session ends at once.
	start := fmt.Sprintf("cd %[1]s && { nohup setsid ./run.sh >> %[1]s/%[3]s.log 2>&1 < /dev/null & echo $! > %[1]s/supervisor.pid; } && echo %[2]s > %[1]s/config.hash", s.dir, cfgHash, s.name)
	if _, err := c.Run(ctx, start); err != nil {
		return "failed", PhaseStart, err
	}
	return action, "", nil
}

// isRunning says whether the service in dir runs: its unit is active, or
// its supervisor's process lives.
func isRunning(ctx context.Context, c Conn, dir string) bool {
	out, err := c.Run(ctx, fmt.Sprintf(`u=$(cat %[1]s/service.unit 2>/dev/null); if [ -n "$u" ]; then systemctl is-active --quiet "$(basename "$u")" && echo yes; else kill -0 $(cat %[1]s/supervisor.pid 2>/dev/null) 2>/dev/null && echo yes; fi; true`, dir))
	return err == nil && strings.TrimSpace(out) == "yes"
}

// stopCommand stops the service in dir and removes how it was run: a
// unit is stopped, disabled and deleted (with sudo -n unless root); a
// supervisor is stopped (which stops its child: an engine drains), then
// the child if it outlived it. engine.pid is where earlier versions kept
// the child's pid.
func stopCommand(dir string) string {
	return fmt.Sprintf(`u=$(cat %[1]s/service.unit 2>/dev/null); if [ -n "$u" ]; then S=; [ "$(id -u)" = 0 ] || S="sudo -n"; $S systemctl disable --now "$(basename "$u")" 2>/dev/null; $S rm -f "$u"; $S systemctl daemon-reload; rm -f %[1]s/service.unit; fi; `+
		`p=$(cat %[1]s/supervisor.pid 2>/dev/null); if [ -n "$p" ] && kill -0 $p 2>/dev/null; then kill $p; for i in $(seq 1 100); do kill -0 $p 2>/dev/null || break; sleep 0.1; done; kill -9 $p 2>/dev/null; fi; for f in child.pid engine.pid; do e=$(cat %[1]s/$f 2>/dev/null); [ -n "$e" ] && kill -9 $e 2>/dev/null; done; rm -f %[1]s/supervisor.pid %[1]s/child.pid %[1]s/engine.pid; true`, dir)
}
