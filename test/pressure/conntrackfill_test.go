package pressure

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/ipv4"

	"github.com/onehop/onehop/test/nsutil"
)

// udpFlows fills a namespace's conntrack table with assured UDP flows over
// its loopback, so that the kernel has no room for a new connection: flow
// i runs from 127.a.b.c (a source chosen per datagram with IP_PKTINFO) to
// one socket on 127.0.0.1. The kernel may drop a flow early to make room
// unless it is assured, which a UDP flow becomes once a reply came back and
// a datagram followed more than two seconds after its first; then it lives
// for nf_conntrack_udp_timeout_stream (120 s by default).
type udpFlows struct {
	netns  string
	client *ipv4.PacketConn // 0.0.0.0: it may send from any 127/8 address
	cport  int
	server *net.UDPConn // 127.0.0.1
	made   int          // flows so far
}

func newUDPFlows(netns string) (*udpFlows, error) {
	c, err := nsutil.ListenPacket(netns, "udp4", "0.0.0.0:0")
	if err != nil {
		return nil, err
	}
	s, err := nsutil.ListenPacket(netns, "udp4", "127.0.0.1:0")
	if err != nil {
		c.Close()
		return nil, err
	}
	return &udpFlows{netns: netns, client: ipv4.NewPacketConn(c), cport: c.LocalAddr().(*net.UDPAddr).Port, server: s.(*net.UDPConn)}, nil
}

// flowSource is flow i's source address: 127.1.0.0 onwards.
func flowSource(i int) net.IP { return net.IPv4(127, byte(1+i>>16), byte(i>>8), byte(i)) }

// fill makes flows until the table holds nf_conntrack_max entries and
// returns how many it holds, the limit and the flows made.
func (f *udpFlows) fill(ctx context.Context) (count, limit int, err error) {
	for range 8 {
		if count, limit, err = conntrackCount(f.netns); err != nil || count >= limit || ctx.Err() != nil {
			return count, limit, err
		}
		if err := f.add(limit - count); err != nil {
			return count, limit, err
		}
	}
	return count, limit, fmt.Errorf("%d conntrack entries of %d after %d flows", count, limit, f.made)
}

// add makes n more flows, a batch at a time: each batch's first
// datagrams, replies and second datagrams must fit in the 30 s an
// unreplied flow lives.
func (f *udpFlows) add(n int) error {
	const batch = 1 << 16
	for n > 0 {
		k := min(n, batch)
		if err := f.addBatch(f.made, f.made+k); err != nil {
			return err
		}
		f.made += k
		n -= k
	}
	return nil
}

func (f *udpFlows) addBatch(from, to int) error {
	if err := f.send(from, to); err != nil {
		return fmt.Errorf("flows' first datagrams: %w", err)
	}
	// Two seconds from the last flow's first datagram, every flow of the
	// batch is old enough to be assured by its next one.
	assurable := time.Now().Add(2100 * time.Millisecond)
	for i := from; i < to; i++ {
		if _, err := f.server.WriteToUDP([]byte("r"), &net.UDPAddr{IP: flowSource(i), Port: f.cport}); err != nil {
			return fmt.Errorf("replies: %w", err)
		}
	}
	time.Sleep(time.Until(assurable))
	if err := f.send(from, to); err != nil {
		return fmt.Errorf("flows' second datagrams: %w", err)
	}
	return nil
}

// send sends one datagram of each flow from..to-1, with sendmmsg.
func (f *udpFlows) send(from, to int) error {
	const batch = 256
	payload := [][]byte{[]byte("f")}
	dst := f.server.LocalAddr()
	msgs := make([]ipv4.Message, 0, batch)
	for i := from; i < to; i++ {
		cm := ipv4.ControlMessage{Src: flowSource(i)}
		msgs = append(msgs, ipv4.Message{Buffers: payload, OOB: cm.Marshal(), Addr: dst})
		if len(msgs) < batch && i < to-1 {
			continue
		}
		for sent := 0; sent < len(msgs); {
			k, err := f.client.WriteBatch(msgs[sent:], 0)
			if err != nil {
				return err
			}
			sent += k
		}
		msgs = msgs[:0]
	}
	return nil
}

// release deletes the flows' conntrack entries: new connections fit again.
func (f *udpFlows) release(ctx context.Context) error {
	port := strconv.Itoa(f.server.LocalAddr().(*net.UDPAddr).Port)
	cmd := nsutil.Command(ctx, f.netns, "conntrack", "-D", "-p", "udp", "--orig-port-dst", port)
	var stderr strings.Builder
	cmd.Stderr = &stderr // the deleted entries go to stdout: discarded
	err := cmd.Run()
	if err != nil && !strings.Contains(stderr.String(), " 0 flow entries") { // none left is no error
		return fmt.Errorf("conntrack -D: %v: %s", err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

func (f *udpFlows) Close() {
	f.client.Close()
	f.server.Close()
}

// conntrackCount reads nf_conntrack_count (the namespace's own) and
// nf_conntrack_max (the host's: read-only in a namespace).
func conntrackCount(netns string) (count, limit int, err error) {
	err = nsutil.Do(netns, func() error {
		for _, x := range []struct {
			name string
			v    *int
		}{{"nf_conntrack_count", &count}, {"nf_conntrack_max", &limit}} {
			b, err := os.ReadFile("/proc/sys/net/netfilter/" + x.name)
			if err != nil {
				return err
			}
			if *x.v, err = strconv.Atoi(strings.TrimSpace(string(b))); err != nil {
				return err
			}
		}
		return nil
	})
	return count, limit, err
}
