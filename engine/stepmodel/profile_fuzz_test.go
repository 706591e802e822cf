package stepmodel

import "testing"

// A profile is a file a user writes: whatever it says, a profile that
// parses must run, with passes of positive, finite length, and one that
// cannot must be refused with an error, never a panic.
func FuzzParseProfile(f *testing.F) {
	for _, name := range ProfileNames() {
		data, err := builtinProfiles.ReadFile("profiles/" + name + ".yaml")
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte("name: x\ngpus: 1\nmax_model_len: 64\nblock_size: 16\nkv_bytes_per_token: 1\ngpu_kv_tokens: 64\nhbm_gbps: 1\nhost_gbps: 1\nnetwork_gbps: 1\nprefill: {base_ms: .inf, per_token_us: 1}\ndecode: {base_ms: 1, kv_read_efficiency: 1}\n"))
	f.Add([]byte("name: x\ngpus: 1\nmax_model_len: 64\nblock_size: 16\nkv_bytes_per_token: 1\ngpu_kv_tokens: 64\nhbm_gbps: 1e-300\nhost_gbps: 1\nnetwork_gbps: 1\nprefill: {base_ms: 1, per_token_us: 1}\ndecode: {base_ms: 1e13, kv_read_efficiency: 1}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := ParseProfile(data)
		if err != nil {
			return
		}
		if p.GPUKVTokens > 1<<24 || p.MaxModelLen > 1<<20 {
			return // a real engine's size: too slow to fuzz, not a different path
		}
		m := NewModel(p, Config{HostBlocks: 64})
		n := min(p.MaxModelLen-1, 3*p.BlockSize+5)
		if n < 1 {
			return
		}
		tokens := make([]uint32, n)
		for i := range tokens {
			tokens[i] = uint32(i + 1)
		}
		if err := m.Submit(t0, Request{ID: "r", Tokens: tokens, MaxTokens: 3}); err != nil {
			return
		}
		now := t0
		for i := 0; i < 20; i++ {
			d, out := m.Step(now)
			if out.Idle {
				break
			}
			if d <= 0 || d > MaxPass {
				t.Fatalf("pass of %v from profile\n%s", d, data)
			}
			now = out.Start.Add(d)
		}
	})
}
