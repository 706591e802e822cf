// Package vllm runs a vLLM server as an evolve engine: the agent
// (Replica) registers it with the orchestrator, turns its ZMQ KV events
// (--kv-events-config) into evolve's (Translator, Subscriber), reads its
// load from its Prometheus metrics for heartbeats, and answers the control
// requests that make sense for an engine that manages its own KV. Routers
// send inference straight to vLLM's OpenAI server with the
// kv_transfer_params of its NixlConnector, and tokenize prompts with its
// POST /tokenize so that block hashes agree. Launch starts and supervises
// the server when the agent owns it.
//
// The facts it relies on, from vLLM's source and docs (v0.11 and later):
// events come positional or as maps, with any number of trailing fields;
// block hashes are opaque; a sequence gap is repaired from the replay
// endpoint or by starting over.
package vllm
