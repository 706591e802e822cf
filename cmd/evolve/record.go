package main

import (
	"compress/gzip"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/evolvellm/evolve/workload"
)

// recording is a trace being written beside its path, which it takes at
// the end: a run that fails before it starts leaves an earlier recording
// whole.
type recording struct {
	path  string
	f     *os.File
	zw    *gzip.Writer // for a path ending in .gz
	w     *workload.TraceWriter
	calls int
	err   error // the first write that failed
}

// startRecording opens a recording for path, gzipped when path ends in
// .gz; its error is the caller's usage error (a folder that does not
// exist, one not writable).
func startRecording(path string) (*recording, error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return nil, err
	}
	if err := f.Chmod(0o644); err != nil { // as os.Create would make it
		f.Close()
		os.Remove(f.Name())
		return nil, err
	}
	r := &recording{path: path, f: f}
	if strings.HasSuffix(path, ".gz") {
		r.zw = gzip.NewWriter(f)
		r.w = workload.NewTraceWriter(r.zw)
	} else {
		r.w = workload.NewTraceWriter(f)
	}
	return r, nil
}

// write records one call sent at ms milliseconds into the run.
func (r *recording) write(ms float64, call workload.Call) {
	if r.err != nil {
		return
	}
	if r.err = r.w.Write(ms, call); r.err == nil {
		r.calls++
	}
}

// keep flushes the recording and puts it at its path.
func (r *recording) keep() error {
	err := r.err
	if err == nil {
		err = r.w.Flush()
	}
	if err == nil && r.zw != nil {
		err = r.zw.Close()
	}
	if cerr := r.f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(r.f.Name(), r.path)
	}
	if err != nil {
		os.Remove(r.f.Name())
		return fmt.Errorf("--record %s: %w", r.path, err)
	}
	return nil
}

// discard removes a recording that was not kept.
func (r *recording) discard() {
	r.f.Close()
	os.Remove(r.f.Name())
}

// readTraceFile reads the trace at path for a replay: a JSONL file
// (gzipped when its bytes say so), or a directory of them (a recording of
// several routers, merged on one clock); the requests not answered are
// left out (workload.TraceRecord.Replayable). An error names the file.
func readTraceFile(path string) ([]workload.TraceRecord, error) {
	all, _, err := readTraces([]string{path})
	if err != nil {
		return nil, err
	}
	out := all[:0]
	for _, r := range all {
		if r.Replayable() {
			out = append(out, r)
		}
	}
	return out, nil
}
