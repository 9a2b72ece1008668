package main

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/nft"
	"github.com/onehop/onehop/portal"
)

// nodePortAddresses CIDRs with real packets: a NodePort is served on every
// interface address of the node inside the CIDRs, an address added later
// included, and not on one outside them.
func TestNodePortAddressesFollowInterfaces(t *testing.T) {
	ns := newTestNetns(t, "onehop-np")
	for _, cmd := range [][]string{
		{"ip", "link", "set", "lo", "up"},
		{"ip", "link", "add", "va", "type", "veth", "peer", "name", "vb"},
		{"ip", "addr", "add", "192.0.2.1/24", "dev", "va"},    // outside the CIDRs
		{"ip", "addr", "add", "198.51.100.7/24", "dev", "vb"}, // inside
		{"ip", "link", "set", "va", "up"},
		{"ip", "link", "set", "vb", "up"},
		{"ip", "addr", "add", "10.244.0.5/32", "dev", "lo"}, // the endpoint
	} {
		ns.exec(t, "", cmd...)
	}
	key := portal.ServiceKey{Namespace: "default", Name: "web"}
	svc := &portal.Service{Key: key, Portals: []*portal.Portal{{
		Key:              portal.PortKey{Service: key, Port: "http", Protocol: portal.TCP, Family: portal.IPv4},
		Port:             80,
		ClusterIPs:       []netip.Addr{netip.MustParseAddr("10.96.0.10")},
		NodePort:         30080,
		ClusterEndpoints: []netip.AddrPort{netip.MustParseAddrPort("10.244.0.5:8080")},
	}}}
	// The Node object's address is outside the CIDRs: it must not count.
	base := staticSource{addrs: []netip.Addr{netip.MustParseAddr("192.0.2.1")}}
	base.svcs = map[portal.ServiceKey]*portal.Service{key: svc}
	src := newNodePortSource(base, []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("203.0.113.0/24")})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	changed := make(chan struct{}, 1)
	if err := src.follow(ctx, int(ns.handle), slog.New(slog.DiscardHandler), func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}); err != nil {
		t.Fatal(err)
	}
	dp := nft.New(dataplane.Config{}, nft.WithNetNS(int(ns.handle)))
	full := true
	sync := func() {
		t.Helper()
		snap, _ := src.Snapshot()
		if _, err := dp.Sync(ctx, snap, full); err != nil {
			t.Fatal(err)
		}
		full = false
	}
	sync()

	var ln net.Listener
	inNetns(t, ns, func() {
		var err error
		if ln, err = net.Listen("tcp", "10.244.0.5:8080"); err != nil {
			t.Errorf("listen: %v", err)
		}
	})
	if ln == nil {
		t.FailNow()
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("ok"))
			c.Close()
		}
	}()
	reach := func(addr string) error {
		var err error
		inNetns(t, ns, func() { err = requestOnce(addr) })
		return err
	}

	if err := reach("198.51.100.7:30080"); err != nil {
		t.Errorf("NodePort on an interface address inside the CIDRs: %v", err)
	}
	if err := reach("192.0.2.1:30080"); err == nil {
		t.Error("NodePort served on an address outside the CIDRs")
	}

	ns.exec(t, "", "ip", "addr", "add", "203.0.113.9/24", "dev", "va")
	// A signal may be left from the links coming up: wait until the
	// source holds the new address itself.
	added := netip.MustParseAddr("203.0.113.9")
	for deadline := time.Now().Add(30 * time.Second); ; {
		snap, _ := src.Snapshot()
		if slices.Contains(snap.Node.NodePortAddrs, added) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the new address was never reported")
		}
		select {
		case <-changed:
		case <-time.After(100 * time.Millisecond):
		}
	}
	sync()
	if err := reach("203.0.113.9:30080"); err != nil {
		t.Errorf("NodePort on an address added later: %v", err)
	}
	if err := reach("198.51.100.7:30080"); err != nil {
		t.Errorf("NodePort on the first address after the change: %v", err)
	}
}
