package main

import (
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// A value a flag cannot take is said in words, not in Go's parser's:
// no strconv, no "invalid syntax", whether it came from the command
// line or the environment.
func TestBadFlagValuesAreSaidPlainly(t *testing.T) {
	for _, tc := range []struct {
		env  []string
		args []string
		want string
	}{
		{nil, []string{"up", "--speedup", "10m"}, `--speedup "10m": want a number, such as 10 or 2.5`},
		{nil, []string{"up", "--engines", "four"}, `--engines "four": want a whole number, such as 4`},
		{nil, []string{"up", "--timeout", "10"}, `--timeout "10": missing unit; want a duration with its unit, such as 90s, 10m or 1h30m`},
		{nil, []string{"up", "--detach=maybe"}, `--detach "maybe": want true or false`},
		{[]string{"EVOLVE_UP_SPEEDUP=10m"}, []string{"up"}, `invalid value "10m" for --speedup from EVOLVE_UP_SPEEDUP: want a number`},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			out, code := runBinOut(t, append([]string{"XDG_STATE_HOME=" + t.TempDir()}, tc.env...), tc.args...)
			if code != 2 || !strings.Contains(out, tc.want) || strings.Contains(out, "strconv") || strings.Contains(out, "syntax") || strings.Contains(out, "time:") {
				t.Fatalf("exit %d, want %q:\n%s", code, tc.want, out)
			}
		})
	}
}

// A server that is down is said so in words: no Go text of the request
// and the dial after the sentence.
func TestUnreachableServerIsSaidPlainly(t *testing.T) {
	for _, args := range [][]string{{"nodes"}, {"status"}, {"planner"}, {"top", "--once"}} {
		out, code := runBinOut(t, []string{"XDG_STATE_HOME=" + t.TempDir()}, append(args, "--server", "http://127.0.0.1:1")...)
		if code != 1 || !strings.Contains(out, "connection refused (nothing listens there)") || strings.Contains(out, "dial tcp") || strings.Contains(out, `Get "`) {
			t.Errorf("%v against nothing: exit %d\n%s", args, code, out)
		}
	}
}

// Logs say durations in units (took=71ms, not took=71000000 in JSON),
// and leave out an attribute with no value ("err":null), in both formats;
// evolve logs shows the JSON as the same text.
func TestLogsSayDurationsInUnits(t *testing.T) {
	for _, format := range []string{"json", "text"} {
		var b strings.Builder
		h, err := logHandler(&b, format, slog.LevelInfo)
		if err != nil {
			t.Fatal(err)
		}
		slog.New(h).Info("engine KV resynced", "took", 71*time.Millisecond, "err", nil, "blocks", 3)
		out := b.String()
		if format == "json" {
			out = renderLogLine([]byte(strings.TrimSpace(out)))
		}
		if !strings.Contains(out, "took=71ms") || strings.Contains(out, "err") || !strings.Contains(out, "blocks=3") {
			t.Errorf("%s: %s", format, out)
		}
	}
	if _, err := logHandler(io.Discard, "xml", slog.LevelInfo); err == nil {
		t.Error("an xml log format was taken")
	}
}
