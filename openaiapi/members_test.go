package openaiapi

import (
	"slices"
	"testing"
)

// The ids of a list are held in a slice of their own size, not one sized
// from the body's bytes (a third larger for 5- and 6-digit ids), since it
// lives as long as the request; a list nested or cut short still reads as
// before.
func TestTokenIDsAreHeldInTheirOwnSize(t *testing.T) {
	for _, c := range []struct {
		name, body string
		want       []uint32
		err        bool
	}{
		{"six-digit ids", `{"tokens": [100000, 163839, 123456], "count": 3}`, []uint32{100000, 163839, 123456}, false},
		{"spaced", `{"tokens": [ 1 , 2 ,3 ]}`, []uint32{1, 2, 3}, false},
		{"one", `{"tokens": [7]}`, []uint32{7}, false},
		{"empty", `{"tokens": []}`, []uint32{}, false},
		{"a bracket in a later member", `{"tokens": [5, 6], "s": "]]]"}`, []uint32{5, 6}, false},
		{"nested", `{"tokens": [[1, 2], [3]]}`, nil, true},
		{"unclosed", `{"tokens": [1, 2, 3`, nil, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			ids, err := TokenIDs([]byte(c.body), "tokens")
			if (err != nil) != c.err {
				t.Fatalf("error %v, want one: %v", err, c.err)
			}
			if c.err {
				return
			}
			if !slices.Equal(ids, c.want) {
				t.Fatalf("ids %v, want %v", ids, c.want)
			}
			if cap(ids) != len(c.want) && !(len(c.want) == 0 && cap(ids) == 1) {
				t.Fatalf("%d ids held in a slice of %d", len(ids), cap(ids))
			}
		})
	}
	body := benchBody(131072)
	p, err := Parse(body, false, 0)
	if err != nil {
		t.Fatal(err)
	}
	if ids := p.Tokens; len(ids) != 131072 || cap(ids) != len(ids) {
		t.Fatalf("a completion's 128K prompt ids: %d held in a slice of %d", len(ids), cap(ids))
	}
}
