package providers

import (
	"io"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/onehop/onehop/external/internal/fakecluster"
	"github.com/onehop/onehop/external/l2"
	"github.com/onehop/onehop/external/leases"
	"github.com/onehop/onehop/portal"
)

// TestL2ConflictLowerRankYields: node a answers for two IPs while b is dead
// in its view of the Leases. b is heard announcing both: b is alive again,
// and for the IP b outranks a for, a yields (the hook is woken, nothing is
// announced); for the IP a outranks b for, a defends it by announcing it
// again, once per defence interval. An announcer no Lease names is
// answered by the defence alone.
func TestL2ConflictLowerRankYields(t *testing.T) {
	c := fakecluster.NewClocked(t, true)
	bMAC, _ := net.ParseMAC("02:00:00:00:00:0b")
	c.RV["b"]++
	rt := metav1.NewMicroTime(c.Clock)
	c.Observe(&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: leases.LeasePrefix + "b", ResourceVersion: strconv.Itoa(c.RV["b"]),
		Annotations: map[string]string{leases.AnnotationLinkAddrs: bMAC.String()}}, Spec: coordinationv1.LeaseSpec{RenewTime: &rt}})
	c.Advance(4*time.Second, time.Second, "a") // b's agent died
	c.Want("b dead", map[string]bool{"a": true, "b": false})

	// One IP b outranks a for, one a outranks b for.
	var bFirst, aFirst netip.Addr
	for i := 1; i < 255 && (!bFirst.IsValid() || !aFirst.IsValid()); i++ {
		ip := netip.AddrFrom4([4]byte{192, 0, 2, byte(i)})
		if l2.Owner(ip, []string{"a", "b"}) == "b" {
			bFirst = ip
		} else {
			aFirst = ip
		}
	}
	web := portal.ServiceKey{Namespace: "default", Name: "web"}
	st := &State{Node: "a", view: View{Alive: c.Alive, Programmed: map[Served]Programmed{}}}
	for _, ip := range []netip.Addr{aFirst, bFirst} {
		st.Targets = append(st.Targets, Target{IP: ip, Service: web, Nodes: []string{"a", "b"}})
		st.view.Programmed[Served{ip, web}] = Programmed{AnyEndpoint: true}
	}
	for _, ip := range []netip.Addr{aFirst, bFirst} {
		if owner, _ := L2Owner(st, ip); owner != "a" {
			t.Fatalf("with b dead %s is owned by %s, want a", ip, owner)
		}
	}

	var announced []netip.Addr
	pokes := 0
	cf := l2Conflicts{announce: func(ips []netip.Addr) { announced = append(announced, ips...) }, lv: c.Liveness,
		poke: func() { pokes++ }, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	cf.told(st)

	cf.heard(bFirst, bMAC)
	c.Want("b heard", map[string]bool{"b": true})
	if owner, _ := L2Owner(st, bFirst); owner != "b" || pokes != 1 || len(announced) != 0 {
		t.Errorf("b heard for %s, which it outranks a for: owner %s, %d wake-ups, announced %v; want b, 1, none", bFirst, owner, pokes, announced)
	}

	cf.heard(aFirst, bMAC)
	if owner, _ := L2Owner(st, aFirst); owner != "a" || len(announced) != 1 || announced[0] != aFirst {
		t.Errorf("b heard for %s, which a outranks it for: owner %s, announced %v; want a, [%s]", aFirst, owner, announced, aFirst)
	}
	cf.heard(aFirst, bMAC)
	if len(announced) != 1 {
		t.Errorf("a defended %s twice within the defence interval: %v", aFirst, announced)
	}

	// A stranger announcing an IP a owns: a defends.
	stranger, _ := net.ParseMAC("02:00:00:00:00:99")
	announced = nil
	c.Advance(4*time.Second, time.Second, "a") // b heard too long ago: dead again
	c.Want("b not heard for a lease duration", map[string]bool{"b": false})
	cf.heard(bFirst, stranger)
	if len(announced) != 1 || announced[0] != bFirst {
		t.Errorf("a stranger announced %s: a announced %v, want [%s]", bFirst, announced, bFirst)
	}
	c.Want("a stranger heard", map[string]bool{"b": false})

	// a stops: b taking its IPs over is not fought.
	announced, pokes = nil, 0
	cf.defended = nil
	cf.stopping = func() bool { return true }
	cf.heard(aFirst, bMAC)
	if len(announced) != 0 || pokes != 0 {
		t.Errorf("a stopping, b heard for %s: announced %v, %d wake-ups; want none", aFirst, announced, pokes)
	}
}

