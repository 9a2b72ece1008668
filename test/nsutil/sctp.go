package nsutil

import (
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// ErrNoSCTP is returned when the kernel has no SCTP.
var ErrNoSCTP = errors.New("the kernel has no SCTP support")

// sctpSocket opens a one-to-one (SOCK_STREAM) SCTP socket. The Go standard
// library has no SCTP; one-to-one sockets work with plain connect, accept,
// read and write, and net.FileConn and net.FileListener wrap them.
func sctpSocket(v6 bool) (int, error) {
	af := unix.AF_INET
	if v6 {
		af = unix.AF_INET6
	}
	fd, err := unix.Socket(af, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_SCTP)
	if errors.Is(err, unix.EPROTONOSUPPORT) || errors.Is(err, unix.ESOCKTNOSUPPORT) {
		return -1, ErrNoSCTP
	}
	return fd, err
}

func sockaddr(ap netip.AddrPort) unix.Sockaddr {
	if ap.Addr().Is4() {
		return &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}
	}
	return &unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()}
}

// EchoSCTP runs an echo server named name on SCTP port (IPv4, any address)
// inside n until the test ends. It returns ErrNoSCTP when the kernel lacks
// SCTP.
func (n *NS) EchoSCTP(t testing.TB, name string, port uint16) error {
	t.Helper()
	var l net.Listener
	err := n.Do(func() error {
		fd, err := sctpSocket(false)
		if err != nil {
			return err
		}
		f := os.NewFile(uintptr(fd), "sctp-listener")
		defer f.Close() // FileListener holds its own copy
		if err := unix.Bind(fd, &unix.SockaddrInet4{Port: int(port)}); err != nil {
			return err
		}
		if err := unix.Listen(fd, 16); err != nil {
			return err
		}
		l, err = net.FileListener(f)
		return err
	})
	if err != nil {
		return err
	}
	s := &EchoServer{Name: name, log: slog.New(slog.DiscardHandler), conns: map[net.Conn]struct{}{}}
	s.serveListener(l, "sctp")
	t.Cleanup(s.Close)
	return nil
}

// AskSCTP sends one request over SCTP from inside n.
func (n *NS) AskSCTP(addr netip.AddrPort, timeout time.Duration) (Reply, error) {
	var c net.Conn
	err := n.Do(func() error {
		fd, err := sctpSocket(addr.Addr().Is6())
		if err != nil {
			return err
		}
		tv := unix.NsecToTimeval(timeout.Nanoseconds())
		_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv)
		if err := connect(fd, sockaddr(addr), timeout); err != nil {
			unix.Close(fd)
			return err
		}
		f := os.NewFile(uintptr(fd), "sctp")
		defer f.Close()
		c, err = net.FileConn(f)
		return err
	})
	if err != nil {
		return Reply{}, err
	}
	defer c.Close()
	return AskOn(c, timeout)
}

// connect connects the blocking socket fd to sa. A signal of the Go
// runtime (preemption) can interrupt the call (EINTR) while the kernel
// goes on connecting; then it waits for the socket to turn writable, up
// to timeout, and returns the connection's own outcome (SO_ERROR).
func connect(fd int, sa unix.Sockaddr, timeout time.Duration) error {
	err := unix.Connect(fd, sa)
	if !errors.Is(err, unix.EINTR) {
		return err
	}
	deadline := time.Now().Add(timeout)
	for {
		wait := time.Until(deadline)
		if wait <= 0 {
			return unix.ETIMEDOUT
		}
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
		n, err := unix.Poll(fds, int(wait.Milliseconds())+1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return unix.ETIMEDOUT
		}
		soErr, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR)
		if err != nil {
			return err
		}
		if soErr != 0 {
			return unix.Errno(soErr)
		}
		return nil
	}
}
