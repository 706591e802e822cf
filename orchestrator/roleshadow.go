package orchestrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/evolvellm/evolve/protocol"
	"github.com/nats-io/nats.go/jetstream"
)

// Role overrides and pins live in a JetStream bucket; a copy of them, kept
// in the data directory beside JetStream's files, tells what a damaged
// store lost. JetStream drops what it cannot read from a truncated or
// corrupt block and starts with the rest: the pins in it were lost
// silently. At start the orchestrator compares the copy with the bucket,
// warns naming each override the bucket lost, and writes it back.

// roleShadowFile is the copy's name in the data directory.
const roleShadowFile = "role-overrides.json"

// roleShadow is the copy of the role overrides.
type roleShadow struct {
	path string
	mu   sync.Mutex
	recs map[string]roleRecord
}

// openRoleShadow reads the copy in dir ("" keeps none); a copy that
// cannot be read is said, and written again from the bucket.
func (o *Orchestrator) openRoleShadow(dir string) *roleShadow {
	if dir == "" {
		return nil
	}
	s := &roleShadow{path: filepath.Join(dir, roleShadowFile), recs: map[string]roleRecord{}}
	b, err := os.ReadFile(s.path)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		o.log.Warn("the copy of the role overrides cannot be read; it is written again from the store", "file", s.path, "err", err)
	default:
		if err := json.Unmarshal(b, &s.recs); err != nil {
			o.log.Warn("the copy of the role overrides is damaged; it is written again from the store", "file", s.path, "err", err)
			s.recs = map[string]roleRecord{}
		}
	}
	return s
}

// set records id's override and writes the copy.
func (s *roleShadow) set(id string, r roleRecord) error {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.recs[id]; ok && old == r {
		return nil
	}
	s.recs[id] = r
	return s.writeLocked()
}

func (s *roleShadow) writeLocked() error {
	b, _ := json.MarshalIndent(s.recs, "", "  ")
	tmp := s.path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, s.path)
}

// reconcileRoles compares the copy with the bucket at start: an override
// the copy has and the bucket lost (or holds unreadable) is said, naming
// it, and written back; what the bucket holds otherwise is the truth (it
// may have changed through another orchestrator), and the copy follows
// it.
func (o *Orchestrator) reconcileRoles(ctx context.Context) {
	s := o.shadow
	if s == nil || o.store == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	held := map[string]roleRecord{}
	if keys, err := o.store.kv.Keys(ctx); err == nil {
		for _, k := range keys {
			if protocol.ValidateEngineID(k) != nil {
				continue // the store's probe
			}
			if r, ok := o.store.get(k); ok {
				held[k] = r
			}
		}
	} else if !errors.Is(err, jetstream.ErrNoKeysFound) {
		o.log.Warn("the role overrides could not be read back to check them", "err", err)
		return
	}
	s.mu.Lock()
	var lost []string
	restored := map[string]roleRecord{}
	for id, r := range s.recs {
		if _, ok := held[id]; ok {
			continue
		}
		if err := o.store.put(id, r); err != nil {
			o.log.Warn("a lost role override could not be written back", "id", id, "err", err)
			continue
		}
		held[id] = r
		restored[id] = r
		lost = append(lost, describeOverride(id, r))
	}
	s.recs = held
	err := s.writeLocked()
	s.mu.Unlock()
	o.applyRestored(restored)
	if len(lost) > 0 {
		sort.Strings(lost)
		o.log.Warn("the event plane's store had lost role overrides (its data damaged?); written back from the copy in the data directory",
			"lost", strings.Join(lost, ", "), "copy", s.path)
	}
	if err != nil {
		o.log.Warn("the copy of the role overrides is not written", "file", s.path, "err", err)
	}
}

func describeOverride(id string, r roleRecord) string {
	if r.Pinned {
		return fmt.Sprintf("%s %s (pinned)", id, r.Role)
	}
	return fmt.Sprintf("%s %s", id, r.Role)
}

// applyRestored gives the nodes registered already the overrides written
// back: their pins at once, their roles through a switch (on the leader).
func (o *Orchestrator) applyRestored(recs map[string]roleRecord) {
	var switches []string
	o.c.mu.Lock()
	for id, r := range recs {
		n := o.c.nodes[id]
		if n == nil {
			continue // it gets them when it registers
		}
		mode := ModeAuto
		if r.Pinned {
			mode = ModePinned
		}
		if n.mode != mode {
			n.mode = mode
			o.c.changed(id)
		}
		if to, ok := parseRole(r.Role); ok && n.role != to {
			switches = append(switches, id)
		}
	}
	o.c.mu.Unlock()
	if !o.leading() {
		return
	}
	for _, id := range switches {
		if _, err := o.setRole(id, recs[id].Role, recs[id].Pinned, "restored override", false); err != nil {
			o.log.Warn("a restored role override could not be applied", "id", id, "err", err)
		}
	}
}
