package main

import (
	"context"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/nft"
	"github.com/onehop/onehop/portal"
)

// The migration guide's step 4 on a node onehop serves: a client keeps
// opening connections to a cluster IP that only onehop's table translates,
// while `agent cleanup --kube-proxy-leftovers` removes kube-proxy's tables
// and chains. Every connection succeeds, before, during and after.
func TestKubeProxyLeftoversCleanupLosesNoRequest(t *testing.T) {
	for _, bin := range []string{"nft", "iptables-nft-restore"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("needs %s (Debian: nftables, iptables): %v", bin, err)
		}
	}
	ns := newTestNetns(t, "onehop-migrate")
	// A route for the cluster IP (output NAT runs after routing) and the
	// endpoint on loopback.
	for _, cmd := range [][]string{
		{"ip", "link", "set", "lo", "up"},
		{"ip", "link", "add", "va", "type", "veth", "peer", "name", "vb"},
		{"ip", "addr", "add", "192.0.2.1/24", "dev", "va"},
		{"ip", "link", "set", "va", "up"},
		{"ip", "link", "set", "vb", "up"},
		{"ip", "route", "add", "default", "via", "192.0.2.2", "dev", "va"},
		{"ip", "addr", "add", "10.244.0.5/32", "dev", "lo"},
	} {
		ns.exec(t, "", cmd...)
	}
	ns.exec(t, kubeProxyRuleset, "iptables-nft-restore")
	ns.exec(t, kubeProxyNFT, "nft", "-f", "-")

	// onehop's table, as `agent run` programs it.
	key := portal.ServiceKey{Namespace: "default", Name: "web"}
	svc := &portal.Service{Key: key, Portals: []*portal.Portal{{
		Key:              portal.PortKey{Service: key, Port: "http", Protocol: portal.TCP, Family: portal.IPv4},
		Port:             80,
		ClusterIPs:       []netip.Addr{netip.MustParseAddr("10.96.0.10")},
		ClusterEndpoints: []netip.AddrPort{netip.MustParseAddrPort("10.244.0.5:8080")},
	}}}
	snap := &portal.Snapshot{Node: portal.Node{Name: "node"}, Services: map[portal.ServiceKey]*portal.Service{key: svc},
		Dirty: []portal.ServiceKey{key}}
	dp := nft.New(dataplane.Config{}, nft.WithNetNS(int(ns.handle)))
	if _, err := dp.Sync(context.Background(), snap, true); err != nil {
		t.Fatalf("programming onehop's table: %v", err)
	}

	// The endpoint: answers "ok" to every connection.
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

	var ok, failed atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		inNetns(t, ns, func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := requestOnce("10.96.0.10:80"); err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					continue
				}
				ok.Add(1)
			}
		})
	}()
	waitRequests := func(n int64) {
		t.Helper()
		for target, deadline := ok.Load()+n, time.Now().Add(30*time.Second); ok.Load() < target; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) || failed.Load() > 0 {
				break
			}
		}
	}
	waitRequests(50)
	var stdout, stderr strings.Builder
	var cleanupErr error
	inNetns(t, ns, func() {
		cleanupErr = cleanupCmd(context.Background(), []string{"--kube-proxy-leftovers"}, &stdout, &stderr)
	})
	before := ok.Load()
	waitRequests(50)
	close(stop)
	wg.Wait()
	t.Logf("%d requests, %d failed; cleanup output:\n%s%s", ok.Load()+failed.Load(), failed.Load(), stdout.String(), stderr.String())
	if cleanupErr != nil {
		t.Fatalf("cleanup --kube-proxy-leftovers: %v", cleanupErr)
	}
	if n := failed.Load(); n > 0 {
		t.Errorf("%d requests failed, the first: %v", n, firstErr.Load())
	}
	if ok.Load() < before+50 {
		t.Errorf("only %d requests after the cleanup", ok.Load()-before)
	}
	if !strings.Contains(stdout.String(), "nftables table ip kube-proxy") {
		t.Errorf("kube-proxy's table was not removed:\n%s", stdout.String())
	}
	if tables := ns.exec(t, "", "nft", "list", "tables"); !strings.Contains(tables, "table inet onehop") {
		t.Errorf("onehop's table is gone:\n%s", tables)
	}
}

// requestOnce opens a connection to addr and reads the endpoint's answer.
func requestOnce(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	b, err := io.ReadAll(c)
	if err != nil {
		return err
	}
	if string(b) != "ok" {
		return io.ErrUnexpectedEOF
	}
	return nil
}
