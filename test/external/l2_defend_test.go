package external

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"

	"github.com/onehop/onehop/external/config"
	"github.com/onehop/onehop/external/l2"
)

// TestL2OwnerDefendsItsIP: a host that is no node ("rogue", on the same
// bridge) announces the VIP with a gratuitous ARP, as a misconfigured
// host or a stale speaker would, and the client's neighbour entry moves to
// it. The owner's agent hears the announcement from a link-layer address
// no node's Lease publishes, and defends the VIP by announcing it again
// (a burst, past the client's locktime), so the client's entry comes back
// to the owner without the client sending anything (a request's answer
// would move it too, so nothing asks meanwhile).
func TestL2OwnerDefendsItsIP(t *testing.T) {
	lab := newL2Lab(t)
	lab.add("rogue")
	lab.veth("sw", "vrogue", "rogue", "eth0")
	lab.ip("sw", "link", "set", "vrogue", "master", "br0")
	lab.ip("rogue", "addr", "add", "10.0.0.66/24", "dev", "eth0")
	cp, c := lab.twoNodeCluster("sw")
	sp := newSplit(t, cp)
	cfg := sp.config(config.Config{
		Pools: []config.PoolConfig{{Name: "lab", Addresses: []string{vip}}},
		L2:    &l2.Config{Interfaces: []string{"eth0"}, LeaseRenewSeconds: 0.5, LeaseDurationSeconds: 1.5},
	})
	sp.runAll(lab, cfg)
	createLB(t, c, "web", 80)
	if ips := lbIPs(t, c, "web", "allocation", some); ips[0] != vip {
		t.Fatalf("web got %v, want %s", ips, vip)
	}
	setEndpoints(t, c, "web", map[string]string{"node1": "10.244.1.2", "node2": "10.244.2.2"})
	owner := l2.Owner(netip4(vip), []string{"node1", "node2"})
	pod := map[string]string{"node1": "pod1", "node2": "pod2"}
	ownerMAC, rogueMAC := lab.mac(owner, "eth0"), lab.mac("rogue", "eth0")
	if _, ok := waitFor(context.Background(), 20*time.Second, func() bool {
		got, _ := lab.get("client", vip+":80")
		return got == pod[owner] && lab.neigh(vip) == ownerMAC
	}); !ok {
		t.Fatalf("client's entry for %s is %q, want owner %s's %s", vip, lab.neigh(vip), owner, ownerMAC)
	}
	// Past the owner's gratuitous burst at start-up (5 rounds, 1.1 s
	// apart) and the client's neighbour locktime after its last round.
	time.Sleep(6 * time.Second)

	// The defence may come within a millisecond (a gratuitous ARP
	// overrides the locktime): the client's kernel reports each change.
	mon := lab.command("client", "ip", "monitor", "neigh")
	changes := &lockedBuffer{}
	mon.Stdout = changes
	if err := mon.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mon.Process.Kill(); _ = mon.Wait() })
	time.Sleep(500 * time.Millisecond) // the monitor listening

	t0 := time.Now()
	lab.gratuitousARP("rogue", "eth0", vip)
	if _, ok := waitFor(context.Background(), 2*time.Second, func() bool { return strings.Contains(changes.String(), rogueMAC) }); !ok {
		t.Fatalf("the rogue's announcement did not move the client's entry for %s (the test could not tell a defence): %q", vip, changes.String())
	}
	if _, ok := waitFor(context.Background(), 10*time.Second, func() bool {
		c := changes.String()
		return lab.neigh(vip) == ownerMAC && strings.LastIndex(c, ownerMAC) > strings.LastIndex(c, rogueMAC)
	}); !ok {
		t.Fatalf("the owner %s did not defend %s: the client's entry is %q; its changes:\n%s", owner, vip, lab.neigh(vip), changes.String())
	}
	t.Logf("rogue announced %s; the client's entry back on owner %s %v later; its changes:\n%s", vip, owner, time.Since(t0).Round(time.Millisecond), changes.String())
	if got, err := lab.get("client", vip+":80"); err != nil || got != pod[owner] {
		t.Fatalf("after the defence: %q, %v; want %s", got, err, pod[owner])
	}
}

// gratuitousARP sends, from iface of namespace n, one gratuitous ARP
// request announcing ip with the interface's link-layer address.
func (tp *topo) gratuitousARP(n, iface, ip string) {
	tp.t.Helper()
	var c *arp.Client
	var mac net.HardwareAddr
	if err := tp.at(n).Do(func() error {
		ifi, err := net.InterfaceByName(iface)
		if err != nil {
			return err
		}
		mac = ifi.HardwareAddr
		c, err = arp.Dial(ifi)
		return err
	}); err != nil {
		tp.t.Fatalf("ARP socket in %s: %v", n, err)
	}
	defer c.Close()
	a := netip.MustParseAddr(ip)
	p, err := arp.NewPacket(arp.OperationRequest, mac, a, ethernet.Broadcast, a)
	if err == nil {
		err = c.WriteTo(p, ethernet.Broadcast)
	}
	if err != nil {
		tp.t.Fatalf("gratuitous ARP from %s: %v", n, err)
	}
}
