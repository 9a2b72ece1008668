package ipam

import (
	"errors"
	"net/netip"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/onehop/onehop/portal"
)

func mustPool(t *testing.T, name string, auto, pods bool, specs ...string) Pool {
	t.Helper()
	return mustPoolOpts(t, name, PoolOptions{AutoAssign: auto, AllowPods: pods}, specs...)
}

func mustPoolOpts(t *testing.T, name string, o PoolOptions, specs ...string) Pool {
	t.Helper()
	p, err := NewPool(name, specs, o)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func svc(n string) portal.ServiceKey { return portal.ServiceKey{Namespace: "ns", Name: n} }

func addrs(s ...string) []netip.Addr {
	var out []netip.Addr
	for _, x := range s {
		out = append(out, netip.MustParseAddr(x))
	}
	return out
}

func tcp(ps ...uint16) []Port {
	var out []Port
	for _, p := range ps {
		out = append(out, Port{portal.TCP, p})
	}
	return out
}

func TestParseRange(t *testing.T) {
	for _, tc := range []struct {
		in, first, last string
		bad             bool
	}{
		{in: "192.0.2.0/30", first: "192.0.2.0", last: "192.0.2.3"},
		{in: "192.0.2.5/30", first: "192.0.2.4", last: "192.0.2.7"},
		{in: "198.51.100.10 - 198.51.100.20", first: "198.51.100.10", last: "198.51.100.20"},
		{in: "2001:db8::/126", first: "2001:db8::", last: "2001:db8::3"},
		{in: "2001:db8::1", first: "2001:db8::1", last: "2001:db8::1"},
		{in: "192.0.2.9-192.0.2.1", bad: true},
		{in: "192.0.2.1-2001:db8::1", bad: true},
		{in: "banana", bad: true},
		{in: "192.0.2.0/33", bad: true},
	} {
		r, err := ParseRange(tc.in)
		if tc.bad {
			if err == nil {
				t.Errorf("%q: want error, got %v", tc.in, r)
			}
			continue
		}
		if err != nil || r.First.String() != tc.first || r.Last.String() != tc.last {
			t.Errorf("%q: got %v %v, want %s-%s", tc.in, r, err, tc.first, tc.last)
		}
	}
	if n := (Range{netip.MustParseAddr("2001:db8::"), netip.MustParseAddr("2001:db8::ffff:ffff:ffff:ffff")}).Size(); n.String() != "18446744073709551616" {
		t.Errorf("size %s", n)
	}
}

func TestNewRejectsOverlapAndDuplicates(t *testing.T) {
	a := mustPool(t, "a", true, false, "192.0.2.0/28")
	b := mustPool(t, "b", true, false, "192.0.2.8-192.0.2.20")
	if _, err := New([]Pool{a, b}); err == nil {
		t.Error("overlapping pools accepted")
	}
	if _, err := New([]Pool{a, a}); err == nil {
		t.Error("duplicate pool names accepted")
	}
	c := mustPool(t, "c", true, false, "192.0.2.16/28")
	if _, err := New([]Pool{a, c}); err != nil {
		t.Errorf("adjacent pools refused: %v", err)
	}
}

// step is one operation on a shared allocator; the table runs them in order.
type step struct {
	name    string
	req     Request
	release bool
	restore []netip.Addr
	want    []netip.Addr
	reason  Reason // "" = success
}

func TestAssign(t *testing.T) {
	pools := func(t *testing.T) []Pool {
		return []Pool{
			mustPool(t, "small", true, false, "192.0.2.1-192.0.2.2"),
			mustPool(t, "v6", true, false, "2001:db8::/127"),
			mustPool(t, "manual", false, true, "198.51.100.0/29"),
		}
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"first free, idempotent, release", []step{
			{name: "a", req: Request{Service: svc("a"), Ports: tcp(80)}, want: addrs("192.0.2.1")},
			{name: "a again", req: Request{Service: svc("a"), Ports: tcp(80, 443)}, want: addrs("192.0.2.1")},
			{name: "b", req: Request{Service: svc("b")}, want: addrs("192.0.2.2")},
			{name: "c exhausted", req: Request{Service: svc("c")}, reason: ReasonExhausted},
			{name: "release a", req: Request{Service: svc("a")}, release: true},
			{name: "c gets a's", req: Request{Service: svc("c")}, want: addrs("192.0.2.1")},
		}},
		{"requested addresses", []step{
			{name: "in manual pool", req: Request{Service: svc("a"), Requested: addrs("198.51.100.2")}, want: addrs("198.51.100.2")},
			{name: "taken", req: Request{Service: svc("b"), Requested: addrs("198.51.100.2")}, reason: ReasonConflict},
			{name: "outside pools", req: Request{Service: svc("b"), Requested: addrs("203.0.113.1")}, reason: ReasonNotInPool},
			{name: "wrong pool", req: Request{Service: svc("b"), Requested: addrs("198.51.100.1"), Pool: "small"}, reason: ReasonNotInPool},
			{name: "two v4", req: Request{Service: svc("b"), Requested: addrs("198.51.100.1", "198.51.100.3")}, reason: ReasonBadRequest},
			{name: "move a", req: Request{Service: svc("a"), Requested: addrs("198.51.100.3")}, want: addrs("198.51.100.3")},
			{name: "old one free", req: Request{Service: svc("b"), Requested: addrs("198.51.100.2")}, want: addrs("198.51.100.2")},
		}},
		{"pool choice", []step{
			{name: "manual by name, network address skipped", req: Request{Service: svc("a"), Pool: "manual"}, want: addrs("198.51.100.1")},
			{name: "unknown", req: Request{Service: svc("b"), Pool: "nope"}, reason: ReasonUnknownPool},
			{name: "pool without family", req: Request{Service: svc("b"), Pool: "manual", Families: []portal.Family{portal.IPv6}}, reason: ReasonExhausted},
			{name: "switch pool", req: Request{Service: svc("a"), Pool: "small"}, want: addrs("192.0.2.1")},
		}},
		{"sharing", []step{
			{name: "a", req: Request{Service: svc("a"), SharingKey: "k", Ports: tcp(80)}, want: addrs("192.0.2.1")},
			{name: "b shares", req: Request{Service: svc("b"), SharingKey: "k", Ports: tcp(443)}, want: addrs("192.0.2.1")},
			{name: "c port collides, gets own", req: Request{Service: svc("c"), SharingKey: "k", Ports: tcp(80)}, want: addrs("192.0.2.2")},
			{name: "d other key, exhausted", req: Request{Service: svc("d"), SharingKey: "other", Ports: tcp(22)}, reason: ReasonExhausted},
			{name: "d requests shared without key", req: Request{Service: svc("d"), Requested: addrs("192.0.2.1"), Ports: tcp(22)}, reason: ReasonConflict},
			{name: "d requests shared, port collides", req: Request{Service: svc("d"), SharingKey: "k", Requested: addrs("192.0.2.1"), Ports: tcp(443)}, reason: ReasonConflict},
			{name: "udp 80 does not collide with tcp 80", req: Request{Service: svc("d"), SharingKey: "k", Requested: addrs("192.0.2.1"), Ports: []Port{{portal.UDP, 80}}}, want: addrs("192.0.2.1")},
			{name: "release a", req: Request{Service: svc("a")}, release: true},
			{name: "release b", req: Request{Service: svc("b")}, release: true},
			{name: "release d", req: Request{Service: svc("d")}, release: true},
			{name: "e unshared gets freed ip", req: Request{Service: svc("e")}, want: addrs("192.0.2.1")},
		}},
		{"dual stack", []step{
			{name: "both", req: Request{Service: svc("a"), Families: []portal.Family{portal.IPv6, portal.IPv4}}, want: addrs("192.0.2.1", "2001:db8::")},
			{name: "v6 only", req: Request{Service: svc("b"), Families: []portal.Family{portal.IPv6}}, want: addrs("2001:db8::1")},
			{name: "prefer: v6 exhausted is fine", req: Request{Service: svc("c"), Families: []portal.Family{portal.IPv4, portal.IPv6}}, want: addrs("192.0.2.2")},
			{name: "require: v6 exhausted fails", req: Request{Service: svc("d"), Families: []portal.Family{portal.IPv4, portal.IPv6}, RequireAll: true}, reason: ReasonExhausted},
			{name: "primary v6 exhausted fails", req: Request{Service: svc("d"), Families: []portal.Family{portal.IPv6, portal.IPv4}}, reason: ReasonExhausted},
		}},
		{"restore after leader change", []step{
			{name: "restore b", req: Request{Service: svc("b")}, restore: addrs("192.0.2.1"), want: addrs("192.0.2.1")},
			{name: "a does not get b's", req: Request{Service: svc("a")}, want: addrs("192.0.2.2")},
			{name: "restore c on a's ip refused", req: Request{Service: svc("c")}, restore: addrs("192.0.2.2"), reason: ReasonConflict},
			{name: "restore outside pools kept", req: Request{Service: svc("c")}, restore: addrs("203.0.113.9"), want: addrs("203.0.113.9")},
			{name: "restore in the wrong pool refused", req: Request{Service: svc("d"), Pool: "small"}, restore: addrs("198.51.100.3"), reason: ReasonNotInPool},
			{name: "b keeps its ip", req: Request{Service: svc("b")}, want: addrs("192.0.2.1")},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := New(pools(t))
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range tc.steps {
				var got []netip.Addr
				var err error
				switch {
				case s.release:
					a.Release(s.req.Service)
					if h := a.Holds(s.req.Service); len(h) != 0 {
						t.Fatalf("%s: still holds %v", s.name, h)
					}
					continue
				case s.restore != nil:
					err = a.Restore(s.req, s.restore)
					got = a.Holds(s.req.Service)
				default:
					before := a.Holds(s.req.Service)
					got, err = a.Assign(s.req)
					if err != nil && !slices.Equal(before, a.Holds(s.req.Service)) {
						t.Errorf("%s: failed Assign changed holdings %v -> %v", s.name, before, a.Holds(s.req.Service))
					}
				}
				if s.reason != "" {
					var e *Error
					if !errors.As(err, &e) || e.Reason != s.reason {
						t.Fatalf("%s: got %v, %v; want refusal %s", s.name, got, err, s.reason)
					}
					continue
				}
				if err != nil {
					t.Fatalf("%s: %v", s.name, err)
				}
				if !slices.Equal(got, s.want) {
					t.Fatalf("%s: got %v, want %v", s.name, got, s.want)
				}
			}
		})
	}
}

