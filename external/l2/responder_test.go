package l2

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ndp"

	"github.com/onehop/onehop/test/nsutil"
)

// TestMain doubles as a responder process: a test re-executes its own
// binary inside a namespace with OHL2_RESPOND set, so that the responder,
// and every socket it opens later, lives in that namespace (a namespace is
// per thread; the responder's goroutines are not).
func TestMain(m *testing.M) {
	if iface := os.Getenv("OHL2_RESPOND"); iface != "" {
		os.Exit(responderMain(iface, os.Getenv("OHL2_IPS")))
	}
	os.Exit(m.Run())
}

// responderMain answers for ips on iface until stdin closes or says
// "stop". Meanwhile "set ip,..." makes it answer for those, and
// "probe ip,..." probes for them and prints "probed ip=mac ...". A
// conflict is printed as "conflict ip mac" when it happens. With
// OHL2_ADDR_AFTER_OPEN set, that address is added to iface as soon as the
// responder's sockets are open.
func responderMain(iface, ips string) int {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	var opened func()
	if a := os.Getenv("OHL2_ADDR_AFTER_OPEN"); a != "" {
		opened = func() {
			if err := addAddr(iface, a); err != nil {
				log.Error("adding an address once the sockets are open", "addr", a, "err", err)
			}
		}
	}
	r, err := newResponder([]string{iface}, log, opened)
	if err != nil {
		fmt.Println("err", err)
		return 2
	}
	defer r.Close()
	var mu sync.Mutex // one line at a time on stdout
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Printf(format+"\n", args...)
	}
	r.OnConflict(func(ip netip.Addr, from net.HardwareAddr) { say("conflict %s %s", ip, from) })
	r.Set(parseAddrs(ips))
	say("ok")
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		cmd, arg, _ := strings.Cut(sc.Text(), " ")
		switch cmd {
		case "set":
			r.Set(parseAddrs(arg))
			say("ok")
		case "probe":
			var out []string
			for ip, mac := range r.Probe(parseAddrs(arg), 500*time.Millisecond) {
				out = append(out, ip.String()+"="+mac.String())
			}
			slices.Sort(out)
			say("probed %s", strings.Join(out, " "))
		case "stop":
			return 0
		}
	}
	return 0
}

func parseAddrs(s string) []netip.Addr {
	var out []netip.Addr
	for _, a := range strings.Split(s, ",") {
		if a != "" {
			out = append(out, netip.MustParseAddr(a))
		}
	}
	return out
}

const (
	vip4 = "203.0.113.9"
	vip6 = "2001:db8:9::9"
)

// TestResponderFollowsRecreatedInterface: the interface the responder
// answers on is deleted and created again under its name (a new index and
// MAC address, its addresses added after it appears, as when a bond or
// VLAN is rebuilt); ARP and NDP requests from a neighbour are answered
// again, with the new MAC address.
func TestResponderFollowsRecreatedInterface(t *testing.T) {
	node, peer := nsutil.New(t, "l2n-"), nsutil.New(t, "l2p-")
	wire := func() {
		nsutil.Veth(t, node, "eth0", []string{"10.77.0.1/24", "fd00:77::1/64"}, peer, "eth0", []string{"10.77.0.2/24", "fd00:77::2/64"})
	}
	wire()
	startResponder(t, node, vip4+","+vip6)

	answered := func(what string) {
		t.Helper()
		want := macOf(t, node, "eth0")
		var got4, got6 string
		var err4, err6 error
		deadline := time.Now().Add(15 * time.Second)
		for time.Now().Before(deadline) {
			got4, err4 = askARP(peer, vip4)
			got6, err6 = askNDP(peer, vip6)
			if got4 == want && got6 == want {
				return
			}
			time.Sleep(200 * time.Millisecond)
		}
		t.Fatalf("%s: ARP for %s answered by %q (%v), NDP for %s by %q (%v); want %s", what, vip4, got4, err4, vip6, got6, err6, want)
	}
	answered("at start")
	before := macOf(t, node, "eth0")

	node.IP(t, "link", "del", "eth0") // takes the peer's end with it
	wire()
	if macOf(t, node, "eth0") == before {
		t.Fatal("the new veth has the old MAC address: the test could not tell the interfaces apart")
	}
	answered("after the interface was recreated")
}

// responderProc is a responder (responderMain) running in a namespace.
type responderProc struct {
	t     *testing.T
	stdin io.WriteCloser
	// replies are its answers to commands, conflicts the conflicts it
	// reported ("ip mac").
	replies, conflicts chan string
}

// startResponder runs a responder answering for ips on eth0 of n until
// the test ends, with env added to its environment.
func startResponder(t *testing.T, n *nsutil.NS, ips string, env ...string) *responderProc {
	t.Helper()
	cmd := n.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), "OHL2_RESPOND=eth0", "OHL2_IPS="+ips), env...)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &responderProc{t: t, stdin: stdin, replies: make(chan string, 16), conflicts: make(chan string, 64)}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if c, ok := strings.CutPrefix(sc.Text(), "conflict "); ok {
				select {
				case p.conflicts <- c:
				default:
				}
				continue
			}
			p.replies <- sc.Text()
		}
		close(p.replies)
	}()
	t.Cleanup(func() {
		_ = stdin.Close()
		done := make(chan error)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("responder: %v", err) // the race detector's exit status, say
			}
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-done
			t.Error("the responder did not stop when asked")
		}
		if t.Failed() {
			t.Logf("responder log:\n%s", stderr.String())
		}
	})
	if line := p.reply(); line != "ok" {
		t.Fatalf("responder: %q\n%s", line, stderr.String())
	}
	return p
}

