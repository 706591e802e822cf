//go:build !linux

package kv

// AdviseHugePages does nothing outside Linux.
func AdviseHugePages[T any](s []T) {}
