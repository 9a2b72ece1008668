package nft

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/onehop/onehop/portal"
	"github.com/onehop/onehop/test/nsutil"
)

// TestAffinitySharedByTheWaysIn: under externalTrafficPolicy: Local with
// ClientIP affinity, a client that reached a pod by the node port is sent
// to the same pod by the cluster IP, as kube-proxy does with one affinity
// set per endpoint for all the Service's chains: the ext chain, with one
// local endpoint or with two, remembers the client for the svc chain.
// Each client address is a new client; four endpoints in the svc chain
// leave a chain with its own memory one chance in four per client.
func TestAffinitySharedByTheWaysIn(t *testing.T) {
	t.Parallel()
	tp := newTopo(t, 4)
	for i, local := range [][]int{{0}, {0, 1}} {
		svc := service("sticky", func(p *portal.Portal) {
			p.ClusterIPs = []netip.Addr{clusterIP}
			p.NodePort = 30080
			p.ExternalLocal = true
			p.ClusterEndpoints = eps(8080, 0, 1, 2, 3)
			p.LocalEndpoints = eps(8080, local...)
			p.Affinity.TimeoutSeconds = 600
		})
		tp.sync(t, snapshot(svc), i == 0)
		for c := range 6 {
			src := fmt.Sprintf("198.51.100.%d", 20+10*i+c)
			tp.client.IP(t, "addr", "add", src+"/32", "dev", "eth0")
			first := askFromAddr(t, tp.client, src, nodeIP+":30080")
			for range 3 {
				if got := askFromAddr(t, tp.client, src, clusterIP.String()+":80"); got != first {
					t.Errorf("local endpoints %v: client %s reached %s by the node port, then %s by the cluster IP", local, src, first, got)
				}
			}
		}
	}
}

// askFromAddr makes one TCP request from ns with source address src and
// returns the pod that answered.
func askFromAddr(t *testing.T, ns *nsutil.NS, src, addr string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var conn net.Conn
	err := ns.Do(func() error {
		d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(netip.MustParseAddr(src), 0))}
		var err error
		conn, err = d.DialContext(ctx, "tcp", addr)
		return err
	})
	if err != nil {
		t.Fatalf("tcp %s from %s: %v", addr, src, err)
	}
	defer conn.Close()
	r, err := nsutil.AskOn(conn, 2*time.Second)
	if err != nil {
		t.Fatalf("tcp %s from %s: %v", addr, src, err)
	}
	return r.Name
}

// TestAffinityKeptWhenEndpointsCome: a client of a Service port with one
// endpoint and ClientIP affinity is remembered, as kube-proxy remembers
// it, so that it stays on that pod when more endpoints come.
func TestAffinityKeptWhenEndpointsCome(t *testing.T) {
	t.Parallel()
	tp := newTopo(t, 4)
	mk := func(idx ...int) *portal.Service {
		return service("grow", func(p *portal.Portal) {
			p.ClusterIPs = []netip.Addr{clusterIP}
			p.ClusterEndpoints = eps(8080, idx...)
			p.Affinity.TimeoutSeconds = 600
		})
	}
	tp.sync(t, snapshot(mk(0)), true)
	var clients []string
	for c := range 6 {
		src := fmt.Sprintf("198.51.100.%d", 40+c)
		tp.client.IP(t, "addr", "add", src+"/32", "dev", "eth0")
		if got := askFromAddr(t, tp.client, src, clusterIP.String()+":80"); got != "pod0" {
			t.Fatalf("one endpoint, pod0: %s answered", got)
		}
		clients = append(clients, src)
	}
	tp.sync(t, snapshot(mk(0, 1, 2, 3)), false)
	for _, src := range clients {
		if got := askFromAddr(t, tp.client, src, clusterIP.String()+":80"); got != "pod0" {
			t.Errorf("client %s of pod0 went to %s when endpoints came", src, got)
		}
	}
}
