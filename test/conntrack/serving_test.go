package conntrack_test

import (
	"net/netip"
	"testing"
	"time"

	"github.com/onehop/onehop/portal"
	"github.com/onehop/onehop/test/nsutil"
)

// serving is svc with the pods serving its port besides its DNAT targets
// (a terminating endpoint that still serves, one that topology or a
// traffic policy leaves out).
func serving(svc *portal.Service, pods ...int) *portal.Service {
	p := svc.Portals[0]
	for _, i := range pods {
		ip := nsutil.PodIP(i)
		if p.Key.Family == portal.IPv6 {
			ip = nsutil.PodIP6(i)
		}
		p.Serving = append(p.Serving, netip.AddrPortFrom(ip, nsutil.EchoPort))
	}
	return svc
}

// The pod a flow runs to stops being a DNAT target but still serves: new
// flows go to the other pod, and the running one stays on its pod after
// the cleaner ran, as in kube-proxy. When the pod stops serving the flow
// moves.
func TestUDPFlowStaysOnServingEndpoint(t *testing.T) {
	for _, tc := range []struct{ name, vip, addr string }{
		{"ClusterIP", "10.96.0.56", "10.96.0.56:53"},
		{"NodePort", "10.96.0.56", nsutil.NodeIP + ":30053"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tp := newTopo(t, 2)
			tp.sync(t, snapshot(serving(udpService("drain", tc.vip, 0), 0)), true)
			s := startSender(t, tp.Client, tc.addr)
			s.waitFor(t, podName(0), time.Time{})

			tp.sync(t, snapshot(serving(udpService("drain", tc.vip, 1), 0, 1)), true)
			from := time.Now().Add(inFlight)
			time.Sleep(inFlight + 300*time.Millisecond)
			if ok, n := s.only(podName(0), from, time.Now()); !ok || n == 0 {
				t.Errorf("after the cleanup the flow does not stay on the serving %s (%d datagrams): %s", podName(0), n, s.summary(from))
			}

			began := time.Now()
			tp.sync(t, snapshot(serving(udpService("drain", tc.vip, 1), 1)), true)
			t.Logf("%s stopped serving: the flow reached %s %v after the sync started", podName(0), podName(1), s.waitFor(t, podName(1), began).Round(time.Millisecond))
		})
	}
}
