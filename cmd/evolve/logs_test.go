package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/evolvellm/evolve/internal/wait"
)

// followLog runs evolve logs with --follow and returns a channel of the
// lines it prints, a stop that interrupts it, as Ctrl-C does, and
// reports how it exited, and its process id.
func followLog(t *testing.T, env []string, args ...string) (<-chan string, func() error, int) {
	t.Helper()
	cmd := exec.Command(evolveBin, append([]string{"logs", "--follow"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 1024)
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	stopped := false
	stop := func() error {
		stopped = true
		cmd.Process.Signal(syscall.SIGINT)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			return err
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			return <-done
		}
	}
	t.Cleanup(func() {
		if !stopped {
			stop()
		}
	})
	return lines, stop, cmd.Process.Pid
}

// atEndOfAFile says whether process pid holds a regular file open past
// its start (Linux's /proc): evolve logs has read a log to where it
// follows it from, so a line written now is one it prints.
func atEndOfAFile(pid int) bool {
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	for _, fd := range fds {
		target, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if err != nil || !strings.HasSuffix(target, ".log") {
			continue
		}
		info, _ := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%s", pid, fd.Name()))
		var pos int64
		for _, line := range strings.Split(string(info), "\n") {
			if v, ok := strings.CutPrefix(line, "pos:"); ok {
				pos, _ = strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			}
		}
		if st, err := os.Stat(target); err == nil && st.Mode().IsRegular() && pos > 0 && pos >= st.Size() {
			return true
		}
	}
	return false
}

// waitLine reads lines until one contains want.
func waitLine(t *testing.T, lines <-chan string, want string) {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("evolve logs ended before a line with %q", want)
			}
			if strings.Contains(l, want) {
				return
			}
		case <-deadline:
			t.Fatalf("no line with %q in 20 s", want)
		}
	}
}

// evolve logs lists a local cluster's logs, prints a log's end, refuses a
// name that is none, and follows a log as its process writes it until
// Ctrl-C.
func TestLogsOfALocalCluster(t *testing.T) {
	c := upCluster(t, "--engines", "2")
	out, code := runBinOut(t, c.env, "logs")
	if code != 0 || strings.Fields(out)[0] != "engine-0" || !strings.Contains(out, "orchestrator") {
		t.Fatalf("evolve logs: exit %d\n%s", code, out)
	}
	out, code = runBinOut(t, c.env, "logs", "engine-0", "--tail", "1")
	if code != 0 || strings.Count(out, "\n") != 1 || !strings.Contains(out, " INFO  engine ready  id=engine-0 ") {
		t.Fatalf("evolve logs engine-0 --tail 1: exit %d\n%s", code, out)
	}
	out, code = runBinOut(t, c.env, "logs", "engine-0", "--tail", "1", "-o", "json")
	if code != 0 || strings.Count(out, "\n") != 1 || !strings.Contains(out, `"msg":"engine ready"`) {
		t.Fatalf("evolve logs engine-0 --tail 1 -o json: exit %d\n%s", code, out)
	}
	if out, code = runBinOut(t, c.env, "logs", "engine-9"); code != 2 || !strings.Contains(out, "there are engine-0, engine-1, orchestrator") {
		t.Fatalf("evolve logs engine-9: exit %d\n%s", code, out)
	}
	if out, code = runBinOut(t, c.env, "logs", "engine-0", "--tail", "-2"); code != 2 {
		t.Fatalf("evolve logs --tail -2: exit %d\n%s", code, out)
	}

	lines, stop, pid := followLog(t, c.env, "orchestrator", "--tail", "0")
	wait.Until(t, 10*time.Second, "evolve logs at the end of the log", func() bool { return atEndOfAFile(pid) })
	if out, code := runBinOut(t, c.env, "role", "set", "engine-1", "prefill"); code != 0 {
		t.Fatalf("role set: exit %d\n%s", code, out)
	}
	waitLine(t, lines, "INFO  role switched  component=orchestrator id=engine-1 from=decode to=prefill")
	if err := stop(); err != nil {
		t.Fatalf("evolve logs --follow after Ctrl-C: %v", err)
	}
}

// The start of a file's last n lines, whether or not it ends in a
// newline, and all of it or none.
func TestLastLines(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		text string
		n    int
		want string
	}{
		{"a\nb\nc\n", 2, "b\nc\n"},
		{"a\nb\nc", 2, "b\nc"},
		{"a\nb\nc\n", 5, "a\nb\nc\n"},
		{"a\nb\nc\n", -1, "a\nb\nc\n"},
		{"a\nb\nc\n", 0, ""},
		{"", 3, ""},
		{strings.Repeat("x", 70000) + "\n" + "last\n", 1, "last\n"},
		{"a\n" + strings.Repeat("y", 140000) + "\n", 1, strings.Repeat("y", 140000) + "\n"},
	} {
		t.Run(tc.text, func(t *testing.T) {
			path := filepath.Join(dir, "log")
			os.WriteFile(path, []byte(tc.text), 0o600)
			f, _ := os.Open(path)
			off, err := lastLines(f, tc.n)
			f.Seek(off, io.SeekStart)
			got, _ := io.ReadAll(f)
			f.Close()
			if err != nil || string(got) != tc.want {
				t.Errorf("last %d lines of %.20q: %.20q (%v), want %.20q", tc.n, tc.text, got, err, tc.want)
			}
		})
	}
}

// Following a log goes on through its truncation and its replacement by
// a new file (a cluster brought up again), from the new start.
func TestTailFileFollowsThroughANewLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "engine-0.log")
	os.WriteFile(path, []byte("one\ntwo\n"), 0o600)
	ctx, cancel := context.WithCancel(context.Background())
	var out lockedLog
	done := make(chan error, 1)
	go func() { done <- tailFile(ctx, path, 1, true, &out) }()
	wait := func(want string) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for out.String() != want {
			if time.Now().After(deadline) {
				t.Fatalf("followed %q, want %q", out.String(), want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	wait("two\n")
	f, _ := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString("three\n")
	f.Close()
	wait("two\nthree\n")
	os.WriteFile(path, []byte("a\n"), 0o600) // truncated, shorter
	wait("two\nthree\na\n")
	os.Remove(path)
	os.WriteFile(path, []byte("new file\n"), 0o600)
	wait("two\nthree\na\nnew file\n")
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// A JSON log line reads as time, level, message and the other fields in
// the order written; a line that is not one passes as it is, and a line
// written in pieces comes out whole.
func TestLogText(t *testing.T) {
	var out strings.Builder
	lt := &logText{w: &out}
	in := `{"time":"2026-12-01T17:17:47.221786714Z","level":"WARN","msg":"engine down","id":"e0","why":"missed heartbeats","n":3,"ok":true,"kv":{"a":1}}` + "\n" +
		"INFO 12-01 17:17:47 [api_server.py] vLLM's own line\n" + `{"level":"INFO","msg":"no time","path":""}`
	for _, piece := range []string{in[:10], in[10:150], in[150:]} {
		lt.Write([]byte(piece))
	}
	lt.Flush()
	when := time.Date(2026, 12, 1, 17, 17, 47, 221786714, time.UTC).Local().Format("2006-01-02 15:04:05.000")
	want := when + ` WARN  engine down  id=e0 why="missed heartbeats" n=3 ok=true kv={"a":1}` + "\n" +
		"INFO 12-01 17:17:47 [api_server.py] vLLM's own line\n" + ` INFO  no time  path=""` + "\n"
	if out.String() != want {
		t.Fatalf("rendered\n%s\nwant\n%s", out.String(), want)
	}
}
