package roles

import (
	"encoding/json"
	"testing"
)

// A role's name reads back as the role, in JSON too, and names that are
// not roles are refused.
func TestRolesReadBackByName(t *testing.T) {
	for _, r := range []Role{Both, Prefill, Decode} {
		got, err := Parse(r.String())
		if err != nil || got != r {
			t.Errorf("%v: parsed %v, %v", r, got, err)
		}
		b, _ := json.Marshal(struct{ Role Role }{r})
		var back struct{ Role Role }
		if err := json.Unmarshal(b, &back); err != nil || back.Role != r {
			t.Errorf("%s: read back %v, %v", b, back.Role, err)
		}
	}
	if b, _ := json.Marshal(Prefill); string(b) != `"prefill"` {
		t.Errorf("prefill in JSON: %s", b)
	}
	if r, _ := Parse(""); r != Both {
		t.Errorf("no role given: %v, want both", r)
	}
	for _, bad := range []string{"wizard", "Prefill", "1"} {
		var r Role
		if _, err := Parse(bad); err == nil || json.Unmarshal([]byte(`"`+bad+`"`), &r) == nil {
			t.Errorf("%q accepted as a role", bad)
		}
	}
	if Prefill.Other() != Decode || Decode.Other() != Prefill || Both.Other() != Prefill {
		t.Error("Other")
	}
}
