package heartbeat

import (
	"errors"
	"math/rand/v2"
	"net"
	"net/netip"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
)

// echoer sends ICMP echo requests to the nodes of held peers and reports
// the replies: whether a node's kernel is still up while its agent
// restarts. Its raw socket (CAP_NET_RAW, which the L2 responder needs
// too) is open only while some peer is held, since it sees every ICMP
// message the node receives.
type echoer struct {
	conn *icmp.PacketConn
	// request is the echo request's type, of the socket's family.
	request icmp.Type
	id      int
	seq     int
	reply   func(from netip.Addr, at time.Time)
	done    chan struct{}
}

// openEcho opens an echoer on bind's family, from bind; reply is called
// (from its goroutine) with the source of each echo reply of its own.
func openEcho(bind netip.Addr, reply func(netip.Addr, time.Time)) (*echoer, error) {
	network, request := "ip4:icmp", icmp.Type(ipv4.ICMPTypeEcho)
	if !bind.Unmap().Is4() {
		network, request = "ip6:ipv6-icmp", ipv6.ICMPTypeEchoRequest
	}
	conn, err := icmp.ListenPacket(network, bind.Unmap().String())
	if err != nil {
		return nil, err
	}
	e := &echoer{conn: conn, request: request, id: rand.IntN(1 << 16), reply: reply, done: make(chan struct{})}
	go e.receive()
	return e, nil
}

// send sends one echo request to each address.
func (e *echoer) send(to []netip.Addr) {
	e.seq = (e.seq + 1) & 0xffff
	b, err := (&icmp.Message{Type: e.request, Body: &icmp.Echo{ID: e.id, Seq: e.seq, Data: []byte("onehop-l2")}}).Marshal(nil)
	if err != nil {
		return
	}
	for _, a := range to {
		_, _ = e.conn.WriteTo(b, &net.IPAddr{IP: a.AsSlice()})
	}
}

func (e *echoer) receive() {
	defer close(e.done)
	proto := e.request.Protocol()
	buf := make([]byte, 1500)
	for {
		n, from, err := e.conn.ReadFrom(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		m, err := icmp.ParseMessage(proto, buf[:n])
		if err != nil || m.Type != ipv4.ICMPTypeEchoReply && m.Type != ipv6.ICMPTypeEchoReply {
			continue
		}
		echo, ok := m.Body.(*icmp.Echo)
		ip, ok2 := from.(*net.IPAddr)
		if !ok || !ok2 || echo.ID != e.id {
			continue
		}
		if a, ok := netip.AddrFromSlice(ip.IP); ok {
			e.reply(a.Unmap(), time.Now())
		}
	}
}

// close closes the socket and waits for its reader.
func (e *echoer) close() {
	_ = e.conn.Close()
	<-e.done
}
