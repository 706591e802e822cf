// Package stepmodel is the simulated engine: a pure step model of one GPU engine (a
// GPU or a tensor-parallel group) that the live `evolve engine --backend sim`
// runs against the wall clock and the simulator runs in virtual time.
//
// A Model holds vLLM v1-style continuous batching (waiting and running queues,
// a token budget per pass, chunked prefill, one decode token per running
// sequence per pass, preemption by recompute under KV pressure), a cost model
// per forward pass from a Profile, and a paged KV cache with a GPU tier and a
// host-memory tier. Step(now) runs one forward pass and returns how long it
// takes and what it produced; nothing here reads a clock, sleeps or does I/O.
//
// KV tiers: a prefix found on GPU costs nothing, one found in the host tier
// costs its copy to GPU (host_gbps), one pulled from a peer costs the network
// transfer (network_gbps), anything else is recomputed. Blocks evicted from
// GPU are offloaded to host, never dropped; host eviction drops. Eviction
// order comes from an EvictionPolicy, which takes per-block priority hints.
//
// Output token ids come from the tokenizer's output vocabulary, so that text
// an engine produced tokenizes back to the same ids.
package stepmodel
