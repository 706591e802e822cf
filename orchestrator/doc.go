// Package orchestrator is the process between agents and engines: the front
// door that routes each request to a prefill and a decode engine, the
// membership of engines and their roles, the cluster-wide KV directory, and
// the control API that the CLI and the monitor use.
//
// The decisions are made by pure code (package routing, kv.Directory); this
// package does the I/O around them: NATS for the engines' registrations, KV
// events and control, HTTP for inference and for the control API, and a
// JetStream key-value bucket for the role overrides that must survive a
// restart.
//
// Where each part lives: the front door and a request's path
// (frontdoor.go, legs.go, continuation.go, the APIs in messages.go and
// responses.go), the cluster's state and its lock (cluster.go), the event
// plane (eventplane.go, natscluster.go, lease.go, leadership.go), roles
// and switches (roles.go, store.go), the control API (control.go), the
// planner loop (planning.go), and what guards against faults: hung legs
// (legwatch.go), a full data directory (diskfull.go), damaged role data
// (roleshadow.go), one greedy client (clientlimits.go, httplimits.go).
// Traffic is recorded by record.go.
package orchestrator
