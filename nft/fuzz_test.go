package nft

import (
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/portal"
	"github.com/onehop/onehop/portal/portalfuzz"
)

// The kernel's limits on names and element comments (NFT_NAME_MAXLEN and
// NFT_USERDATA_MAXLEN, with the terminating NUL).
const (
	maxNameLen    = 255
	maxCommentLen = 255
)

// FuzzRender renders portals decoded from fuzzed bytes (valid as the
// builder makes them) under fuzzed configurations. render must not panic,
// must be deterministic, and its objects must hold together: every goto
// target exists, names fit the kernel's limits, one set's keys have one
// length and a portal adds each element once.
func FuzzRender(f *testing.F) {
	f.Add(byte(0), portalfuzz.Encode(goldenSnapshot().Services))
	f.Add(byte(0x83), portalfuzz.Encode(bigSnapshot(3, 2).Services))
	for _, mut := range []func(p *portal.Portal){
		func(p *portal.Portal) { p.ClusterIPs, p.ClusterEndpoints = []netip.Addr{clusterIP}, eps(8080, 1, 2) },
		func(p *portal.Portal) {
			p.ClusterIPs, p.NodePort, p.ExternalIPs = []netip.Addr{clusterIP}, 30081, []netip.Addr{extIP}
		},
		func(p *portal.Portal) {
			p.ClusterIPs, p.ClusterEndpoints, p.Affinity.TimeoutSeconds = []netip.Addr{clusterIP}, eps(8080, 0, 1), 10800
		},
		func(p *portal.Portal) {
			p.ClusterIPs, p.NodePort, p.LoadBalancerIPs = []netip.Addr{clusterIP}, 30080, []netip.Addr{lbIP}
			p.SourceRanges = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/25")}
			p.ExternalLocal, p.InternalLocal, p.HealthCheckNodePort = true, true, 32000
			p.ClusterEndpoints, p.LocalEndpoints, p.LocalReady = eps(8080, 0, 1), eps(8080, 0), 1
		},
	} {
		s := service("seed", mut)
		f.Add(byte(0x82), portalfuzz.Encode(map[portal.ServiceKey]*portal.Service{s.Key: s}))
	}
	f.Fuzz(func(t *testing.T, cfgBits byte, data []byte) {
		cfg := dataplane.Config{MasqueradeAll: cfgBits&1 != 0, SourceRangesOnNodePorts: cfgBits&2 != 0, MasqueradeBit: uint(cfgBits>>2) & 31}
		if cfgBits&0x80 != 0 {
			cfg.ClusterCIDRs = []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:244::/32")}
			cfg.ServiceCIDRs = []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16"), netip.MustParsePrefix("fd00:96::/112")}
		}
		keyLen := map[string]int{}
		for _, s := range portalfuzz.Decode(data) {
			for _, p := range s.Portals {
				o := render(p, cfg)
				if again := render(p, cfg); !reflect.DeepEqual(o, again) {
					t.Errorf("%v: render is not deterministic:\n%+v\n%+v", p.Key, o, again)
				}
				checkObjects(t, p, o, keyLen)
			}
		}
	})
}

func checkObjects(t *testing.T, p *portal.Portal, o *objects, keyLen map[string]int) {
	t.Helper()
	exists := func(chain string) bool {
		_, ok := o.chains[chain]
		return ok || chain == chainReject || chain == chainDrop
	}
	for name, body := range o.chains {
		if len(name) > maxNameLen {
			t.Errorf("%v: chain name of %d bytes: %q", p.Key, len(name), name)
		}
		if body.family != p.Key.Family {
			t.Errorf("%v: chain %s of family %v", p.Key, name, body.family)
		}
		if to := body.shortCircuit; to != "" && !exists(to) {
			t.Errorf("%v: chain %s goes to %s, which is not rendered", p.Key, name, to)
		}
		for _, e := range body.endpoints {
			if portal.FamilyOf(e.Addr()) != p.Key.Family {
				t.Errorf("%v: chain %s has endpoint %v of another family", p.Key, name, e)
			}
		}
		for ep, names := range body.affinityObjects(name) {
			for _, n := range names {
				if len(n) > maxNameLen {
					t.Errorf("%v: affinity object of %v named with %d bytes: %q", p.Key, ep, len(n), n)
				}
			}
		}
	}
	if len(o.rangeSet) > maxNameLen {
		t.Errorf("%v: set of source ranges named with %d bytes: %q", p.Key, len(o.rangeSet), o.rangeSet)
	}
	if (o.rangeSet != "") != (len(o.ranges) > 0) {
		t.Errorf("%v: set of source ranges %q with %d ranges", p.Key, o.rangeSet, len(o.ranges))
	}
	before := map[string]bool{}
	for _, e := range o.elems {
		if guard, ok := firewallGuard(e); ok {
			if o.rangeSet == "" || e.chain != firewallChain(o.rangeSet) || !e.jump {
				t.Errorf("%v: firewall element of %s jumps to %s, the portal has set %q", p.Key, e.set, e.chain, o.rangeSet)
			}
			// Its way in is the portal's, and comes first (see firewallGuard).
			if !before[guard[0]] && !before[guard[1]] {
				t.Errorf("%v: firewall element of %s guards no way in rendered before it", p.Key, e.set)
			}
		}
		before[e.id()] = true
	}
	seen := map[string]bool{}
	for _, e := range slices.Concat(o.elems, o.shared) {
		if e.chain != "" && !exists(e.chain) && (o.rangeSet == "" || e.chain != firewallChain(o.rangeSet)) {
			t.Errorf("%v: element of %s goes to %s, which is not rendered", p.Key, e.set, e.chain)
		}
		if len(e.comment) > maxCommentLen {
			t.Errorf("%v: element comment of %d bytes", p.Key, len(e.comment))
		}
		if e.key == "" || strings.ContainsRune(e.set, 0) {
			t.Errorf("%v: bad element %+v", p.Key, e)
		}
		if n, ok := keyLen[e.set]; ok && n != len(e.key) {
			t.Errorf("%v: set %s has keys of %d and %d bytes", p.Key, e.set, n, len(e.key))
		}
		keyLen[e.set] = len(e.key)
		if seen[e.id()] {
			t.Errorf("%v: element %q of %s rendered twice", p.Key, e.key, e.set)
		}
		seen[e.id()] = true
	}
}
