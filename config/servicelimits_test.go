package config

import (
	"strings"
	"testing"

	"github.com/onehop/onehop/portal"
)

// OnehopConfiguration's serviceLimits reach portal.Limits: the fields
// given, the others left to the defaults; a limit below 1 and an unknown
// field stop the agent naming the field.
func TestServiceLimitsFromTheFile(t *testing.T) {
	const head = "apiVersion: onehop.io/v1alpha1\nkind: OnehopConfiguration\n"
	fc, _, err := LoadFile(writeConfig(t, head+"serviceLimits:\n  ports: 20000\n  externalIPs: 4\n"))
	if err != nil {
		t.Fatal(err)
	}
	if want := (portal.Limits{Ports: 20000, ExternalIPs: 4}); fc.ServiceLimits != want {
		t.Errorf("got %+v, want %+v", fc.ServiceLimits, want)
	}
	// ... and `agent run` takes them into the model's configuration.
	var f Settings
	f.applyFile(fc, map[string]bool{})
	if want := (portal.Limits{Ports: 20000, ExternalIPs: 4}); f.ServiceLimits != want {
		t.Errorf("run takes %+v from the file, want %+v", f.ServiceLimits, want)
	}
	fc, _, err = LoadFile(writeConfig(t, head+"dataplane: ipvs\n"))
	if err != nil {
		t.Fatal(err)
	}
	if fc.ServiceLimits != (portal.Limits{}) {
		t.Errorf("without serviceLimits: got %+v, want the defaults (zero)", fc.ServiceLimits)
	}
	for _, c := range []struct{ body, want string }{
		{"serviceLimits:\n  sourceRanges: 0\n", "serviceLimits.sourceRanges 0: want at least 1"},
		{"serviceLimits:\n  loadBalancerIPs: -3\n", "serviceLimits.loadBalancerIPs -3"},
		{"serviceLimits:\n  port: 10\n", `unknown field "serviceLimits.port"`},
	} {
		if _, _, err := LoadFile(writeConfig(t, head+c.body)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: got error %v, want one saying %q", c.body, err, c.want)
		}
	}
}
