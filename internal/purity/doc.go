// Package purity holds the test that keeps evolve's decision code pure:
// the packages that decide (KV directory, planner, routing policies, the
// engine's step model, the simulator, the workload models) take the time
// as an argument and do no I/O, so that the same code runs live and in the
// simulator's virtual time. Its test fails when one of them, or an evolve
// package one of them imports, imports a network, file or process package
// or reads the clock. See docs/development.md.
package purity
