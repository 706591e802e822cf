// Package loadgen is the closed-loop load generator behind evolve bench: it
// drives an OpenAI-compatible router over HTTP with workload's agents (or
// replays a recorded trace), in real time scaled by a speed-up, retries
// as agents' clients do, and measures latency, throughput and where the
// prompts' KV came from. It is the I/O side of package workload, which
// stays pure.
package loadgen