// TestNoDoubleAllocation churns many Services through a small pool and
// checks the invariant after every step.
func TestNoDoubleAllocation(t *testing.T) {
	a, err := New([]Pool{mustPool(t, "p", true, false, "192.0.2.0/29")})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 500 {
		s := svc(string(rune('a' + i%13)))
		if i%5 == 0 {
			a.Release(s)
		} else {
			_, _ = a.Assign(Request{Service: s, Ports: tcp(uint16(80 + i%3))})
		}
		owner := map[netip.Addr]portal.ServiceKey{}
		for k, ips := range a.svcs {
			for _, ip := range ips {
				if o, ok := owner[ip]; ok {
					t.Fatalf("step %d: %s held by %s and %s", i, ip, o, k)
				}
				owner[ip] = k
			}
		}
		if len(owner) != a.InUse() || a.InUse() > 8 {
			t.Fatalf("step %d: %d owners, %d in use", i, len(owner), a.InUse())
		}
	}
}

func TestNetworkAndBroadcast(t *testing.T) {
	for _, tc := range []struct {
		spec        string
		keep        bool
		first, last string // the pool's first and last addresses
	}{
		{spec: "192.0.2.0/24", first: "192.0.2.1", last: "192.0.2.254"},
		{spec: "192.0.2.0/24", keep: true, first: "192.0.2.0", last: "192.0.2.255"},
		{spec: "192.0.2.4/30", first: "192.0.2.5", last: "192.0.2.6"},
		{spec: "192.0.2.4/31", first: "192.0.2.4", last: "192.0.2.5"}, // RFC 3021: both are hosts
		{spec: "192.0.2.7/32", first: "192.0.2.7", last: "192.0.2.7"},
		{spec: "192.0.2.0-192.0.2.255", first: "192.0.2.0", last: "192.0.2.255"}, // a range is taken as written
		{spec: "2001:db8::/64", first: "2001:db8::1", last: "2001:db8::ffff:ffff:ffff:ffff"},
		{spec: "2001:db8::/127", first: "2001:db8::", last: "2001:db8::1"}, // RFC 6164
	} {
		p := mustPoolOpts(t, "p", PoolOptions{AutoAssign: true, KeepNetworkAndBroadcast: tc.keep}, tc.spec)
		a, err := New([]Pool{p})
		if err != nil {
			t.Fatal(err)
		}
		first, last := netip.MustParseAddr(tc.first), netip.MustParseAddr(tc.last)
		fam := []portal.Family{portal.FamilyOf(first)}
		if got, err := a.Assign(Request{Service: svc("auto"), Families: fam}); err != nil || got[0] != first {
			t.Errorf("%s keep=%v: first assigned %v %v, want %s", tc.spec, tc.keep, got, err, first)
		}
		for _, out := range []netip.Addr{first.Prev(), last.Next()} {
			if !out.IsValid() {
				continue
			}
			_, err := a.Assign(Request{Service: svc("req"), Requested: []netip.Addr{out}})
			var e *Error
			if !errors.As(err, &e) || e.Reason != ReasonNotInPool {
				t.Errorf("%s keep=%v: request of %s: %v, want %s", tc.spec, tc.keep, out, err, ReasonNotInPool)
			}
		}
		if _, err := a.Assign(Request{Service: svc("last"), Requested: []netip.Addr{last}}); first != last && err != nil {
			t.Errorf("%s keep=%v: request of %s: %v", tc.spec, tc.keep, last, err)
		}
	}
}

