package controlapi

import (
	"slices"
	"testing"
)

func TestCompareIDsCountsAsPeopleDo(t *testing.T) {
	got := []string{"a10-s1", "a2-s0", "a1-s1", "a1-s0", "b", "a", "a01", "a1", "agent-9", "agent-10", "x100y2", "x100y10", ""}
	slices.SortFunc(got, CompareIDs)
	want := []string{"", "a", "a01", "a1", "a1-s0", "a1-s1", "a2-s0", "a10-s1", "agent-9", "agent-10", "b", "x100y2", "x100y10"}
	if !slices.Equal(got, want) {
		t.Fatalf("got  %q\nwant %q", got, want)
	}
	for _, p := range [][2]string{{"a1", "a01"}, {"b2", "b10"}, {"s", "s0"}} {
		if CompareIDs(p[0], p[1]) != -CompareIDs(p[1], p[0]) || CompareIDs(p[0], p[0]) != 0 {
			t.Fatalf("not antisymmetric on %q", p)
		}
	}
}
