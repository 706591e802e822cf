package apikeys

import (
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// A key's label is its name, or its fingerprint: keys of one name share
// it, and the label says nothing of the key.
func TestAPIKeyLabels(t *testing.T) {
	keys, err := parse([]string{"team-a sk-old", "team-a  sk-new", "sk-unnamed"})
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte("sk-unnamed"))
	want := []apiKey{{"team-a", "sk-old"}, {"team-a", "sk-new"}, {"sha256:" + hex.EncodeToString(sum[:4]), "sk-unnamed"}}
	if !slices.Equal(keys.keys, want) || keys.limits != nil {
		t.Fatalf("parsed %v, want %v", keys, want)
	}
	for key, label := range map[string]string{"sk-new": "team-a", "sk-old": "team-a", "sk-unnamed": want[2].label, "sk-other": ""} {
		t.Run(key, func(t *testing.T) {
			r := httptest.NewRequest("POST", "/v1/completions", nil)
			r.Header.Set("Authorization", "Bearer "+key)
			if got, ok := keys.Of(r); got != label || ok != (label != "") {
				t.Errorf("key %s: label %q (%v), want %q", key, got, ok, label)
			}
		})
	}
}

func TestKeyLimitsParse(t *testing.T) {
	ks, err := parse([]string{"team-a sk-1 max-concurrency=2", "team-a sk-2", "team-a sk-3 max-wait=30s max-concurrency=2",
		"team-b sk-4 max-concurrency=5 max-wait=0s", "team-c sk-5"})
	if err != nil {
		t.Fatal(err)
	}
	if len(ks.limits) != 2 || ks.limits["team-a"].Max() != 2 || ks.limits["team-a"].wait != defaultMaxWait ||
		ks.limits["team-b"].Max() != 5 || ks.limits["team-b"].wait != 0 {
		t.Fatalf("limits %v", ks.limits)
	}
	for entries, want := range map[string]string{
		"team-a sk-1 max-concurrency=2|team-a sk-2 max-concurrency=3": "different limits",
		"team-a sk-1 max-wait=5s":                                     "needs max-concurrency",
		"team-a sk-1 max-concurrency=0":                               "1 or more",
		"team-a sk-1 max-concurrency=two":                             "whole number",
		"team-a sk-1 max-concurrency=2 max-wait=5":                    "with its unit",
		"team-a sk-1 max-concurrency=2 max-wait=-1s":                  "with its unit",
		"team-a sk-1 burst=3":                                         "unknown limit",
		"team-a sk-1 max-concurrency=2 max-concurrency=3":             "twice",
		"team-a sk-1 spare":                                           "KEY or NAME KEY",
	} {
		t.Run(entries, func(t *testing.T) {
			_, err := parse(strings.Split(entries, "|"))
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("%q: error %v, want one saying %q", entries, err, want)
			}
		})
	}
}

// FuzzAPIKeyFile reads arbitrary key files: refused or read, never a
// panic; what is read holds no blank or comment entry, and a file that
// reads makes a key set or a clear error.
func FuzzAPIKeyFile(f *testing.F) {
	f.Add([]byte("# keys\nteam-a sk-aaaa max-concurrency=4 max-wait=10s\n\nsk-bbbb\n"))
	f.Add([]byte("\ufeffsk-with-bom\r\n"))
	f.Add([]byte("team max-concurrency=-1\n"))
	f.Fuzz(func(t *testing.T, content []byte) {
		path := filepath.Join(t.TempDir(), "keys")
		if err := os.WriteFile(path, content, 0o600); err != nil {
			t.Fatal(err)
		}
		entries, err := ReadFile(path)
		if err != nil {
			return
		}
		for _, e := range entries {
			if strings.TrimSpace(e) != e || e == "" || strings.HasPrefix(e, "#") {
				t.Fatalf("entry %q read from %q", e, content)
			}
		}
		_, _ = NewSet(nil, path, slog.New(slog.DiscardHandler))
	})
}
