package orchestrator

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/evolvellm/evolve/controlapi"
	"github.com/evolvellm/evolve/internal/wait"
	"github.com/evolvellm/evolve/roles"
)

// The record keeps its newest events, says from when it is complete, and
// sends watchers what comes after the history they were given; a watcher
// that falls behind is dropped, not waited for.
func TestEventLogIsBoundedAndWatched(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	l := newEventLog(t0, 3)
	l.recording = true
	at := func(i int) controlapi.Event {
		return controlapi.Event{Time: t0.Add(time.Duration(i) * time.Second), Kind: "up", Text: fmt.Sprint("event ", i)}
	}
	l.add(at(1), at(2))
	if h := l.history(); !h.Since.Equal(t0) || len(h.Events) != 2 {
		t.Fatalf("history %+v", h)
	}
	l.add(at(3), at(4), at(5))
	h := l.history()
	if len(h.Events) != 3 || h.Events[0].Text != "event 3" || h.Events[2].Text != "event 5" || !h.Since.Equal(at(2).Time) {
		t.Fatalf("bounded history %+v", h)
	}
	hist, ch := l.watch(1)
	if len(hist.Events) != 3 {
		t.Fatalf("watch history %+v", hist)
	}
	l.add(at(6))
	if e := <-ch; e.Text != "event 6" {
		t.Fatalf("watched %+v", e)
	}
	l.add(at(7), at(8)) // the second does not fit: dropped
	if e, ok := <-ch; !ok || e.Text != "event 7" {
		t.Fatalf("watched %+v %v", e, ok)
	}
	if _, ok := <-ch; ok {
		t.Fatal("a watcher that fell behind was not dropped")
	}
	l.unwatch(ch) // already dropped: no double close
	// Nothing recording: no record to serve, rather than an empty one
	// that reads as "nothing happened".
	if h := newEventLog(t0, 3).history(); !h.Since.IsZero() {
		t.Fatalf("an unfed log claims a record from %v", h.Since)
	}
}

// A watcher that comes after the nodes joined and a role switch ended
// gets them from the orchestrator's record, at the times they happened,
// and what happens next as events of the stream.
func TestNewWatcherGetsTheRecordedHistory(t *testing.T) {
	before := time.Now()
	tc := startTestCluster(t, roles.Prefill, roles.Decode, roles.Decode)
	if _, err := tc.o.SetRole("e1", "prefill", true, "test"); err != nil {
		t.Fatal(err)
	}
	wait.Until(t, 10*time.Second, "switch completes", func() bool {
		st, _ := tc.o.NodeStatus("e1")
		return st.Role == "prefill" && st.Switch == nil && st.State == StateServing
	})
	st, _ := tc.o.NodeStatus("e1")
	switched := st.History[len(st.History)-1].Time
	wait.Until(t, 5*time.Second, "the switch recorded", func() bool {
		for _, e := range tc.o.eventsForTest(t).Events {
			if strings.HasPrefix(e.Text, "e1 is now prefill") {
				return true
			}
		}
		return false
	})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events := make(chan controlapi.WatchEvent, 1024)
	go (&controlapi.Client{Base: tc.o.ControlURL()}).Watch(ctx, "/api/v1/watch", events)
	snap := <-events
	if snap.Type != "snapshot" || snap.HistorySince.IsZero() || snap.HistorySince.Before(before) {
		t.Fatalf("snapshot history since %v (started %v)", snap.HistorySince, before)
	}
	texts := map[string]controlapi.Event{}
	for _, e := range snap.Events {
		texts[strings.SplitN(e.Text, " (", 2)[0]] = e
	}
	for _, want := range []string{"e0 joined as prefill", "e1 joined as decode", "e2 joined as decode", "e1 switching decode -> prefill", "e1 is now prefill"} {
		if _, ok := texts[want]; !ok {
			t.Fatalf("the snapshot's history lacks %q: %+v", want, snap.Events)
		}
	}
	if e := texts["e1 is now prefill"]; !e.Time.Equal(switched) || e.Kind != "switch" || e.Node != "e1" {
		t.Fatalf("the switch is dated %v, its node's history %v: %+v", e.Time, switched, e)
	}
	if e := texts["e0 joined as prefill"]; e.Time.Before(before) || e.Time.After(switched) {
		t.Fatalf("e0 joined at %v, between %v and %v?", e.Time, before, switched)
	}

	// What happens next comes as events of the stream.
	if _, err := tc.o.SetRole("e1", "decode", true, "test"); err != nil {
		t.Fatal(err)
	}
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ev := <-events:
			if ev.Type == "event" && ev.Event != nil && strings.HasPrefix(ev.Event.Text, "e1 is now decode") {
				return
			}
		case <-timeout:
			t.Fatal("the stream never sent the switch back as an event")
		}
	}
}

// eventsForTest reads GET /api/v1/events.
func (o *Orchestrator) eventsForTest(t *testing.T) controlapi.Events {
	t.Helper()
	resp, err := http.Get(o.ControlURL() + "/api/v1/events")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var h controlapi.Events
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
		t.Fatal(err)
	}
	return h
}
