package main

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/evolvellm/evolve/internal/wait"
)

// A full data directory: a pin is refused with why (exit 1, not "now
// decode (pinned)" with exit 0 while the log said it was not stored);
// once the disk is freed the event plane's store takes writes again by
// itself, a leader returns within seconds (before: none for over 2
// minutes, until a restart), a pin is stored, and it survives a kill -9
// and a restart. The data directory is a 40 MiB tmpfs, which this test
// mounts (as root; skipped where it cannot).
func TestFullDataDirectoryLosesNoPinAndRecovers(t *testing.T) {
	mnt := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=40m", "tmpfs", mnt).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a small file system here (%v: %s): this test fills one", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", mnt).Run() })
	data := filepath.Join(mnt, "data")
	do := orchestratorOn(t, data)
	start, server := do.start, do.server
	orch := start()
	startEngine(t, "--id", "e0", "--nats", do.natsURL)
	role := func(args ...string) (string, int) {
		return runBinOut(t, nil, append([]string{"role", "--server", server}, args...)...)
	}
	leader := func() bool {
		var st map[string]any
		b, _ := exec.Command(evolveBin, "status", "--server", server, "-o", "json").Output()
		if json.Unmarshal(b, &st) != nil {
			return false
		}
		l, _ := st["leader"].(string)
		return l != ""
	}
	wait.Until(t, 20*time.Second, "e0 serving under a leader", func() bool {
		out, code := runBinOut(t, nil, "nodes", "--server", server)
		return code == 0 && strings.Contains(out, "serving") && leader()
	})

	fill := filepath.Join(mnt, "fill")
	f, err := os.Create(fill)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1<<20)
	for {
		if _, err := f.Write(buf); err != nil {
			break
		}
	}
	f.Close()
	if out, code := role("set", "e0", "decode", "--pin"); code == 0 || !strings.Contains(out, "was not stored, so nothing changed") {
		t.Fatalf("a pin on a full disk: exit %d\n%s", code, out)
	}
	// The lease can not be renewed either: the leader steps down.
	wait.Until(t, 20*time.Second, "the leader stepping down on the full disk", func() bool { return !leader() })
	os.Remove(fill)
	freed := time.Now()
	wait.Until(t, 30*time.Second, "a leader again after the disk was freed", leader)
	t.Logf("a leader %v after the disk was freed", time.Since(freed).Round(100*time.Millisecond))
	if out, code := role("set", "e0", "decode", "--pin"); code != 0 || !strings.Contains(out, "pinned") {
		t.Fatalf("a pin once the disk has room: exit %d\n%s", code, out)
	}
	// The pin was stored: a killed orchestrator's successor has it.
	orch.Process.Signal(syscall.SIGKILL)
	orch.Wait()
	start()
	wait.Until(t, 30*time.Second, "e0 pinned after the restart", func() bool {
		out, code := runBinOut(t, nil, "nodes", "--server", server)
		return code == 0 && strings.Contains(out, "pinned")
	})
}

// dataOrchestrator is an orchestrator process with its data in a given
// directory, on free ports that stay its own across restarts.
type dataOrchestrator struct {
	t                     *testing.T
	data, server, natsURL string
	router, control, nats string
	logs                  []string // each run's log file
}

func orchestratorOn(t *testing.T, data string) *dataOrchestrator {
	free := func() string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		return ln.Addr().String()
	}
	o := &dataOrchestrator{t: t, data: data, router: free(), control: free(), nats: free()}
	o.server, o.natsURL = "http://"+o.control, "nats://"+o.nats
	return o
}

// start starts it (again, on the same addresses, after a kill).
func (o *dataOrchestrator) start() *exec.Cmd {
	t := o.t
	cmd := exec.Command(evolveBin, "orchestrator", "--data-dir", o.data, "--router-addr", o.router, "--control-addr", o.control,
		"--nats-listen", o.nats, "--log-format", "json")
	path := filepath.Join(t.TempDir(), fmt.Sprintf("orchestrator-%d.log", len(o.logs)))
	o.logs = append(o.logs, path)
	log, _ := os.Create(path)
	cmd.Stderr = log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd
}

// lastLog is the last run's log.
func (o *dataOrchestrator) lastLog() string {
	b, _ := os.ReadFile(o.logs[len(o.logs)-1])
	return string(b)
}
