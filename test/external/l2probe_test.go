package external

import (
	"errors"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ndp"
)

// probeEvery is how often an l2Prober asks who answers for an address.
const probeEvery = 50 * time.Millisecond

// l2Prober asks, from one namespace, who answers for some addresses, as a
// router on the segment would: every probeEvery it broadcasts one ARP
// request (IPv4) or multicasts one neighbour solicitation (IPv6) per
// address, and records the link-layer addresses of the answers that came
// back before the next round. Two of them for one request is the fault
// the L2 provider must never show for longer than a handover.
type l2Prober struct {
	t   *testing.T
	arp *arp.Client
	ndp *ndp.Conn
	mac net.HardwareAddr
	ips []netip.Addr

	mu sync.Mutex
	// open are the answers to each address's request in flight.
	open    map[netip.Addr]map[string]bool
	answers []l2Answers
	// announced are the gratuitous announcements heard; probes the ARP
	// probes (RFC 5227, from 0.0.0.0) heard, as form "probe".
	announced []l2Announcement
	probes    []l2Announcement
	done      chan struct{}
	wg        sync.WaitGroup
}

// l2Answers is one request and the link-layer addresses that answered it,
// sorted (none: nobody answered).
type l2Answers struct {
	at   time.Time
	ip   netip.Addr
	macs []string
}

// l2Announcement is one gratuitous announcement heard: an ARP request or
// reply whose sender and target are the IP, or an unsolicited neighbour
// advertisement.
type l2Announcement struct {
	at   time.Time
	ip   netip.Addr
	mac  string
	form string // "request", "reply", "na"
}

func (a l2Answers) String() string {
	return a.at.Format("15:04:05.000") + " " + a.ip.String() + " [" + strings.Join(a.macs, " ") + "]"
}

// startL2Prober probes ips from iface of namespace n until the test ends.
func (tp *topo) startL2Prober(n, iface string, ips ...string) *l2Prober {
	t := tp.t
	t.Helper()
	p := &l2Prober{t: t, open: map[netip.Addr]map[string]bool{}, done: make(chan struct{})}
	for _, s := range ips {
		p.ips = append(p.ips, netip.MustParseAddr(s))
	}
	// Sockets opened inside the namespace stay there.
	if err := tp.at(n).Do(func() error {
		ifi, err := net.InterfaceByName(iface)
		if err != nil {
			return err
		}
		p.mac = ifi.HardwareAddr
		if p.arp, err = arp.Dial(ifi); err != nil {
			return err
		}
		// The NDP socket's zone is the interface's index: its name means
		// nothing outside the namespace, where the probes are sent from.
		byIndex := *ifi
		byIndex.Name = strconv.Itoa(ifi.Index)
		p.ndp, _, err = ndp.Listen(&byIndex, ndp.LinkLocal)
		return err
	}); err != nil {
		t.Fatalf("prober in %s: %v", n, err)
	}
	p.wg.Add(3)
	go p.readARP()
	go p.readNDP()
	go p.run()
	t.Cleanup(p.stop)
	return p
}

func (p *l2Prober) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	close(p.done)
	_ = p.arp.SetReadDeadline(time.Now())
	_ = p.ndp.SetReadDeadline(time.Now())
	p.wg.Wait()
	_ = p.arp.Close()
	_ = p.ndp.Close()
}

// heard notes mac answering for ip, if a request for ip is in flight.
func (p *l2Prober) heard(ip netip.Addr, mac net.HardwareAddr) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if m := p.open[ip.Unmap()]; m != nil {
		m[mac.String()] = true
	}
}

// announcement notes a gratuitous announcement of ip by mac.
func (p *l2Prober) announcement(ip netip.Addr, mac net.HardwareAddr, form string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.announced = append(p.announced, l2Announcement{at: time.Now(), ip: ip.Unmap(), mac: mac.String(), form: form})
}

// announcements counts, per form, the gratuitous announcements of ip by
// mac heard since t0.
func (p *l2Prober) announcements(ip, mac string, t0 time.Time) map[string]int {
	a := netip.MustParseAddr(ip)
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]int{}
	for _, g := range p.announced {
		if g.ip == a && g.mac == mac && !g.at.Before(t0) {
			out[g.form]++
		}
	}
	return out
}

// firstAnnouncement is when the client first heard mac announce ip at
// or after t0.
func (p *l2Prober) firstAnnouncement(ip, mac string, t0 time.Time) (time.Time, bool) {
	a := netip.MustParseAddr(ip)
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, g := range p.announced {
		if g.ip == a && g.mac == mac && !g.at.Before(t0) {
			return g.at, true
		}
	}
	return time.Time{}, false
}

