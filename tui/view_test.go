package tui

import "testing"

// Learned coefficients read at a glance: the error as a share of the value,
// never a tiny number in exponent form.
func TestCoefText(t *testing.T) {
	for _, tc := range []struct {
		c    Coef
		want string
	}{
		{Coef{"per_token_us", 6.5, 0.01}, "per_token_us 6.5 ±0.15%"},
		{Coef{"per_context_token_ns", 0.031, 6.8e-07}, "per_context_token_ns 0.031 ±<0.1%"},
		{Coef{"per_block_us", 0, 0.2}, "per_block_us 0 ±0.2"},
		{Coef{"base_ms", -0.002, 0.5}, "base_ms -0.002 ±0.5"},
		{Coef{"base_ms", 12, 3}, "base_ms 12 ±25%"},
		{Coef{"per_block_us", -0.161, 0.53}, "per_block_us -0.161 ±0.53"},
		{Coef{"per_block_us", 0.5, 0.49}, "per_block_us 0.5 ±98%"},
		// Too small for its unit: a smaller one, never an exponent.
		{Coef{"per_context_token_ns", 9.41e-06, 0.00075}, "per_context_token_ps 0.00941 ±0.75"},
		{Coef{"per_block_us", 0, 520}, "per_block_us 0 ±520"},
		{Coef{"base_ms", 2e-9, 3e-9}, "base_ps 2 ±3"},
		{Coef{"per_token", 2e-9, 3e-9}, "per_token ≈0 ±≈0"}, // no unit to move
	} {
		t.Run(tc.want, func(t *testing.T) {
			if got := coefText(tc.c); got != tc.want {
				t.Errorf("coefText(%+v) = %q, want %q", tc.c, got, tc.want)
			}
		})
	}
}