// reply is the responder's next answer ("" once it has ended).
func (p *responderProc) reply() string {
	select {
	case l := <-p.replies:
		return l
	case <-time.After(10 * time.Second):
		p.t.Fatal("the responder did not answer")
		return ""
	}
}

// do sends cmd and returns the answer.
func (p *responderProc) do(cmd string) string {
	p.t.Helper()
	if _, err := io.WriteString(p.stdin, cmd+"\n"); err != nil {
		p.t.Fatal(err)
	}
	return p.reply()
}

// TestResponderProbeAndConflict: two responders on one link. One answers
// for an IPv4 and an IPv6 address; the other's probe for both (and for
// an address nobody answers for) hears it, with its link-layer address.
// When the second takes both addresses too, its announcements reach the
// first as conflicts, naming the second's link-layer address.
func TestResponderProbeAndConflict(t *testing.T) {
	a, b := nsutil.New(t, "l2a-"), nsutil.New(t, "l2b-")
	nsutil.Veth(t, a, "eth0", []string{"10.77.0.1/24", "fd00:77::1/64"}, b, "eth0", []string{"10.77.0.2/24", "fd00:77::2/64"})
	ra, rb := startResponder(t, a, vip4+","+vip6), startResponder(t, b, "")
	macA, macB := macOf(t, a, "eth0"), macOf(t, b, "eth0")

	want := []string{vip4 + "=" + macA, vip6 + "=" + macA}
	slices.Sort(want)
	var got string
	deadline := time.Now().Add(15 * time.Second) // a's IPv6 group joined, its addresses usable
	for time.Now().Before(deadline) {
		if got = rb.do("probe " + vip4 + "," + vip6 + ",203.0.113.77"); got == "probed "+strings.Join(want, " ") {
			break
		}
	}
	if got != "probed "+strings.Join(want, " ") {
		t.Fatalf("b's probe: %q, want %q", got, "probed "+strings.Join(want, " "))
	}

	if got := rb.do("set " + vip4 + "," + vip6); got != "ok" {
		t.Fatalf("b set: %q", got)
	}
	seen := map[string]bool{}
	for want := []string{vip4 + " " + macB, vip6 + " " + macB}; !seen[want[0]] || !seen[want[1]]; {
		select {
		case c := <-ra.conflicts:
			seen[c] = true
		case <-time.After(10 * time.Second):
			t.Fatalf("a reported the conflicts %v, want %v", seen, want)
		}
	}
}

func macOf(t *testing.T, n *nsutil.NS, iface string) string {
	t.Helper()
	var mac string
	err := n.Do(func() error {
		ifi, err := net.InterfaceByName(iface)
		if err == nil {
			mac = ifi.HardwareAddr.String()
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return mac
}

// askARP asks, from n's eth0, who has ip, and returns the MAC address of
// the answer.
func askARP(n *nsutil.NS, ip string) (string, error) {
	var c *arp.Client
	err := n.Do(func() error {
		ifi, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		c, err = arp.Dial(ifi)
		return err
	})
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(500 * time.Millisecond))
	mac, err := c.Resolve(netip.MustParseAddr(ip))
	if err != nil {
		return "", err
	}
	return mac.String(), nil
}

// askNDP sends, from n's eth0, a neighbour solicitation for ip, and
// returns the target MAC address of the advertisement that answers it. It
// runs inside n throughout: the interface zone of each address is
// resolved by name.
func askNDP(n *nsutil.NS, ip string) (mac string, err error) {
	err = n.Do(func() error {
		ifi, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		byIndex := *ifi // Go's cache of interface names would name the deleted one
		byIndex.Name = strconv.Itoa(ifi.Index)
		c, _, err := ndp.Listen(&byIndex, ndp.LinkLocal)
		if err != nil {
			return err
		}
		defer c.Close()
		target := netip.MustParseAddr(ip)
		group, err := ndp.SolicitedNodeMulticast(target)
		if err != nil {
			return err
		}
		ns := &ndp.NeighborSolicitation{TargetAddress: target,
			Options: []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Source, Addr: ifi.HardwareAddr}}}
		if err := c.WriteTo(ns, nil, group); err != nil {
			return err
		}
		_ = c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		for {
			m, _, _, err := c.ReadFrom()
			if err != nil {
				return err
			}
			na, ok := m.(*ndp.NeighborAdvertisement)
			if !ok || na.TargetAddress != target {
				continue
			}
			for _, o := range na.Options {
				if lla, ok := o.(*ndp.LinkLayerAddress); ok && lla.Direction == ndp.Target {
					mac = lla.Addr.String()
					return nil
				}
			}
			return errors.New("an advertisement without a target link-layer address")
		}
	})
	return mac, err
}
