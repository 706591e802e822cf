package vllm

import "testing"

func TestVersionBefore(t *testing.T) {
	for v, before := range map[string]bool{
		"0.9.2": true, "0.10.1": true, "0.10.1.post1": true, "0.9.2+cu128": true, "0.10.2rc1": false,
		"0.10.2": false, "0.10.2.dev45+g1a2b3c": false, "0.11.0": false, "1.0.0": false,
		"": false, "dev": false, "0.10": false,
	} {
		t.Run(v, func(t *testing.T) {
			if got := versionBefore(v, TokenIDsSince); got != before {
				t.Errorf("versionBefore(%q) = %v, want %v", v, got, before)
			}
		})
	}
}
