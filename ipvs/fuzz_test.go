package ipvs

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/portal"
	"github.com/onehop/onehop/portal/portalfuzz"
)

// FuzzPlan plans Services decoded from fuzzed bytes (valid as the builder
// makes them), then replaces them incrementally with a second fuzzed set.
// Planning must not panic, its output must be well formed and
// deterministic, and the incremental plan must equal the plan built from
// scratch (Sync relies on both to send only differences).
func FuzzPlan(f *testing.F) {
	rep := representative()
	next := representative()
	web := portal.ServiceKey{Namespace: "shop", Name: "web"}
	p := *next[web].Portals[0]
	p.ClusterEndpoints, p.ExternalIPs = p.ClusterEndpoints[:1], nil
	next[web] = &portal.Service{Key: web, Portals: []*portal.Portal{&p}}
	delete(next, portal.ServiceKey{Namespace: "shop", Name: "edge"})
	f.Add(byte(0), portalfuzz.Encode(rep), portalfuzz.Encode(next))
	f.Add(byte(0x83), portalfuzz.Encode(next), portalfuzz.Encode(rep))
	f.Add(byte(0x40), []byte{}, portalfuzz.Encode(rep))
	f.Fuzz(func(t *testing.T, cfgBits byte, before, after []byte) {
		in := planInput{
			Cfg:       dataplane.Config{MasqueradeAll: cfgBits&1 != 0, SourceRangesOnNodePorts: cfgBits&2 != 0, MasqueradeBit: uint(cfgBits>>2) & 15},
			Sched:     Schedulers[int(cfgBits>>4)%len(Schedulers)],
			NodeAddrs: addrs("192.168.1.10", "2001:db8::10"),
		}
		if cfgBits&0x40 != 0 {
			in.Cfg.ClusterCIDRs = []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:244::/32")}
		}
		a, b := portalfuzz.Decode(before), portalfuzz.Decode(after)
		want := buildPlan(in, b)
		checkPlan(t, want)
		text := want.render(in.Cfg, false)
		if again := buildPlan(in, b).render(in.Cfg, false); again != text {
			t.Fatalf("plan not deterministic:\n%s\nvs\n%s", text, again)
		}

		pl := buildPlan(in, a)
		var dirty []portal.ServiceKey
		for k := range a {
			dirty = append(dirty, k)
		}
		for k := range b {
			if _, ok := a[k]; !ok {
				dirty = append(dirty, k)
			}
		}
		pl.replace(in, pl.expandDirty(dirty), b)
		checkPlan(t, pl)
		pl.Conflicts, want.Conflicts = nil, nil
		if got, w := pl.render(in.Cfg, false), want.render(in.Cfg, false); got != w {
			t.Errorf("incremental plan differs from a full one:\n--- full\n%s\n--- incremental\n%s", w, got)
		}
	})
}

func checkPlan(t *testing.T, pl *plan) {
	t.Helper()
	for _, p := range pl.Panics {
		t.Errorf("planning %v panicked: %v\n%s", p.Service, p.Err, p.Err.Stack)
	}
	for k, v := range pl.Servers {
		if v.Key != k || !k.Addr.IsValid() || k.Addr.Is4In6() || k.Port == 0 {
			t.Errorf("bad virtual server %v (%+v)", k, v)
		}
		if !slices.Contains(Schedulers, v.Sched) {
			t.Errorf("%v: scheduler %q", k, v.Sched)
		}
		if k.Addr.Zone() != "" {
			t.Errorf("%v: address with a zone", k)
		}
		for d := range v.Dests {
			if !d.Addr().IsValid() || portal.FamilyOf(d.Addr()) != k.family() || d.Addr().Is4In6() || d.Port() == 0 {
				t.Errorf("%v: bad destination %v", k, d)
			}
		}
		if v.Kind != kindNodePort && !pl.VIPs[k.Addr] {
			t.Errorf("%v: %s address is not on %s", k, v.Kind, DummyInterface)
		}
	}
	for a := range pl.VIPs {
		if pl.VIPRefs[a] <= 0 {
			t.Errorf("VIP %v without references", a)
		}
	}
	for k, r := range pl.Rules {
		if r.key() != k || pl.RuleRefs[k] <= 0 {
			t.Errorf("rule %q: key %q, %d references", k, r.key(), pl.RuleRefs[k])
		}
	}
}
