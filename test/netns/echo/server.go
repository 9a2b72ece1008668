package echo

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"

	"github.com/onehop/onehop/test/nsutil"
)

// Reply is what a server sends back for every request.
type Reply struct {
	Pod    string `json:"pod"`    // the pod's name
	Source string `json:"source"` // remote ip:port as the pod saw it
	Proto  string `json:"proto"`  // "tcp" or "udp"
	Port   int    `json:"port"`   // the port the pod received on
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

// Server is one pod's echo server: listeners on some TCP and UDP ports.
type Server struct {
	Name string

	log     *slog.Logger
	mu      sync.Mutex
	closers []func() error
	conns   map[net.Conn]struct{}
	wg      sync.WaitGroup
}

// Serve starts an echo server named name in network namespace netns,
// listening on every address on the given TCP and UDP ports.
func Serve(netns, name string, tcpPorts, udpPorts []int, log *slog.Logger) (*Server, error) {
	s := &Server{Name: name, log: log, conns: map[net.Conn]struct{}{}}
	for _, p := range tcpPorts {
		l, err := nsutil.Listen(netns, "tcp", ":"+strconv.Itoa(p))
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("echo %s tcp/%d: %w", name, p, err)
		}
		s.closers = append(s.closers, l.Close)
		s.wg.Add(1)
		go s.acceptLoop(l, p)
	}
	for _, p := range udpPorts {
		c, err := nsutil.ListenPacket(netns, "udp", ":"+strconv.Itoa(p))
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("echo %s udp/%d: %w", name, p, err)
		}
		s.closers = append(s.closers, c.Close)
		s.wg.Add(1)
		go s.packetLoop(c, p)
	}
	return s, nil
}

func (s *Server) acceptLoop(l net.Listener, port int) {
	defer s.wg.Done()
	for {
		c, err := l.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				s.log.Warn("echo accept", "pod", s.Name, "err", err)
			}
			return
		}
		s.mu.Lock()
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		go s.serveConn(c, port)
	}
}

func (s *Server) serveConn(c net.Conn, port int) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
	}()
	sc := bufio.NewScanner(c)
	for sc.Scan() {
		b, _ := json.Marshal(Reply{Pod: s.Name, Source: c.RemoteAddr().String(), Proto: "tcp", Port: port, Echo: sc.Text()})
		if _, err := c.Write(append(b, '\n')); err != nil {
			return
		}
	}
}

func (s *Server) packetLoop(c net.PacketConn, port int) {
	defer s.wg.Done()
	buf := make([]byte, 64<<10)
	for {
		n, from, err := c.ReadFrom(buf)
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				s.log.Warn("echo udp read", "pod", s.Name, "err", err)
			}
			return
		}
		b, _ := json.Marshal(Reply{Pod: s.Name, Source: from.String(), Proto: "udp", Port: port, Echo: string(trimNL(buf[:n]))})
		if _, err := c.WriteTo(append(b, '\n'), from); err != nil {
			s.log.Warn("echo udp write", "pod", s.Name, "err", err)
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
func (s *Server) Close() {
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
