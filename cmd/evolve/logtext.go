package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"
)

// logText writes JSON log lines (slog's, as evolve's processes write them
// in a cluster) as text a person reads: time, level, message, then the
// other fields as key=value in the order written. Lines that are not
// such JSON (a vLLM server's own output) pass as they are.
type logText struct {
	w    io.Writer
	line []byte // a line begun and not yet ended
}

func (t *logText) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			t.line = append(t.line, p...)
			break
		}
		t.line = append(t.line, p[:i]...)
		p = p[i+1:]
		if _, err := io.WriteString(t.w, renderLogLine(t.line)+"\n"); err != nil {
			return n - len(p), err
		}
		t.line = t.line[:0]
	}
	return n, nil
}

// Flush writes a last line that had no newline.
func (t *logText) Flush() error {
	if len(t.line) == 0 {
		return nil
	}
	_, err := io.WriteString(t.w, renderLogLine(t.line)+"\n")
	t.line = t.line[:0]
	return err
}

// renderLogLine is one JSON log line as text, or the line as it is.
func renderLogLine(line []byte) string {
	if len(line) == 0 || line[0] != '{' {
		return string(line)
	}
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.UseNumber()
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return string(line)
	}
	var when, level, msg string
	var fields []string
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			return string(line)
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return string(line)
		}
		var s string
		isString := json.Unmarshal(v, &s) == nil
		switch key := k.(string); {
		case key == "time" && isString:
			when = s
			if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
				when = t.Local().Format("2006-01-02 15:04:05.000")
			}
		case key == "level" && isString:
			level = s
		case key == "msg" && isString:
			msg = s
		case isString:
			if s == "" || strings.ContainsAny(s, " \t\"=") {
				s = fmt.Sprintf("%q", s)
			}
			fields = append(fields, key+"="+s)
		default:
			fields = append(fields, key+"="+string(v))
		}
	}
	out := fmt.Sprintf("%s %-5s %s", when, level, msg)
	if len(fields) > 0 {
		out += "  " + strings.Join(fields, " ")
	}
	return out
}
