package main

import (
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
)

// terminal is a tmux server of its own that runs one command in a
// fixed-size window, so that a test reads the screen a user would see.
// Each terminal has its own server socket: with tmux's shared default
// server, closing the last session makes the server exit, and a session
// opened in that moment fails with "server exited unexpectedly".
type terminal struct {
	t    *testing.T
	sock string
}

func requireTmux(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("tmux"); err != nil {
		t.Skip("tmux is not installed (.ci/run installs it)")
	}
}

// openTerminal starts command (a shell command line) in a new terminal of
// width x height cells; the test's cleanup closes it.
func openTerminal(t *testing.T, width, height int, command string) *terminal {
	t.Helper()
	term := &terminal{t: t, sock: filepath.Join(t.TempDir(), "tmux.sock")}
	out, err := term.tmux("new-session", "-d", "-s", "evolve-test", "-x", strconv.Itoa(width), "-y", strconv.Itoa(height), command).CombinedOutput()
	if err != nil {
		t.Fatalf("tmux new-session: %v %s", err, out)
	}
	t.Cleanup(term.close)
	return term
}

func (term *terminal) tmux(args ...string) *exec.Cmd {
	return exec.Command("tmux", append([]string{"-S", term.sock}, args...)...)
}

// screen is the window's text; with escapes, its colour codes too.
func (term *terminal) screen(escapes bool) string {
	args := []string{"capture-pane", "-p", "-t", "evolve-test"}
	if escapes {
		args = append(args, "-e")
	}
	out, _ := term.tmux(args...).Output()
	return string(out)
}

// keys types keys (tmux key names) into the window.
func (term *terminal) keys(keys ...string) {
	term.tmux(append([]string{"send-keys", "-t", "evolve-test"}, keys...)...).Run()
}

// running reports whether the command still runs (its window is open).
func (term *terminal) running() bool {
	return term.tmux("has-session", "-t", "evolve-test").Run() == nil
}

// close stops the terminal's server and whatever still runs in it.
func (term *terminal) close() { term.tmux("kill-server").Run() }