// TestL2ProbeBeforeTakeover: a is about to take an IP over from b, whose
// Lease expired. If b still answers a's probe, b is alive and keeps the
// IP; if nothing answers, or a host no Lease names, a takes it over. An
// IP that was nobody's, or whose owner is alive or stopped cleanly (its
// Lease deleted), is not probed for.
func TestL2ProbeBeforeTakeover(t *testing.T) {
	c := fakecluster.NewClocked(t, true)
	bMAC, _ := net.ParseMAC("02:00:00:00:00:0b")
	stranger, _ := net.ParseMAC("02:00:00:00:00:99")
	c.RV["b"]++
	rt := metav1.NewMicroTime(c.Clock)
	c.Observe(&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: leases.LeasePrefix + "b", ResourceVersion: strconv.Itoa(c.RV["b"]),
		Annotations: map[string]string{leases.AnnotationLinkAddrs: bMAC.String()}}, Spec: coordinationv1.LeaseSpec{RenewTime: &rt}})
	c.Advance(4*time.Second, time.Second, "a")
	c.Want("b's Lease expired", map[string]bool{"b": false})

	ip, fresh := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")
	st := &State{Node: "a", view: View{Alive: c.Alive}}
	before := map[netip.Addr]string{ip: "b", fresh: ""}
	for _, tc := range []struct {
		name   string
		answer net.HardwareAddr
		want   []netip.Addr
	}{
		{"nobody answers", nil, []netip.Addr{ip, fresh}},
		{"a stranger answers", stranger, []netip.Addr{ip, fresh}},
		{"b answers", bMAC, []netip.Addr{fresh}},
	} {
		var asked []netip.Addr
		cf := l2Conflicts{lv: c.Liveness, log: slog.New(slog.NewTextHandler(io.Discard, nil)),
			probe: func(ips []netip.Addr, _ time.Duration) map[netip.Addr]net.HardwareAddr {
				asked = append(asked, ips...)
				if tc.answer == nil {
					return nil
				}
				return map[netip.Addr]net.HardwareAddr{ip: tc.answer}
			}}
		own := []netip.Addr{ip, fresh}
		got := cf.probeTakeovers(st, tookOver(st, func(ip netip.Addr) string { return before[ip] }, nil, own), own)
		if !slices.Equal(asked, []netip.Addr{ip}) || !slices.Equal(got, tc.want) {
			t.Errorf("%s: probed %v, took %v; want %s probed, %v taken", tc.name, asked, got, ip, tc.want)
		}
		if tc.answer != nil && tc.answer.String() == bMAC.String() && !c.Alive("b") {
			t.Errorf("%s: b answered, yet not alive", tc.name)
		}
	}
	// b heard: alive, so the IP is not a takeover from a dead node.
	cf := l2Conflicts{lv: c.Liveness, probe: func([]netip.Addr, time.Duration) map[netip.Addr]net.HardwareAddr {
		t.Error("probed for an IP whose owner is alive")
		return nil
	}}
	cf.probeTakeovers(st, tookOver(st, func(ip netip.Addr) string { return before[ip] }, nil, []netip.Addr{ip}), []netip.Addr{ip})

	// b stopped cleanly and deleted its Lease: its IP is taken over
	// without a probe, which b's closing responder could still answer.
	c.Advance(4*time.Second, time.Second, "a")
	c.Forget(leases.LeasePrefix + "b")
	cf = l2Conflicts{lv: c.Liveness, probe: func([]netip.Addr, time.Duration) map[netip.Addr]net.HardwareAddr {
		t.Error("probed for an IP whose owner stopped cleanly")
		return map[netip.Addr]net.HardwareAddr{ip: bMAC}
	}}
	if got := cf.probeTakeovers(st, tookOver(st, func(ip netip.Addr) string { return before[ip] }, nil, []netip.Addr{ip}), []netip.Addr{ip}); !slices.Equal(got, []netip.Addr{ip}) {
		t.Errorf("b's Lease deleted: took %v, want %s", got, ip)
	}
}
