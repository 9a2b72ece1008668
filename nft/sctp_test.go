package nft

import (
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/onehop/onehop/portal"
	"github.com/onehop/onehop/test/nsutil"
)

// SCTP next to TCP and UDP on the same port number. This host's kernel may
// lack SCTP; the IPVS VM's kernel has it, and test/vm runs this package's
// tests there too.
func TestSCTPNextToTCPAndUDP(t *testing.T) {
	t.Parallel()
	tp := newTopo(t, 2)
	for i, p := range tp.pods {
		if err := p.EchoSCTP(t, "pod"+string(rune('0'+i)), 8080); err != nil {
			if errors.Is(err, nsutil.ErrNoSCTP) {
				t.Skip("this kernel has no SCTP (socket: protocol not supported); the VM tests cover it")
			}
			t.Fatal(err)
		}
	}
	key := portal.ServiceKey{Namespace: "default", Name: "multi"}
	svc := &portal.Service{Key: key}
	for _, proto := range []portal.Protocol{portal.TCP, portal.UDP, portal.SCTP} {
		p := &portal.Portal{
			Key: portal.PortKey{Service: key, Port: proto.String(), Protocol: proto, Family: portal.IPv4}, Port: 80,
			ClusterIPs: []netip.Addr{clusterIP}, NodePort: 30080, ClusterEndpoints: eps(8080, 0, 1)}
		p.Hairpin = allHairpin(p) // pod0 asks, and may be picked
		svc.Portals = append(svc.Portals, p)
	}
	tp.sync(t, snapshot(svc), true)
	for _, c := range []struct {
		from *nsutil.NS
		addr string
	}{{tp.pods[0], "10.96.0.10:80"}, {tp.client, nodeIP + ":30080"}} {
		seen := map[string]int{}
		for i := 0; i < 20; i++ {
			r, err := c.from.AskSCTP(netip.MustParseAddrPort(c.addr), 2*time.Second)
			if err != nil {
				t.Fatalf("sctp %s: %v", c.addr, err)
			}
			seen[r.Name]++
		}
		if len(seen) != 2 {
			t.Errorf("sctp %s: want both endpoints, got %v", c.addr, seen)
		}
		ask(t, c.from, "tcp", c.addr, 1)
		ask(t, c.from, "udp", c.addr, 1)
	}
}