func selector(t *testing.T, s string) labels.Selector {
	t.Helper()
	sel, err := labels.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return sel
}

func TestTenancy(t *testing.T) {
	pools := []Pool{
		mustPoolOpts(t, "general", PoolOptions{AutoAssign: true, Priority: 10}, "192.0.2.1-192.0.2.2"),
		mustPoolOpts(t, "team-a", PoolOptions{AutoAssign: true, Namespaces: []string{"a"}, Priority: 1}, "198.51.100.1"),
		mustPoolOpts(t, "gold", PoolOptions{AutoAssign: true, Selectors: []labels.Selector{selector(t, "tier=gold")}, Priority: 5}, "198.51.100.9"),
		mustPoolOpts(t, "manual-a", PoolOptions{Namespaces: []string{"a"}}, "198.51.100.20"),
		mustPoolOpts(t, "pods", PoolOptions{AutoAssign: true, AllowPods: true}, "203.0.113.1-203.0.113.9"),
	}
	in := func(ns, name string, l ...string) Request {
		r := Request{Service: portal.ServiceKey{Namespace: ns, Name: name}}
		if len(l) == 2 {
			r.Labels = map[string]string{l[0]: l[1]}
		}
		return r
	}
	named := func(r Request, pool string) Request { r.Pool = pool; return r }
	asks := func(r Request, ip string) Request { r.Requested = addrs(ip); return r }
	a, err := New(pools)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []step{
		{name: "namespace a: its own pool first (priority 1)", req: in("a", "x"), want: addrs("198.51.100.1")},
		{name: "gold label: the gold pool (priority 5) before general (10)", req: in("b", "g", "tier", "gold"), want: addrs("198.51.100.9")},
		{name: "namespace a's pool full: general", req: in("a", "y"), want: addrs("192.0.2.1")},
		{name: "namespace b: general only", req: in("b", "x"), want: addrs("192.0.2.2")},
		{name: "general full: the pods pool is never auto-assigned", req: in("b", "z"), reason: ReasonExhausted},
		{name: "b names a's pool", req: named(in("b", "z"), "manual-a"), reason: ReasonPoolNotAllowed},
		{name: "b requests an address of a's pool", req: asks(in("b", "z"), "198.51.100.20"), reason: ReasonPoolNotAllowed},
		{name: "no label names the gold pool", req: named(in("b", "z"), "gold"), reason: ReasonPoolNotAllowed},
		{name: "a names its manual pool", req: named(in("a", "z"), "manual-a"), want: addrs("198.51.100.20")},
		{name: "the pods pool when named", req: named(in("b", "z"), "pods"), want: addrs("203.0.113.1")},
	} {
		got, err := a.Assign(s.req)
		check(t, s, got, err)
	}
}

