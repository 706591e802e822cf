package protocol

import (
	"strings"
	"testing"
)

// A registration a router cannot use is refused with what is wrong with
// it: a block size it cannot hash prompts by once set the whole cluster's.
func TestRegistrationValidate(t *testing.T) {
	good := Registration{ID: "e0", URL: "http://10.0.0.5:8000", Model: "m", BlockSize: 16, GPUBlocks: 1000}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, want string
		mend       func(*Registration)
	}{
		{"id in a subject", "engine id", func(r *Registration) { r.ID = "a.b" }},
		{"no url", "not an http(s) URL", func(r *Registration) { r.URL = "" }},
		{"a file url", "not an http(s) URL", func(r *Registration) { r.URL = "file:///etc/passwd" }},
		{"zero block size", "block size 0", func(r *Registration) { r.BlockSize = 0 }},
		{"negative block size", "block size -16", func(r *Registration) { r.BlockSize = -16 }},
		{"huge block size", "want 1 to 4096", func(r *Registration) { r.BlockSize = 1 << 20 }},
		{"negative blocks", "gpu_blocks is -1", func(r *Registration) { r.GPUBlocks = -1 }},
		{"negative speedup", "speedup is -2", func(r *Registration) { r.Speedup = -2 }},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := good
			c.mend(&r)
			if err := r.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error with %q", err, c.want)
			}
		})
	}
}
