package config

import (
	"strings"
	"testing"
)

// Unknown keys, also nested ones and MetalLB's spellings, are refused with
// their name; known ones decode.
func TestDecodeConfigStrict(t *testing.T) {
	good := `{"pools": [{"name": "main", "addresses": ["192.0.2.10"]}], "leaseNamespace": "onehop-leases", "separateController": true}`
	c, err := Decode([]byte(good))
	if err != nil {
		t.Fatalf("valid section: %v", err)
	}
	if len(c.Pools) != 1 || c.Pools[0].Name != "main" || !c.SeparateController {
		t.Errorf("decoded %+v", c)
	}
	for _, tc := range []struct{ in, want string }{
		{`{"communities": ["65000:1"]}`, "communities"},
		{`{"pools": [{"name": "main", "addresses": ["192.0.2.10"], "autoAssgin": false}]}`, "autoAssgin"},
		{`{"bgp": {"passwordSecret": "x"}}`, "passwordSecret"},
		{`{"l2": {"interface": "eth0"}}`, "interface"},
		{`{"pools": []} {"pools": []}`, "trailing"},
	} {
		if _, err := Decode([]byte(tc.in)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one naming %q", tc.in, err, tc.want)
		}
	}
}
