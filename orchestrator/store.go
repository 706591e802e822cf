package orchestrator

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/evolvellm/evolve/protocol"
	"github.com/evolvellm/evolve/roles"
	"github.com/nats-io/nats.go/jetstream"
)

// roleBucket is the JetStream key-value bucket of role overrides: key node
// id, value roleRecord. It survives orchestrator restarts.
const roleBucket = "evolve_roles"

type roleRecord struct {
	Role   string `json:"role"`
	Pinned bool   `json:"pinned"`
}

type roleStore struct {
	kv jetstream.KeyValue
}

func openRoleStore(ctx context.Context, js jetstream.JetStream, replicas int) (*roleStore, error) {
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: roleBucket, Description: "evolve role overrides", History: 5, Replicas: replicas})
	if err != nil {
		return nil, fmt.Errorf("open key-value bucket %s: %w", roleBucket, err)
	}
	return &roleStore{kv: kv}, nil
}

func (s *roleStore) get(id string) (roleRecord, bool) {
	if s == nil {
		return roleRecord{}, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	e, err := s.kv.Get(ctx, id)
	if err != nil {
		return roleRecord{}, false
	}
	var r roleRecord
	if json.Unmarshal(e.Value(), &r) != nil {
		return roleRecord{}, false
	}
	return r, true
}

func (s *roleStore) put(id string, r roleRecord) error {
	if s == nil {
		return nil
	}
	b, _ := json.Marshal(r)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := s.kv.Put(ctx, id, b)
	return err
}

func (s *roleStore) unpin(id string) error {
	if s == nil {
		return nil
	}
	r, ok := s.get(id)
	if !ok {
		return nil
	}
	r.Pinned = false
	return s.put(id, r)
}

// applyStoredRole gives a (re)registering node the role and mode an
// operator set. Call with c.mu held.
func (o *Orchestrator) applyStoredRole(id string, n *node) {
	r, ok := o.store.get(id)
	if !ok {
		return
	}
	if r.Role == "prefill" {
		n.role = roles.Prefill
	} else if r.Role == "decode" {
		n.role = roles.Decode
	}
	if r.Pinned {
		n.mode = ModePinned
	} else {
		n.mode = ModeAuto
	}
}

// followPins keeps every node's mode as the store says, until ctx ends:
// a pin or unpin made through any orchestrator (the leader stores it)
// shows on all, and a new leader knows every pin.
func (o *Orchestrator) followPins(ctx context.Context) {
	if o.store == nil {
		return
	}
	o.reconcileRoles(ctx)
	w, err := o.store.kv.WatchAll(ctx, jetstream.UpdatesOnly())
	if err != nil {
		o.log.Warn("pins made through other orchestrators will show here only when their nodes register again", "err", err)
		return
	}
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case e, ok := <-w.Updates():
			if !ok {
				return
			}
			var r roleRecord
			if e == nil || e.Operation() != jetstream.KeyValuePut || json.Unmarshal(e.Value(), &r) != nil {
				continue
			}
			if protocol.ValidateEngineID(e.Key()) == nil {
				if err := o.shadow.set(e.Key(), r); err != nil {
					o.log.Warn("the copy of the role overrides is not written", "err", err)
				}
			}
			mode := ModeAuto
			if r.Pinned {
				mode = ModePinned
			}
			o.c.mu.Lock()
			if n := o.c.nodes[e.Key()]; n != nil && n.mode != mode {
				n.mode = mode
				o.c.changed(e.Key())
			}
			o.c.mu.Unlock()
		}
	}
}
