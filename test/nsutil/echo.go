package nsutil

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"
)

// An echo server answers each TCP or SCTP line and each UDP datagram with
// one JSON line (a Reply) naming itself and the source address it saw, so a
// test can tell which endpoint served it and whether the client's address
// survived the path.

// Reply is what an echo server sends back for every request.
type Reply struct {
	Name   string `json:"pod"`    // the server's (pod's) name
	Source string `json:"source"` // remote ip:port as the server saw it
	Proto  string `json:"proto"`  // "tcp", "udp" or "sctp"
	Port   int    `json:"port"`   // the port the server received on
	Echo   string `json:"echo"`   // the request line
}

// SourceIP returns the IP part of Source.
func (r Reply) SourceIP() string {
	host, _, err := net.SplitHostPort(r.Source)
	if err != nil {
		return r.Source
	}
	return host
}

// EchoTimeout bounds one request when the caller's context has no sooner
// deadline: long enough for a loaded 2-core machine, short enough for
// polling loops.
const EchoTimeout = 2 * time.Second

// EchoServer is one echo server: listeners on some TCP and UDP addresses.
type EchoServer struct {
	Name string

	log     *slog.Logger
	mu      sync.Mutex
	closers []func() error
	conns   map[net.Conn]struct{}
	wg      sync.WaitGroup
}

// ServeEcho starts an echo server named name in the named namespace,
// listening on every address on the given TCP and UDP ports. A nil log
// discards the server's warnings.
func ServeEcho(netns, name string, tcpPorts, udpPorts []int, log *slog.Logger) (*EchoServer, error) {
	addrs := func(ports []int) []string {
		var out []string
		for _, p := range ports {
			out = append(out, ":"+strconv.Itoa(p))
		}
		return out
	}
	return serveEcho(byName(netns), name, addrs(tcpPorts), addrs(udpPorts), log)
}

// Echo runs an echo server named name on addr (host:port), TCP and UDP,
// inside n until the test ends.
func (n *NS) Echo(t testing.TB, name, addr string) {
	t.Helper()
	s, err := serveEcho(n.Do, name, []string{addr}, []string{addr}, nil)
	if err != nil {
		t.Fatalf("echo %s in %s: %v", addr, n.Name, err)
	}
	t.Cleanup(s.Close)
}

func serveEcho(in inside, name string, tcpAddrs, udpAddrs []string, log *slog.Logger) (*EchoServer, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &EchoServer{Name: name, log: log, conns: map[net.Conn]struct{}{}}
	for _, a := range tcpAddrs {
		l, err := in.listen("tcp", a)
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("echo %s tcp %s: %w", name, a, err)
		}
		s.serveListener(l, "tcp")
	}
	for _, a := range udpAddrs {
		c, err := in.listenPacket("udp", a)
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("echo %s udp %s: %w", name, a, err)
		}
		s.closers = append(s.closers, c.Close)
		s.wg.Add(1)
		go s.packetLoop(c)
	}
	return s, nil
}

// serveListener answers the connections l accepts until Close.
func (s *EchoServer) serveListener(l net.Listener, proto string) {
	s.closers = append(s.closers, l.Close)
	s.wg.Add(1)
	go s.acceptLoop(l, proto)
}

func (s *EchoServer) acceptLoop(l net.Listener, proto string) {
	defer s.wg.Done()
	for {
		c, err := l.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				s.log.Warn("echo accept", "server", s.Name, "err", err)
			}
			return
		}
		s.mu.Lock()
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		go s.serveConn(c, proto)
	}
}

func portOf(a net.Addr) int {
	_, p, _ := net.SplitHostPort(a.String())
	n, _ := strconv.Atoi(p)
	return n
}

func (s *EchoServer) serveConn(c net.Conn, proto string) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
	}()
	sc := bufio.NewScanner(c)
	for sc.Scan() {
		b, _ := json.Marshal(Reply{Name: s.Name, Source: c.RemoteAddr().String(), Proto: proto, Port: portOf(c.LocalAddr()), Echo: sc.Text()})
		if _, err := c.Write(append(b, '\n')); err != nil {
			return
		}
	}
}

