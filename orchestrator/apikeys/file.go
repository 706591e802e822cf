package apikeys

import (
	"bufio"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// ReadFile reads the key entries of a key file: one per line, blank
// lines and lines starting with # skipped. A file with none is an error:
// it would leave the agents' API open or, on a reload, shut.
func ReadFile(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var entries []string
	sc := bufio.NewScanner(f)
	for first := true; sc.Scan(); first = false {
		line := sc.Text()
		if first {
			line = strings.TrimPrefix(line, "\ufeff") // a byte order mark, as some editors write
		}
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		entries = append(entries, line)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(entries) == 0 {
		return nil, fmt.Errorf("%s holds no key", path)
	}
	return entries, nil
}

// Set holds the agents' API keys in force, and reads the key file
// again when it changes (checked at most once a second, as requests come),
// so that a key is added, revoked or given another limit without a
// restart: a secret rotated in place (a Kubernetes secret volume, a
// configuration manager) takes effect within a second. A file that does
// not read or parse is logged, once per change, and the keys in force
// stay. Safe for concurrent use.
type Set struct {
	cur    atomic.Pointer[Keys]
	static []string // entries given otherwise (flags, environment)
	path   string   // "" without a file
	log    *slog.Logger

	checked atomic.Int64 // when the file was last looked at, Unix nanoseconds
	mu      sync.Mutex   // one look at a time
	stamp   fileStamp    // of the file in force, or of the last that failed
}

type fileStamp struct {
	mod  time.Time
	size int64
}

func stampOf(path string) (fileStamp, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return fileStamp{}, err
	}
	return fileStamp{fi.ModTime(), fi.Size()}, nil
}

// NewSet reads the entries and the file (if any).
func NewSet(static []string, path string, log *slog.Logger) (*Set, error) {
	s := &Set{static: static, path: path, log: log}
	var st fileStamp
	entries := static
	if path != "" {
		var err error
		if st, err = stampOf(path); err != nil {
			return nil, fmt.Errorf("API key file: %w", err)
		}
		file, err := ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("API key file: %w", err)
		}
		entries = append(slices.Clip(static), file...)
	}
	ks, err := parse(entries)
	if err != nil {
		return nil, err
	}
	s.cur.Store(&ks)
	s.stamp = st
	return s, nil
}

// Get is the keys in force now, read again first if the file changed.
func (s *Set) Get(now time.Time) *Keys {
	if s.path != "" {
		s.reloadIfChanged(now)
	}
	return s.cur.Load()
}

func (s *Set) reloadIfChanged(now time.Time) {
	// Every request asks: between looks, without a lock.
	if now.UnixNano()-s.checked.Load() < int64(time.Second) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if now.UnixNano()-s.checked.Load() < int64(time.Second) {
		return // another request looked meanwhile
	}
	s.checked.Store(now.UnixNano())
	st, err := stampOf(s.path)
	if err != nil {
		if s.stamp != (fileStamp{}) {
			s.log.Error("API key file unreadable; the keys loaded before stay in force", "file", s.path, "err", err)
			s.stamp = fileStamp{}
		}
		return
	}
	if st == s.stamp {
		return
	}
	s.stamp = st
	old := s.cur.Load()
	file, err := ReadFile(s.path)
	var ks Keys
	if err == nil {
		ks, err = parse(append(slices.Clip(s.static), file...))
	}
	if err != nil {
		s.log.Error("API key file changed but does not load; the keys loaded before stay in force", "file", s.path, "err", err,
			"keys", len(old.keys))
		return
	}
	ks.keepCounts(old)
	s.cur.Store(&ks)
	added, removed := old.diff(&ks)
	s.log.Info("API keys reloaded", "file", s.path, "keys", len(ks.keys), "added", added, "removed", removed,
		"names", ks.names())
}

// keepCounts carries the requests in flight of a name whose limits did
// not change over to the new keys; a name given other limits starts
// afresh (its answers in flight end on the old count).
func (ks *Keys) keepCounts(old *Keys) {
	for name, l := range ks.limits {
		if o := old.limits[name]; o != nil && o.same(l) {
			ks.limits[name] = o
		}
	}
}

// diff counts the keys of next that old lacks, and the reverse.
func (old *Keys) diff(next *Keys) (added, removed int) {
	had := map[string]bool{}
	for _, k := range old.keys {
		had[k.key] = true
	}
	has := map[string]bool{}
	for _, k := range next.keys {
		has[k.key] = true
		if !had[k.key] {
			added++
		}
	}
	for k := range had {
		if !has[k] {
			removed++
		}
	}
	return added, removed
}

// names are the labels of the keys, each once, sorted: what a log may show.
func (ks *Keys) names() []string {
	var out []string
	for _, k := range ks.keys {
		out = append(out, k.label)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Current is the keys in force, without looking at the file (for a
// metrics scrape).
func (s *Set) Current() *Keys { return s.cur.Load() }
