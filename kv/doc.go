// Package kv holds what every part of evolve agrees on about KV-cache blocks:
// how a token sequence is cut into blocks and hashed, which tier a block copy
// lives in, and the events engines publish when copies appear or disappear.
//
// The package is pure: it imports only the standard library and a hash
// function, reads no clock and does no I/O, so that the router, the engines,
// the KV directory and the simulator can all share it.
package kv
