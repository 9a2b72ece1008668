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

// kubeProxyServing is kube-proxy's nftables mode, stopped (migration step
// 2): its table still translates the cluster IP 10.96.0.10:80 to the pod
// 10.244.0.5:8080 it knew of, in kube-proxy's layout (a verdict map of
// Services, a chain per Service and per endpoint, at priority dstnat).
const kubeProxyServing = `table ip kube-proxy {
	map service-ips {
		type ipv4_addr . inet_proto . inet_service : verdict
		elements = { 10.96.0.10 . tcp . 80 : goto service-ULMVA6XW-default/web/tcp/http }
	}
	chain endpoint-5OJB2KTY-default/web/tcp/http__10.244.0.5/8080 {
		meta l4proto tcp dnat to 10.244.0.5:8080
	}
	chain service-ULMVA6XW-default/web/tcp/http {
		numgen random mod 1 vmap { 0 : goto endpoint-5OJB2KTY-default/web/tcp/http__10.244.0.5/8080 }
	}
	chain services {
		ip daddr . meta l4proto . th dport vmap @service-ips
	}
	chain nat-prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		jump services
	}
	chain nat-output {
		type nat hook output priority -100; policy accept;
		jump services
	}
}
`

// TestMigrationLosesNoRequest runs the migration guide's steps in order on
// one node while a client keeps opening connections to a cluster IP:
// kube-proxy stopped with its rules in the kernel (step 2), onehop's first
// sync (step 3), the Service's pod replaced while both rulesets are in
// the kernel (kube-proxy's no longer follow), `agent cleanup
// --kube-proxy-leftovers` (step 4). Every connection succeeds, before,
// during and after each step.
func TestMigrationLosesNoRequest(t *testing.T) {
	for _, bin := range []string{"nft", "iptables-nft-restore"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("needs %s (Debian: nftables, iptables): %v", bin, err)
		}
	}
	ns := newTestNetns(t, "onehop-migrate")
	// A route for the cluster IP (output NAT runs after routing) and the
	// pods' addresses on loopback.
	for _, cmd := range [][]string{
		{"ip", "link", "set", "lo", "up"},
		{"ip", "link", "add", "va", "type", "veth", "peer", "name", "vb"},
		{"ip", "addr", "add", "192.0.2.1/24", "dev", "va"},
		{"ip", "link", "set", "va", "up"},
		{"ip", "link", "set", "vb", "up"},
		{"ip", "route", "add", "default", "via", "192.0.2.2", "dev", "va"},
		{"ip", "addr", "add", "10.244.0.5/32", "dev", "lo"},
		{"ip", "addr", "add", "10.244.0.6/32", "dev", "lo"},
	} {
		ns.exec(t, "", cmd...)
	}
	// Step 2: kube-proxy is gone, its rules (iptables and nftables) stay.
	ns.exec(t, kubeProxyRuleset, "iptables-nft-restore")
	ns.exec(t, kubeProxyServing, "nft", "-f", "-")
	oldPod := servePod(t, ns, "10.244.0.5:8080")

	loop := startRequestLoop(t, ns, "10.96.0.10:80")
	loop.wait(t, 50, "kube-proxy's leftover rules")

	// Step 3: onehop's first sync, as `agent run` programs it.
	key := portal.ServiceKey{Namespace: "default", Name: "web"}
	snapshot := func(ep string) *portal.Snapshot {
		svc := &portal.Service{Key: key, Portals: []*portal.Portal{{
			Key:              portal.PortKey{Service: key, Port: "http", Protocol: portal.TCP, Family: portal.IPv4},
			Port:             80,
			ClusterIPs:       []netip.Addr{netip.MustParseAddr("10.96.0.10")},
			ClusterEndpoints: []netip.AddrPort{netip.MustParseAddrPort(ep)},
		}}}
		return &portal.Snapshot{Node: portal.Node{Name: "node"}, Services: map[portal.ServiceKey]*portal.Service{key: svc},
			Dirty: []portal.ServiceKey{key}}
	}
	dp := nft.New(dataplane.Config{}, nft.WithNetNS(int(ns.handle)))
	if _, err := dp.Sync(context.Background(), snapshot("10.244.0.5:8080"), true); err != nil {
		t.Fatalf("onehop's first sync: %v", err)
	}
	loop.wait(t, 50, "onehop's first sync")

	// The pod is replaced while kube-proxy's leftovers are still in the
	// kernel: the new pod serves, onehop follows, the old pod goes.
	servePod(t, ns, "10.244.0.6:8080")
	if _, err := dp.Sync(context.Background(), snapshot("10.244.0.6:8080"), false); err != nil {
		t.Fatalf("onehop's sync of the new pod: %v", err)
	}
	// The old pod goes once the connections it accepted are done, as a
	// terminating pod drains: new ones reach the new pod from now on.
	loop.wait(t, 20, "onehop followed the new pod")
	oldPod.Close()
	loop.wait(t, 50, "the pod replaced before kube-proxy's leftovers are removed")

	// Step 4.
	var stdout, stderr strings.Builder
	var cleanupErr error
	inNetns(t, ns, func() {
		cleanupErr = cleanupCmd(context.Background(), []string{"--kube-proxy-leftovers"}, &stdout, &stderr)
	})
	loop.wait(t, 50, "cleanup --kube-proxy-leftovers")
	total, failed, first := loop.stop()
	t.Logf("%d requests, %d failed; cleanup output:\n%s%s", total, failed, stdout.String(), stderr.String())
	if cleanupErr != nil {
		t.Fatalf("cleanup --kube-proxy-leftovers: %v", cleanupErr)
	}
	if failed > 0 {
		t.Errorf("%d requests failed, the first: %v", failed, first)
	}
	if !strings.Contains(stdout.String(), "nftables table ip kube-proxy") {
		t.Errorf("kube-proxy's table was not removed:\n%s", stdout.String())
	}
	if tables := ns.exec(t, "", "nft", "list", "tables"); !strings.Contains(tables, "table inet onehop") {
		t.Errorf("onehop's table is gone:\n%s", tables)
	}
}