func check(t *testing.T, s step, got []netip.Addr, err error) {
	t.Helper()
	if s.reason != "" {
		var e *Error
		if !errors.As(err, &e) || e.Reason != s.reason {
			t.Fatalf("%s: got %v, %v; want refusal %s", s.name, got, err, s.reason)
		}
		return
	}
	if err != nil || !slices.Equal(got, s.want) {
		t.Fatalf("%s: got %v, %v; want %v", s.name, got, err, s.want)
	}
}

func TestSharingRules(t *testing.T) {
	shared := func(ns, name, key string, local bool, sel string, port uint16) Request {
		return Request{Service: portal.ServiceKey{Namespace: ns, Name: name}, SharingKey: key, Local: local, Selector: sel,
			Ports: tcp(port), Requested: addrs("192.0.2.1")}
	}
	for _, tc := range []struct {
		name   string
		across bool
		first  Request
		second Request
		ok     bool
	}{
		{"same namespace and key", false, shared("a", "x", "k", false, "", 80), shared("a", "y", "k", false, "", 443), true},
		{"another namespace, same key", false, shared("a", "x", "k", false, "", 80), shared("b", "y", "k", false, "", 443), false},
		{"another namespace, pool shares across", true, shared("a", "x", "k", false, "", 80), shared("b", "y", "k", false, "", 443), true},
		{"Local and Cluster", false, shared("a", "x", "k", true, "app=web", 80), shared("a", "y", "k", false, "app=web", 443), false},
		{"Cluster and Local", false, shared("a", "x", "k", false, "app=web", 80), shared("a", "y", "k", true, "app=web", 443), false},
		{"Local, other pods", false, shared("a", "x", "k", true, "app=web", 80), shared("a", "y", "k", true, "app=api", 443), false},
		{"Local, same pods", false, shared("a", "x", "k", true, "app=web", 80), shared("a", "y", "k", true, "app=web", 443), true},
		{"Local, no selector", false, shared("a", "x", "k", true, "", 80), shared("a", "y", "k", true, "", 443), false},
		{"ports collide", false, shared("a", "x", "k", false, "", 80), shared("a", "y", "k", false, "", 80), false},
	} {
		a, err := New([]Pool{mustPoolOpts(t, "p", PoolOptions{AutoAssign: true, ShareAcrossNamespaces: tc.across}, "192.0.2.1-192.0.2.4")})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.Assign(tc.first); err != nil {
			t.Fatalf("%s: first: %v", tc.name, err)
		}
		_, err = a.Assign(tc.second)
		if tc.ok != (err == nil) {
			t.Errorf("%s: second: %v, want ok=%v", tc.name, err, tc.ok)
		}
		// Without a requested address the second gets an address of its
		// own when it may not share, the first's when it may.
		a.Release(tc.second.Service)
		auto := tc.second
		auto.Requested = nil
		got, err := a.Assign(auto)
		if err != nil || (got[0] == netip.MustParseAddr("192.0.2.1")) != tc.ok {
			t.Errorf("%s: auto: %v %v, want sharing=%v", tc.name, got, err, tc.ok)
		}
		if len(a.Holds(tc.first.Service)) != 1 {
			t.Errorf("%s: the first Service lost its address", tc.name)
		}
	}
}

