package netns

import (
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/onehop/onehop/test/nsutil"
)

// The wiring alone, without control plane or agent: pods reach pods on other
// nodes and the client reaches pods, all without address translation, and
// Close removes every namespace.
func TestTopologyRoutes(t *testing.T) {
	if err := nsutil.Available(); err != nil {
		t.Skipf("skipping: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	log := slog.New(slog.NewTextHandler(t.Output(), nil))
	c := &Cluster{ID: nsutil.RunID(), cfg: Config{Nodes: 2, PodsPerNode: 2, PodPrefix: "echo", Log: log}, log: log, Dir: t.TempDir()}
	closed := false
	t.Cleanup(func() {
		if !closed {
			c.Close()
		}
	})
	if err := c.buildTopology(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.startPods(); err != nil {
		t.Fatal(err)
	}
	pods := c.Pods()
	if len(pods) != 4 {
		t.Fatalf("%d pods, want 4", len(pods))
	}
	for _, from := range []struct{ name, netns, ip, ip6 string }{
		{"client", c.ClientNetns, ClientIP().String(), ClientIP6().String()},
		{pods[0].Name, pods[0].Netns, pods[0].IP, pods[0].IP6},
	} {
		for _, to := range pods {
			for _, pp := range []struct{ proto, to, from string }{
				{"tcp", to.IP, from.ip}, {"udp", to.IP, from.ip},
				{"tcp", to.IP6, from.ip6}, {"udp", to.IP6, from.ip6},
			} {
				proto := pp.proto
				addr := net.JoinHostPort(pp.to, strconv.Itoa(PortHTTP))
				// Routing is under test here, not latency: a first packet
				// that waits on neighbour discovery on a loaded machine
				// gets another try.
				var rep nsutil.Reply
				var err error
				for try := 0; try < 3; try++ {
					if rep, err = nsutil.Request(ctx, from.netns, proto, addr); err == nil {
						break
					}
				}
				if err != nil {
					t.Errorf("%s -> %s %s: %v", from.name, proto, addr, err)
					continue
				}
				if rep.Name != to.Name || rep.SourceIP() != pp.from || rep.Proto != proto {
					t.Errorf("%s -> %s %s: reply %+v", from.name, proto, addr, rep)
				}
			}
		}
	}
	// Nodes reach the control-plane address (where kube-apiserver listens).
	for _, ip := range []string{ControlPlaneIP().String(), ControlPlaneIP6().String()} {
		l, err := nsutil.Listen(c.ControlNS, "tcp", net.JoinHostPort(ip, "6443"))
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			if conn, err := l.Accept(); err == nil {
				conn.Close()
			}
		}()
		conn, err := nsutil.Dialer(c.Nodes[1].Netns)(ctx, "tcp", l.Addr().String())
		if err != nil {
			t.Fatalf("node -> control plane %s: %v", ip, err)
		}
		conn.Close()
		l.Close()
	}

	names := append([]string(nil), c.namespaces...)
	c.Close()
	closed = true
	for _, n := range names {
		if _, err := os.Stat(filepath.Join(nsutil.Dir, n)); !os.IsNotExist(err) {
			t.Errorf("netns %s still exists after Close", n)
		}
	}
}