// servePod listens on addr in ns and answers "ok" to every connection
// until the returned listener is closed (at the end of the test at the
// latest).
func servePod(t *testing.T, ns *testNetns, addr string) net.Listener {
	t.Helper()
	var ln net.Listener
	inNetns(t, ns, func() {
		var err error
		if ln, err = net.Listen("tcp", addr); err != nil {
			t.Errorf("listen: %v", err)
		}
	})
	if ln == nil {
		t.FailNow()
	}
	t.Cleanup(func() { ln.Close() })
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
	return ln
}

// requestLoop opens connections to one address, one after the other, from
// inside a namespace, and counts the answers.
type requestLoop struct {
	ok, failed atomic.Int64
	firstErr   atomic.Value
	done       chan struct{}
	wg         sync.WaitGroup
}

func startRequestLoop(t *testing.T, ns *testNetns, addr string) *requestLoop {
	l := &requestLoop{done: make(chan struct{})}
	l.wg.Go(func() {
		inNetns(t, ns, func() {
			for {
				select {
				case <-l.done:
					return
				default:
				}
				if err := requestOnce(addr); err != nil {
					l.failed.Add(1)
					l.firstErr.CompareAndSwap(nil, err.Error())
					continue
				}
				l.ok.Add(1)
			}
		})
	})
	t.Cleanup(func() { l.stop() })
	return l
}

// wait lets n more requests succeed (at most 30 s); it fails the test at
// once when a request failed, naming the step.
func (l *requestLoop) wait(t *testing.T, n int64, step string) {
	t.Helper()
	for target, deadline := l.ok.Load()+n, time.Now().Add(30*time.Second); l.ok.Load() < target; time.Sleep(time.Millisecond) {
		if l.failed.Load() > 0 {
			t.Fatalf("after %s: %d requests failed, the first: %v", step, l.failed.Load(), l.firstErr.Load())
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: only %d of %d requests answered in 30 s", step, n-(target-l.ok.Load()), n)
		}
	}
}

// stop ends the loop (once) and returns the number of requests, of failed
// ones, and the first failure.
func (l *requestLoop) stop() (total, failed int64, first any) {
	select {
	case <-l.done:
	default:
		close(l.done)
	}
	l.wg.Wait()
	return l.ok.Load() + l.failed.Load(), l.failed.Load(), l.firstErr.Load()
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