func TestReserved(t *testing.T) {
	a, err := New([]Pool{mustPool(t, "p", true, false, "192.0.2.1-192.0.2.3")})
	if err != nil {
		t.Fatal(err)
	}
	held := map[netip.Addr]string{netip.MustParseAddr("192.0.2.1"): "node n1"}
	a.Reserved = func(ip netip.Addr) string { return held[ip] }
	for _, s := range []step{
		{name: "auto skips the node's address", req: Request{Service: svc("a")}, want: addrs("192.0.2.2")},
		{name: "request of the node's address", req: Request{Service: svc("b"), Requested: addrs("192.0.2.1")}, reason: ReasonConflict},
	} {
		got, err := a.Assign(s.req)
		check(t, s, got, err)
	}
	if err := a.Restore(Request{Service: svc("c")}, addrs("192.0.2.1")); err == nil {
		t.Error("restored a reserved address")
	}
	// An address reserved after it was assigned is given up at the next
	// Assign (the registry only reserves addresses a load-balancer
	// allocation does not hold, or a node's and cluster IPs).
	held[netip.MustParseAddr("192.0.2.2")] = "cluster IP of Service ns/x"
	if got, err := a.Assign(Request{Service: svc("a")}); err != nil || got[0] != netip.MustParseAddr("192.0.2.3") {
		t.Errorf("reserved after assignment: got %v %v, want 192.0.2.3", got, err)
	}
}

