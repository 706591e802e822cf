package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeSystemctl puts on PATH a systemctl that keeps its units in unitDir
// and runs a unit's ExecStart (with its EnvironmentFile, working
// directory and log) as a background process, logging every call.
func fakeSystemctl(t *testing.T, dir, unitDir string) string {
	bin := filepath.Join(dir, "sbin")
	os.MkdirAll(bin, 0o755)
	script := fmt.Sprintf(`#!/bin/sh
D=%s
echo "$*" >> $D/systemctl.log
[ "$2" = --quiet ] && u=$3 || u=$2
[ "$2" = --now ] && u=$3
key() { sed -n "s/^$1=//p" "$D/$u"; }
case "$1" in
daemon-reload|enable) exit 0 ;;
restart)
  [ -f "$D/$u" ] || { echo "Unit $u not found." >&2; exit 5; }
  [ -f "$D/$u.pid" ] && kill $(cat "$D/$u.pid") 2>/dev/null
  out=$(key StandardOutput | sed 's/^append://')
  ( cd "$(key WorkingDirectory)"; set -a; . "$(key EnvironmentFile)"; set +a; nohup setsid sh -c "exec $(key ExecStart)" >> "$out" 2>&1 < /dev/null & echo $! > "$D/$u.pid" ) ;;
is-active) kill -0 $(cat "$D/$u.pid" 2>/dev/null) 2>/dev/null ;;
disable) [ -f "$D/$u.pid" ] && kill $(cat "$D/$u.pid") 2>/dev/null; rm -f "$D/$u.pid" ;;
*) exit 1 ;;
esac
`, unitDir)
	os.WriteFile(filepath.Join(bin, "systemctl"), []byte(script), 0o755)
	t.Setenv("PATH", bin+":"+os.Getenv("PATH"))
	return filepath.Join(unitDir, "systemctl.log")
}