func (s *EchoServer) packetLoop(c net.PacketConn) {
	defer s.wg.Done()
	port := portOf(c.LocalAddr())
	buf := make([]byte, 64<<10)
	for {
		n, from, err := c.ReadFrom(buf)
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				s.log.Warn("echo udp read", "server", s.Name, "err", err)
			}
			return
		}
		b, _ := json.Marshal(Reply{Name: s.Name, Source: from.String(), Proto: "udp", Port: port, Echo: string(trimNL(buf[:n]))})
		if _, err := c.WriteTo(append(b, '\n'), from); err != nil {
			s.log.Warn("echo udp write", "server", s.Name, "err", err)
		}
	}
}

func trimNL(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == '\r') {
		b = b[:len(b)-1]
	}
	return b
}

// Close stops the listeners, drops open connections and waits for the
// server's goroutines.
func (s *EchoServer) Close() {
	for _, c := range s.closers {
		_ = c()
	}
	s.mu.Lock()
	for c := range s.conns {
		_ = c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// Request opens a fresh connection (TCP) or socket (UDP) from inside the
// named namespace to addr, sends one line and returns the reply. A new
// source port per call means a new conntrack entry, hence a fresh
// load-balancing decision.
func Request(ctx context.Context, netns, proto, addr string) (Reply, error) {
	ctx, cancel := context.WithTimeout(ctx, EchoTimeout)
	defer cancel()
	c, err := Dialer(netns)(ctx, proto, addr)
	if err != nil {
		return Reply{}, err
	}
	defer c.Close()
	return exchange(ctx, c, bufio.NewReader(c), "hello")
}

// Ask sends one request from n to an echo server over network (tcp or udp)
// on a fresh connection and returns its reply.
func (n *NS) Ask(network, addr string, timeout time.Duration) (Reply, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	c, err := n.Dial(ctx, network, addr)
	if err != nil {
		return Reply{}, err
	}
	defer c.Close()
	return exchange(ctx, c, bufio.NewReader(c), "hello")
}

// AskOn sends one request on an open connection and reads the reply.
func AskOn(c net.Conn, timeout time.Duration) (Reply, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return exchange(ctx, c, bufio.NewReader(c), "hello")
}

func exchange(ctx context.Context, c net.Conn, r *bufio.Reader, line string) (Reply, error) {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(EchoTimeout)
	}
	_ = c.SetDeadline(deadline)
	if _, err := c.Write([]byte(line + "\n")); err != nil {
		return Reply{}, err
	}
	b, err := r.ReadBytes('\n')
	if err != nil {
		return Reply{}, fmt.Errorf("%s %s: read reply: %w", c.LocalAddr().Network(), c.RemoteAddr(), err)
	}
	var rep Reply
	if err := json.Unmarshal(b, &rep); err != nil {
		return Reply{}, fmt.Errorf("bad reply %q: %w", b, err)
	}
	if rep.Echo != line {
		return rep, fmt.Errorf("reply echoes %q, sent %q", rep.Echo, line)
	}
	return rep, nil
}

// EchoConn is a long-lived TCP connection to an echo server, for
// established-connection checks.
type EchoConn struct {
	c net.Conn
	r *bufio.Reader
	n int
}

// DialEcho opens a TCP connection from inside the named namespace to addr.
func DialEcho(ctx context.Context, netns, addr string) (*EchoConn, error) {
	ctx, cancel := context.WithTimeout(ctx, EchoTimeout)
	defer cancel()
	c, err := Dialer(netns)(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return &EchoConn{c: c, r: bufio.NewReader(c)}, nil
}

// Ask sends one line over the open connection and returns the reply.
func (c *EchoConn) Ask(ctx context.Context) (Reply, error) {
	ctx, cancel := context.WithTimeout(ctx, EchoTimeout)
	defer cancel()
	c.n++
	return exchange(ctx, c.c, c.r, fmt.Sprintf("ping %d", c.n))
}

// LocalAddr is the client side of the connection.
func (c *EchoConn) LocalAddr() net.Addr { return c.c.LocalAddr() }

// Close closes the connection.
func (c *EchoConn) Close() error { return c.c.Close() }
