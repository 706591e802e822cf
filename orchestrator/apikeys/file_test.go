package apikeys

import (
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// labelOf is the label a key gets from the keys in force at now ("" if
// refused).
func labelOf(ks *Set, now time.Time, key string) string {
	r := httptest.NewRequest("POST", "/v1/completions", nil)
	r.Header.Set("Authorization", "Bearer "+key)
	l, _ := ks.Get(now).Of(r)
	return l
}

// A key file is read again when it changes, at most once a second: keys
// are added and revoked without a restart, a file that does not load
// leaves the keys in force, and a name whose limits stay keeps its count
// of requests in flight.
func TestKeyFileIsReadAgainWhenItChanges(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys")
	write := func(s string, mod time.Time) {
		t.Helper()
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(path, mod, mod); err != nil { // a file rewritten within a clock tick still changes
			t.Fatal(err)
		}
	}
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	write("# team a\nteam-a sk-1 max-concurrency=1\n", t0)
	var logs strings.Builder // the key set logs from the goroutine that looks at it: this one
	ks, err := NewSet([]string{"ops sk-static"}, path, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if labelOf(ks, t0, "sk-1") != "team-a" || labelOf(ks, t0, "sk-static") != "ops" {
		t.Fatal("the first keys are not in force")
	}
	a := ks.Get(t0).limits["team-a"]
	a.slots <- struct{}{} // one of team-a's answers in flight

	// team-a's key is rotated and team-b gets one.
	write("team-a sk-2 max-concurrency=1\nteam-b sk-3\n", t0.Add(time.Minute))
	if labelOf(ks, t0.Add(500*time.Millisecond), "sk-1") != "team-a" {
		t.Fatal("the file was read again within a second of the last look")
	}
	now := t0.Add(2 * time.Second)
	for key, want := range map[string]string{"sk-1": "", "sk-2": "team-a", "sk-3": "team-b", "sk-static": "ops"} {
		t.Run(key, func(t *testing.T) {
			if got := labelOf(ks, now, key); got != want {
				t.Errorf("after the change, key %s: label %q, want %q", key, got, want)
			}
		})
	}
	if ks.Get(now).limits["team-a"] != a || len(a.slots) != 1 {
		t.Fatal("team-a's limit did not change, but its count of requests in flight was lost")
	}
	if !strings.Contains(logs.String(), "API keys reloaded") || !strings.Contains(logs.String(), "added=2 removed=1") ||
		strings.Contains(logs.String(), "sk-") {
		t.Fatalf("the reload's log (which must name no key):\n%s", logs.String())
	}

	// A change that does not load leaves the keys in force, said once.
	for i, bad := range []string{"team-a sk-4 max-concurrency=many\n", ""} {
		write(bad, t0.Add(time.Duration(2+i)*time.Minute))
		for s := range 3 {
			now = now.Add(2 * time.Second)
			if labelOf(ks, now, "sk-2") != "team-a" || labelOf(ks, now, "sk-4") != "" {
				t.Fatalf("bad file %q, look %d: the keys in force changed", bad, s)
			}
		}
	}
	if n := strings.Count(logs.String(), "does not load"); n != 2 {
		t.Fatalf("%d errors logged for two bad files, want one each:\n%s", n, logs.String())
	}

	// Another limit for team-a starts its count afresh.
	write("team-a sk-2 max-concurrency=4\n", t0.Add(5*time.Minute))
	now = now.Add(2 * time.Second)
	if l := ks.Get(now).limits["team-a"]; l == a || l.Max() != 4 || len(l.slots) != 0 {
		t.Fatalf("team-a's new limit: %+v", l)
	}
	a.Release() // the answer in flight ends on the old count

	// A file gone is an error too; the keys stay.
	os.Remove(path)
	now = now.Add(2 * time.Second)
	if labelOf(ks, now, "sk-2") != "team-a" || !strings.Contains(logs.String(), "API key file unreadable") {
		t.Fatalf("file removed: keys or log wrong:\n%s", logs.String())
	}
}

// A key file as editors write it, with a byte order mark and CRLF line
// ends, reads as the keys it holds.
func TestKeyFileWithAByteOrderMarkAndCRLF(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(path, []byte("\ufeffteam-a sk-1\r\n# a comment\r\n\r\nsk-2\r\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	entries, err := ReadFile(path)
	if err != nil || len(entries) != 2 || entries[0] != "team-a sk-1" || entries[1] != "sk-2" {
		t.Fatalf("entries %q, err %v", entries, err)
	}
}