// Where systemd runs, the engine becomes a unit: enabled, restarted only
// when its config changes, its secrets in a 0600 environment file, and
// evolve down removes it. A unit of the same name for another folder is
// not replaced, and --service systemd fails where systemd does not run.
func TestUpInstallsASystemdUnit(t *testing.T) {
	dir := t.TempDir()
	runDir, unitDir := filepath.Join(dir, "run-systemd"), filepath.Join(dir, "units")
	os.MkdirAll(runDir, 0o755)
	os.MkdirAll(unitDir, 0o755)
	calls := fakeSystemctl(t, dir, unitDir)
	hosts := &fakeHosts{homes: map[string]string{"a": filepath.Join(dir, "a")}}
	f := testFile(t, "a")
	opt := UpOptions{Dial: hosts.dial, Binary: fakeBinary(t, dir, "v1"), NATS: "nats://10.0.0.1:4222", NATSToken: "s3cret",
		Systemd: Systemd{RunDir: runDir, UnitDir: unitDir}}
	ctx := context.Background()
	t.Cleanup(func() { Down(ctx, f, opt) })

	res := Up(ctx, f, opt)
	if res[0].Action != "started" || res[0].Facts.Service != "systemd" {
		t.Fatalf("up: %+v", res[0])
	}
	state := filepath.Join(dir, "a/.local/state/evolve/engine")
	unit, err := os.ReadFile(filepath.Join(unitDir, "evolve-engine.service"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"ExecStart=" + state + "/bin/evolve engine --id a", "--profile tiny", "Restart=always", "KillMode=mixed",
		"EnvironmentFile=" + state + "/engine.env", "WorkingDirectory=" + state, "StandardOutput=append:" + state + "/engine.log", "WantedBy=multi-user.target"} {
		if !strings.Contains(string(unit), want) {
			t.Fatalf("unit lacks %q:\n%s", want, unit)
		}
	}
	if strings.Contains(string(unit), "s3cret") {
		t.Fatal("the event plane's token is in the world-readable unit")
	}
	if fi, err := os.Stat(filepath.Join(state, "engine.env")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("engine.env: %v %v", fi, err)
	}
	// The unit runs the engine with the environment file's settings.
	args := waitFile(t, filepath.Join(state, "args"))
	if !strings.Contains(args, "engine --id a") || !strings.Contains(args, "NATS=nats://s3cret@10.0.0.1:4222") {
		t.Fatalf("engine args %q", args)
	}
	if _, err := os.Stat(filepath.Join(state, "run.sh")); err == nil {
		t.Fatal("a supervisor script beside the unit")
	}

	if st := Status(ctx, f, opt); !st[0].Running || st[0].Service != "systemd "+filepath.Join(unitDir, "evolve-engine.service") {
		t.Fatalf("status: %+v", st[0])
	}

	// Re-running changes nothing; a changed setting restarts the unit.
	log0, _ := os.ReadFile(calls)
	if res = Up(ctx, f, opt); res[0].Action != "unchanged" {
		t.Fatalf("second up: %+v", res[0])
	}
	if log1, _ := os.ReadFile(calls); strings.Count(string(log1), "restart") != strings.Count(string(log0), "restart") {
		t.Fatalf("a converged re-run restarted the unit:\n%s", log1)
	}
	f.Spec.Hosts[0].Engine.Args = []string{"--speedup", "10"}
	if res = Up(ctx, f, opt); res[0].Action != "restarted" || res[0].Facts.Service != "systemd" {
		t.Fatalf("after a config change: %+v", res[0])
	}
	if unit, _ := os.ReadFile(filepath.Join(unitDir, "evolve-engine.service")); !strings.Contains(string(unit), "--speedup 10") {
		t.Fatalf("unit not rewritten:\n%s", unit)
	}

	// Down stops and removes the unit and the files.
	if res = Down(ctx, f, opt); res[0].Action != "stopped" {
		t.Fatalf("down: %+v", res[0])
	}
	for _, p := range []string{filepath.Join(unitDir, "evolve-engine.service"), filepath.Join(state, "service.unit"), filepath.Join(state, "engine.env")} {
		if _, err := os.Stat(p); err == nil {
			t.Fatalf("%s left behind", p)
		}
	}
	if log, _ := os.ReadFile(calls); !strings.Contains(string(log), "disable --now evolve-engine.service") {
		t.Fatalf("systemctl calls:\n%s", log)
	}

	// Another evolve's unit of the same name stays.
	other := "[Service]\nWorkingDirectory=/srv/other-evolve\n"
	os.WriteFile(filepath.Join(unitDir, "evolve-engine.service"), []byte(other), 0o644)
	res = Up(ctx, f, opt)
	if res[0].Action != "failed" || res[0].Phase != PhaseConfig || !strings.Contains(res[0].Error, "belongs to another evolve") ||
		!strings.Contains(res[0].Error, "/srv/other-evolve") {
		t.Fatalf("conflicting unit: %+v", res[0])
	}
	if b, _ := os.ReadFile(filepath.Join(unitDir, "evolve-engine.service")); string(b) != other {
		t.Fatal("another evolve's unit was replaced")
	}
	os.Remove(filepath.Join(unitDir, "evolve-engine.service"))

	// systemd insisted on where it does not run.
	opt.Service, opt.Systemd.RunDir = "systemd", filepath.Join(dir, "no-systemd-here")
	if res = Up(ctx, f, opt); res[0].Phase != PhaseFacts || !strings.Contains(res[0].Error, "does not run systemd") {
		t.Fatalf("forced systemd: %+v", res[0])
	}
	// And auto falls back to a supervised process.
	opt.Service = "auto"
	if res = Up(ctx, f, opt); res[0].Action != "started" || res[0].Facts.Service != "process" {
		t.Fatalf("auto without systemd: %+v", res[0])
	}
	if st := Status(ctx, f, opt); !st[0].Running || st[0].Service != "process" {
		t.Fatalf("status: %+v", st[0])
	}
}

func TestUnitQuoting(t *testing.T) {
	for in, want := range map[string]string{
		"plain":                 "plain",
		`{"kv_role":"kv_both"}`: `"{\"kv_role\":\"kv_both\"}"`,
		"two words":             `"two words"`,
		"100%":                  "100%%",
		"$HOME":                 "$$HOME",
		`back\slash`:            `"back\\slash"`,
	} {
		t.Run(in, func(t *testing.T) {
			if got := unitQuote(in); got != want {
				t.Errorf("unitQuote(%q) = %s, want %s", in, got, want)
			}
		})
	}
	if got := envQuote(`a "b" $c`); got != `"a \"b\" \$c"` {
		t.Errorf("envQuote: %s", got)
	}
}