// A pool that shrinks or goes away under a Service renumbers nothing: the
// Service keeps its address, which no one else is given, also when a pool
// holds it again.
func TestShrunkPoolKeepsHeldAddresses(t *testing.T) {
	before, err := New([]Pool{mustPool(t, "main", true, false, "192.0.2.0/29")})
	if err != nil {
		t.Fatal(err)
	}
	named := Request{Service: svc("named"), Pool: "main"}
	asked := Request{Service: svc("asked"), Requested: addrs("192.0.2.3")}
	for _, req := range []Request{{Service: svc("a")}, named, asked} {
		if _, err := before.Assign(req); err != nil {
			t.Fatal(err)
		}
	}
	// a holds .1, named .2, asked .3; main shrinks to .4-.5.
	after, err := New([]Pool{mustPool(t, "main", true, false, "192.0.2.4-192.0.2.5")})
	if err != nil {
		t.Fatal(err)
	}
	for _, req := range []Request{{Service: svc("a")}, named, asked} {
		if err := after.Restore(req, before.Holds(req.Service)); err != nil {
			t.Fatalf("restore %s: %v", req.Service, err)
		}
		if got, want := after.Outside(req.Service), before.Holds(req.Service); !slices.Equal(got, want) {
			t.Errorf("%s outside %v, want %v", req.Service, got, want)
		}
		got, err := after.Assign(req)
		if err != nil || !slices.Equal(got, before.Holds(req.Service)) {
			t.Errorf("%s: %v %v, want it to keep %v", req.Service, got, err, before.Holds(req.Service))
		}
	}
	if got, err := after.Assign(Request{Service: svc("new")}); err != nil || !slices.Equal(got, addrs("192.0.2.4")) {
		t.Errorf("new: %v %v, want 192.0.2.4 of the shrunk pool", got, err)
	}
	wantReason(t, after, Request{Service: svc("thief"), Requested: addrs("192.0.2.1")}, ReasonNotInPool)
	wantReason(t, after, Request{Service: svc("sharer"), Requested: addrs("192.0.2.1"), SharingKey: "k"}, ReasonNotInPool)

	// main goes: a Service naming it keeps its address.
	gone, err := New([]Pool{mustPool(t, "other", true, false, "198.51.100.1")})
	if err != nil {
		t.Fatal(err)
	}
	if err := gone.Restore(named, addrs("192.0.2.2")); err != nil {
		t.Fatal(err)
	}
	if got, err := gone.Assign(named); err != nil || !slices.Equal(got, addrs("192.0.2.2")) {
		t.Errorf("named, its pool deleted: %v %v, want it to keep 192.0.2.2", got, err)
	}
	wantReason(t, gone, Request{Service: svc("b"), Pool: "main"}, ReasonUnknownPool)

	// main grows back: a keeps .1, which is no longer outside, and a new
	// Service gets none of the held addresses.
	again, err := New([]Pool{mustPool(t, "main", true, false, "192.0.2.1-192.0.2.4")})
	if err != nil {
		t.Fatal(err)
	}
	for _, req := range []Request{{Service: svc("a")}, named, asked} {
		if err := again.Restore(req, before.Holds(req.Service)); err != nil {
			t.Fatal(err)
		}
	}
	if out := again.Outside(svc("a")); len(out) != 0 {
		t.Errorf("a outside %v after main grew back", out)
	}
	if got, err := again.Assign(Request{Service: svc("new")}); err != nil || !slices.Equal(got, addrs("192.0.2.4")) {
		t.Errorf("new: %v %v, want 192.0.2.4", got, err)
	}

	// Asking for another address lets the one outside go.
	if got, err := after.Assign(Request{Service: svc("asked"), Requested: addrs("192.0.2.5")}); err != nil || !slices.Equal(got, addrs("192.0.2.5")) {
		t.Errorf("asked moves: %v %v", got, err)
	}
	if out := after.Outside(svc("asked")); len(out) != 0 {
		t.Errorf("asked still outside %v after moving", out)
	}
}

func wantReason(t *testing.T, a *Allocator, req Request, r Reason) {
	t.Helper()
	_, err := a.Assign(req)
	var e *Error
	if !errors.As(err, &e) || e.Reason != r {
		t.Errorf("%s: %v, want %s", req.Service, err, r)
	}
}
