package ipvs

import (
	"path/filepath"
	"testing"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/portal"
)

// IPVS keeps no text: the topology line dump-rules prints for a port is in
// the state file beside the port's name, and goes when the port loses it.
func TestTopologyInState(t *testing.T) {
	in := planInput{Cfg: dataplane.Config{}, Sched: "rr", NodeAddrs: addrs("192.168.1.10")}
	web := portal.ServiceKey{Namespace: "shop", Name: "web"}
	withTopology := func(text string) map[portal.ServiceKey]*portal.Service {
		svcs := representative()
		p := *svcs[web].Portals[0]
		p.Topology = text
		svcs[web] = &portal.Service{Key: web, Portals: []*portal.Portal{&p}}
		return svcs
	}
	const want = "zone hints for zone-a"
	pl := buildPlan(in, withTopology(want))
	path := filepath.Join(t.TempDir(), "state.json")
	if err := writeState(path, pl); err != nil {
		t.Fatal(err)
	}
	webPort := withTopology(want)[web].Portals[0].Key.String()
	n := 0
	for vs, e := range readState(path) {
		switch {
		case e.Service == webPort && e.Topology != want:
			t.Errorf("%s (%s): topology %q, want %q", vs, e.Service, e.Topology, want)
		case e.Service != webPort && e.Topology != "":
			t.Errorf("%s (%s): topology %q, want none", vs, e.Service, e.Topology)
		}
		if e.Service == webPort {
			n++
		}
	}
	if n == 0 {
		t.Fatalf("the state file names no virtual server of %s", webPort)
	}

	pl.replace(in, pl.expandDirty([]portal.ServiceKey{web}), withTopology(""))
	if len(pl.Topology) != 0 {
		t.Errorf("after the hints went: %v", pl.Topology)
	}
}