func (p *l2Prober) readARP() {
	defer p.wg.Done()
	for {
		a, _, err := p.arp.Read()
		if err != nil {
			if p.closing() || errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		if slices.Equal(a.SenderHardwareAddr, p.mac) {
			continue
		}
		if a.SenderIP == a.TargetIP {
			p.announcement(a.SenderIP, a.SenderHardwareAddr, map[arp.Operation]string{arp.OperationRequest: "request", arp.OperationReply: "reply"}[a.Operation])
		} else if a.Operation == arp.OperationReply {
			p.heard(a.SenderIP, a.SenderHardwareAddr)
		} else if a.SenderIP.IsUnspecified() {
			p.mu.Lock()
			p.probes = append(p.probes, l2Announcement{at: time.Now(), ip: a.TargetIP.Unmap(), mac: a.SenderHardwareAddr.String(), form: "probe"})
			p.mu.Unlock()
		}
	}
}

func (p *l2Prober) readNDP() {
	defer p.wg.Done()
	for {
		m, _, _, err := p.ndp.ReadFrom()
		if err != nil {
			if p.closing() || errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		na, ok := m.(*ndp.NeighborAdvertisement)
		if !ok {
			continue
		}
		for _, o := range na.Options {
			if lla, ok := o.(*ndp.LinkLayerAddress); ok && lla.Direction == ndp.Target {
				if na.Solicited {
					p.heard(na.TargetAddress, lla.Addr)
				} else {
					p.announcement(na.TargetAddress, lla.Addr, "na")
				}
			}
		}
	}
}

func (p *l2Prober) closing() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// run sends a round of requests every probeEvery and closes the last
// round's answers just before the next.
func (p *l2Prober) run() {
	defer p.wg.Done()
	tick := time.NewTicker(probeEvery)
	defer tick.Stop()
	for {
		at := time.Now()
		p.mu.Lock()
		for _, ip := range p.ips {
			p.open[ip] = map[string]bool{}
		}
		p.mu.Unlock()
		for _, ip := range p.ips {
			p.ask(ip)
		}
		select {
		case <-p.done:
			return
		case <-tick.C:
		}
		p.mu.Lock()
		for _, ip := range p.ips {
			var macs []string
			for m := range p.open[ip] {
				macs = append(macs, m)
			}
			slices.Sort(macs)
			p.answers = append(p.answers, l2Answers{at: at, ip: ip, macs: macs})
			p.open[ip] = nil
		}
		p.mu.Unlock()
	}
}

func (p *l2Prober) ask(ip netip.Addr) {
	var err error
	if ip.Is4() {
		err = p.arp.Request(ip)
	} else {
		var snm netip.Addr
		if snm, err = ndp.SolicitedNodeMulticast(ip); err == nil {
			ns := &ndp.NeighborSolicitation{TargetAddress: ip,
				Options: []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Source, Addr: p.mac}}}
			err = p.ndp.WriteTo(ns, nil, snm)
		}
	}
	if err != nil && !p.closing() {
		p.t.Logf("probe for %s: %v", ip, err)
	}
}

// since returns the rounds for ip that began at or after t0.
func (p *l2Prober) since(ip string, t0 time.Time) []l2Answers {
	a := netip.MustParseAddr(ip)
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []l2Answers
	for _, r := range p.answers {
		if r.ip == a && !r.at.Before(t0) {
			out = append(out, r)
		}
	}
	return out
}

// waitAnswers waits until the last few rounds for ip since t0 all got
// exactly the answers macs (sorted), and returns the first of those
// rounds; ok false at timeout.
func (p *l2Prober) waitAnswers(ip string, t0 time.Time, timeout time.Duration, macs ...string) (first time.Time, ok bool) {
	const rounds = 3
	slices.Sort(macs)
	_, ok = waitFor(p.t.Context(), timeout, func() bool {
		rs := p.since(ip, t0)
		if len(rs) < rounds {
			return false
		}
		for _, r := range rs[len(rs)-rounds:] {
			if !slices.Equal(r.macs, macs) {
				return false
			}
		}
		first = rs[len(rs)-rounds].at
		return true
	})
	return first, ok
}

// waitAnswerFrom waits until a round for ip since t0 got an answer from
// mac, and returns it.
func (p *l2Prober) waitAnswerFrom(ip string, t0 time.Time, timeout time.Duration, mac string) (l2Answers, bool) {
	var got l2Answers
	_, ok := waitFor(p.t.Context(), timeout, func() bool {
		for _, r := range p.since(ip, t0) {
			if slices.Contains(r.macs, mac) {
				got = r
				return true
			}
		}
		return false
	})
	return got, ok
}

// doubles are the rounds for ip in [from, to) that two or more link-layer
// addresses answered.
func (p *l2Prober) doubles(ip string, from, to time.Time) []l2Answers {
	var out []l2Answers
	for _, r := range p.since(ip, from) {
		if r.at.Before(to) && len(r.macs) > 1 {
			out = append(out, r)
		}
	}
	return out
}

// tail is the last n rounds for ip, for a failure's message.
func (p *l2Prober) tail(ip string, n int) []l2Answers {
	rs := p.since(ip, time.Time{})
	return rs[max(0, len(rs)-n):]
}
