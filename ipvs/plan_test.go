package ipvs

import (
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/portal"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

// representative is a set of Services covering every way the plan differs:
// two protocols, NodePort, affinity, both traffic policies Local with source
// ranges, no endpoints, IPv6 and a conflicting external IP.
func representative() map[portal.ServiceKey]*portal.Service {
	ep := func(s ...string) []netip.AddrPort {
		var out []netip.AddrPort
		for _, a := range s {
			out = append(out, netip.MustParseAddrPort(a))
		}
		return out
	}
	mk := func(ns, name string, ps ...*portal.Portal) *portal.Service {
		k := portal.ServiceKey{Namespace: ns, Name: name}
		for _, p := range ps {
			p.Key.Service = k
		}
		return &portal.Service{Key: k, Portals: ps}
	}
	key := func(port string, proto portal.Protocol, fam portal.Family) portal.PortKey {
		return portal.PortKey{Port: port, Protocol: proto, Family: fam}
	}
	svcs := []*portal.Service{
		mk("default", "dns",
			&portal.Portal{Key: key("dns", portal.UDP, portal.IPv4), Port: 53, ClusterIPs: addrs("10.96.0.10"),
				ClusterEndpoints: ep("10.244.1.5:53", "10.244.2.7:53")},
			&portal.Portal{Key: key("dns-tcp", portal.TCP, portal.IPv4), Port: 53, ClusterIPs: addrs("10.96.0.10"),
				ClusterEndpoints: ep("10.244.1.5:53", "10.244.2.7:53")}),
		mk("shop", "web",
			&portal.Portal{Key: key("http", portal.TCP, portal.IPv4), Port: 80, ClusterIPs: addrs("10.96.1.1"), NodePort: 30080,
				ExternalIPs: addrs("198.51.100.7"), Affinity: portal.Affinity{TimeoutSeconds: 10800},
				ClusterEndpoints: ep("10.244.1.10:8080", "10.244.2.11:8080"), LocalEndpoints: ep("10.244.1.10:8080")}),
		mk("shop", "edge",
			&portal.Portal{Key: key("https", portal.TCP, portal.IPv4), Port: 443, ClusterIPs: addrs("10.96.1.2"), NodePort: 30443,
				LoadBalancerIPs: addrs("203.0.113.10"), SourceRanges: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24"), netip.MustParsePrefix("198.51.100.0/25")},
				ExternalLocal: true, InternalLocal: true, HealthCheckNodePort: 32000,
				ClusterEndpoints: ep("10.244.1.12:8443", "10.244.2.13:8443"), LocalEndpoints: ep("10.244.1.12:8443")},
			&portal.Portal{Key: key("https", portal.TCP, portal.IPv6), Port: 443, ClusterIPs: addrs("fd00:96::2"),
				ClusterEndpoints: ep("[fd00:244:1::12]:8443")}),
		mk("shop", "empty",
			&portal.Portal{Key: key("", portal.SCTP, portal.IPv4), Port: 9000, ClusterIPs: addrs("10.96.1.3")}),
		mk("zz", "thief",
			&portal.Portal{Key: key("", portal.TCP, portal.IPv4), Port: 80, ExternalIPs: addrs("198.51.100.7"), ClusterIPs: addrs("10.96.9.9"),
				ClusterEndpoints: ep("10.244.3.1:80")}),
	}
	m := map[portal.ServiceKey]*portal.Service{}
	for _, s := range svcs {
		m[s.Key] = s
	}
	return m
}

func TestPlanGolden(t *testing.T) {
	if _, err := os.Stat("testdata"); err != nil && os.Getenv("ONEHOP_VM") != "" {
		t.Skip("golden files are compared on the host (the VM has no source tree)")
	}
	node := addrs("192.168.1.10", "2001:db8::10")
	for _, tc := range []struct {
		name string
		cfg  dataplane.Config
	}{
		{"cluster-cidrs", dataplane.Config{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:244::/48")}}},
		{"no-cluster-cidrs", dataplane.Config{}},
		{"masquerade-all", dataplane.Config{MasqueradeAll: true, MasqueradeBit: 5, SourceRangesOnNodePorts: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pl := buildPlan(planInput{Cfg: tc.cfg, Sched: "rr", NodeAddrs: node}, representative())
			got := pl.render(tc.cfg, true)
			golden(t, filepath.Join("testdata", "plan-"+tc.name+".golden"), got)
		})
	}
}

func golden(t *testing.T, path, got string) {
	t.Helper()
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./ipvs -run %s -update)", err, t.Name())
	}
	if string(want) != got {
		t.Errorf("%s differs (go test ./ipvs -update rewrites it):\n--- want\n%s\n--- got\n%s", path, want, got)
	}
}

// TestPlanDeterministic: the same input gives the same plan, whatever the
// map order (Sync relies on it to send no messages when nothing changed).
func TestPlanDeterministic(t *testing.T) {
	in := planInput{Cfg: dataplane.Config{}, Sched: "rr", NodeAddrs: addrs("192.168.1.10")}
	first := buildPlan(in, representative()).render(in.Cfg, false)
	for range 20 {
		if got := buildPlan(in, representative()).render(in.Cfg, false); got != first {
			t.Fatalf("plan not deterministic:\n%s\nvs\n%s", first, got)
		}
	}
	if !strings.Contains(first, "conflict: zz/thief") {
		t.Errorf("the second claimant of 198.51.100.7:80 must be reported:\n%s", first)
	}
}

func TestSplitRule(t *testing.T) {
	got := splitRule(`-A ONEHOP-IPVS-KEEP-SOURCE -m ipvs --vproto 6 --vaddr 10.0.0.1 --vport 80 --vdir ORIGINAL -m comment --comment "a/b:c/tcp/ipv4" -j MARK --set-xmark 0x0/0x4000`)
	want := "-A ONEHOP-IPVS-KEEP-SOURCE -m ipvs --vproto 6 --vaddr 10.0.0.1 --vport 80 --vdir ORIGINAL -m comment --comment a/b:c/tcp/ipv4 -j MARK --set-xmark 0x0/0x4000"
	if strings.Join(got, " ") != want {
		t.Errorf("got %q", got)
	}
	if got := splitRule(`-m comment --comment "with \"quote\" and space"`); len(got) != 4 || got[3] != `with "quote" and space` {
		t.Errorf("quoted: %q", got)
	}
}

func TestKernelBefore(t *testing.T) {
	for rel, want := range map[string]bool{"5.4.0-100-generic": true, "5.9.0": false, "6.1.0-57-cloud-amd64": false, "4.19.0": true, "garbage": false} {
		if got := kernelBefore(rel, 5, 9); got != want {
			t.Errorf("kernelBefore(%q) = %v", rel, got)
		}
	}
}

// TestIncrementalPlan: replacing the dirty Services' parts of a plan gives
// the plan built from scratch, shared VIPs and rules included.
func TestIncrementalPlan(t *testing.T) {
	in := planInput{Cfg: dataplane.Config{}, Sched: "rr", NodeAddrs: addrs("192.168.1.10")}
	old := representative()
	pl := buildPlan(in, old)
	next := representative()
	web := portal.ServiceKey{Namespace: "shop", Name: "web"}
	edge := portal.ServiceKey{Namespace: "shop", Name: "edge"}
	dns := portal.ServiceKey{Namespace: "default", Name: "dns"}
	p := *next[web].Portals[0]
	p.ClusterEndpoints = p.ClusterEndpoints[:1]
	p.ExternalIPs = nil
	next[web] = &portal.Service{Key: web, Portals: []*portal.Portal{&p}}
	delete(next, edge)
	pl.replace(in, pl.expandDirty([]portal.ServiceKey{web, edge, dns}), next)
	pl.Conflicts = nil
	want := buildPlan(in, next)
	want.Conflicts = nil
	if got, w := pl.render(in.Cfg, false), want.render(in.Cfg, false); got != w {
		t.Errorf("incremental plan differs from a full one:\n--- full\n%s\n--- incremental\n%s", w, got)
	}
}

// onehop.io/scheduler picks a Service's scheduler; others keep the default.
func TestPlanPerServiceScheduler(t *testing.T) {
	key := portal.ServiceKey{Namespace: "ns", Name: "maglev"}
	other := portal.ServiceKey{Namespace: "ns", Name: "plain"}
	mk := func(k portal.ServiceKey, ip, sched string) *portal.Service {
		return &portal.Service{Key: k, Portals: []*portal.Portal{{
			Key: portal.PortKey{Service: k, Protocol: portal.TCP, Family: portal.IPv4}, Port: 80,
			ClusterIPs: []netip.Addr{netip.MustParseAddr(ip)}, Scheduler: sched,
			ClusterEndpoints: []netip.AddrPort{netip.MustParseAddrPort("10.244.1.2:8080")}}}}
	}
	pl := buildPlan(planInput{Sched: "rr"}, map[portal.ServiceKey]*portal.Service{
		key: mk(key, "10.96.0.1", "mh"), other: mk(other, "10.96.0.2", "")})
	got := map[string]string{}
	for k, v := range pl.Servers {
		got[k.Addr.String()] = v.Sched
	}
	if got["10.96.0.1"] != "mh" || got["10.96.0.2"] != "rr" {
		t.Errorf("schedulers: %v", got)
	}
}
