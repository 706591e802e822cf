package orchestrator

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/evolvellm/evolve/roles"
	"github.com/evolvellm/evolve/workload"
)

// readRecording reads every row of a recording directory.
func readRecording(t *testing.T, dir string) []workload.TraceRecord {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, "*.jsonl.gz"))
	var all []workload.TraceRecord
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		zr, err := gzip.NewReader(bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		recs, err := workload.ReadTrace(zr)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		all = append(all, recs...)
	}
	return all
}

func sendTurn(t *testing.T, url, session, prompt string) {
	t.Helper()
	req, _ := http.NewRequest("POST", url+"/v1/chat/completions", strings.NewReader(
		fmt.Sprintf(`{"messages": [{"role": "user", "content": %q}], "max_tokens": 5, "stream": true}`, prompt)))
	req.Header.Set("X-Evolve-Session", session)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	b.ReadFrom(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b.String())
	}
}

// The router records every request it serves: a row each with its times,
// tokens, nodes, session and the agent's tool time since its last
// answer, and the prompt as salted block ids (equal prefixes, equal ids;
// no text), in files a trace replay reads.
func TestRouterRecordsEveryRequest(t *testing.T) {
	dir := t.TempDir()
	tc := startTestClusterWith(t, Config{RecordDir: dir}, nil, roles.Prefill, roles.Decode)
	long := strings.Repeat("the repository's files, read at the start of the session ", 120)
	sendTurn(t, tc.o.RouterURL(), "s1", long)
	time.Sleep(200 * time.Millisecond) // the agent runs a tool
	sendTurn(t, tc.o.RouterURL(), "s1", long+" and the test output")
	sendTurn(t, tc.o.RouterURL(), "s2", "a short question")
	tc.stop() // the recording's last rows are written at the end
	rows := readRecording(t, dir)
	if len(rows) != 3 {
		t.Fatalf("%d rows, want 3", len(rows))
	}
	first, second, other := rows[0], rows[1], rows[2]
	for _, r := range rows {
		if r.Live == nil || r.Version != workload.RecordingVersion || r.Outcome != "ok" || r.API != "chat" || r.E2ESec <= 0 ||
			r.TTFTSec <= 0 || r.TTFTSec > r.E2ESec || r.DecodeNode == "" || r.OutputLength < 1 || r.Router == "" || r.RequestID == "" {
			t.Fatalf("row %+v %+v", r, r.Live)
		}
		if r.CachedGPU+r.CachedHost+r.CachedPeer+r.Computed != r.InputLength {
			t.Errorf("the KV sources of %s add up to %d of %d tokens", r.RequestID, r.CachedGPU+r.CachedHost+r.CachedPeer+r.Computed, r.InputLength)
		}
	}
	if first.Session != "s1" || second.Session != "s1" || other.Session != "s2" {
		t.Fatalf("sessions %q %q %q", first.Session, second.Session, other.Session)
	}
	if first.GapSec != nil || second.GapSec == nil || *second.GapSec < 0.2 || *second.GapSec > 5 {
		t.Fatalf("tool time: the first turn %v, the second %v (slept 0.2 s between)", first.GapSec, second.GapSec)
	}
	if len(first.HashIDs) < 2 || first.HashIDs[0] != second.HashIDs[0] || first.HashIDs[0] == other.HashIDs[0] {
		t.Fatalf("block ids: %v / %v / %v", first.HashIDs, second.HashIDs, other.HashIDs)
	}
	if second.Computed >= second.InputLength/2 {
		t.Errorf("the second turn computed %d of %d tokens: its prefix was the first's", second.Computed, second.InputLength)
	}
	raw, _ := exec.Command("sh", "-c", "zcat "+filepath.Join(dir, "*.jsonl.gz")).Output()
	if bytes.Contains(raw, []byte("repository")) {
		t.Fatal("the recording holds prompt text")
	}
}

// A recording whose disk fills drops rows and counts them, while every
// request is served as before. The directory is a small tmpfs, which the
// test mounts (as root; skipped where it cannot).
func TestRecordingOnAFullDiskDropsRowsNotRequests(t *testing.T) {
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a small file system here (%v: %s)", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", dir).Run() })
	fill, err := os.Create(filepath.Join(dir, "fill"))
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := fill.Write(make([]byte, 64<<10)); err != nil {
			break
		}
	}
	fill.Close()
	tc := startTestClusterWith(t, Config{RecordDir: filepath.Join(dir, "rec")}, nil, roles.Decode)
	if tc.o.rec == nil {
		t.Skip("the recording directory could not be made on the full disk")
	}
	for i := 0; i < 30; i++ {
		sendTurn(t, tc.o.RouterURL(), fmt.Sprint("s", i%3), strings.Repeat("a prompt for the record ", 20+i))
	}
	tc.stop()
	if d, w := tc.o.rec.dropped.Load(), tc.o.rec.written.Load(); d+w != 30 || d == 0 {
		t.Fatalf("%d rows dropped, %d written, of 30 requests served", d, w)
	}
}
