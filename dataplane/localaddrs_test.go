package dataplane

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"testing"
	"time"
)

// The node's addresses are followed as they come and go: loopback, IPv6
// link-local and skipped links never count.
func TestWatchLocalAddrs(t *testing.T) {
	ns := newTestNS(t)
	ns.run(t, "ip", "link", "add", "va", "type", "veth", "peer", "name", "vb")
	ns.run(t, "ip", "addr", "add", "192.0.2.1/24", "dev", "va")
	ns.run(t, "ip", "addr", "add", "2001:db8::1/64", "dev", "va", "nodad")
	ns.run(t, "ip", "addr", "add", "198.51.100.1/24", "dev", "vb")
	ns.run(t, "ip", "link", "set", "lo", "up")
	ns.run(t, "ip", "link", "set", "va", "up")
	ns.run(t, "ip", "link", "set", "vb", "up")

	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan []netip.Addr, 100)
	stopped := make(chan error, 1)
	go func() {
		stopped <- WatchLocalAddrs(ctx, int(ns.handle), slog.New(slog.NewTextHandler(io.Discard, nil)), []string{"vb"},
			func(a []netip.Addr) { got <- a })
	}()
	defer func() {
		cancel()
		if err := <-stopped; err != nil {
			t.Errorf("watch: %v", err)
		}
	}()

	// waitFor fails the test when no report equal to want arrives; reports
	// on the way (other address events) are skipped.
	waitFor := func(want ...string) {
		t.Helper()
		var w []netip.Addr
		for _, s := range want {
			w = append(w, netip.MustParseAddr(s))
		}
		slices.SortFunc(w, netip.Addr.Compare)
		timeout := time.After(30 * time.Second)
		var last []netip.Addr
		for {
			select {
			case a := <-got:
				if slices.Equal(a, w) {
					return
				}
				last = a
			case <-timeout:
				t.Fatalf("addresses never became %v; last report %v", w, last)
			}
		}
	}
	waitFor("192.0.2.1", "2001:db8::1")
	ns.run(t, "ip", "addr", "add", "192.0.2.2/24", "dev", "va")
	waitFor("192.0.2.1", "192.0.2.2", "2001:db8::1")
	ns.run(t, "ip", "addr", "del", "2001:db8::1/64", "dev", "va")
	waitFor("192.0.2.1", "192.0.2.2")
}
