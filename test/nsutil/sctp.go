package nsutil

import (
	"errors"
	"fmt"
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
// read and write, and net.FileConn wraps them.
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

// EchoSCTP serves SCTP on port (IPv4, any address) inside n, answering like
// Echo. It returns ErrNoSCTP when the kernel lacks SCTP.
func (n *NS) EchoSCTP(t testing.TB, name string, port uint16) error {
	t.Helper()
	var fd int
	err := n.Do(func() error {
		var err error
		if fd, err = sctpSocket(false); err != nil {
			return err
		}
		if err := unix.Bind(fd, &unix.SockaddrInet4{Port: int(port)}); err != nil {
			return err
		}
		return unix.Listen(fd, 16)
	})
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), "sctp-listener")
	t.Cleanup(func() { f.Close() })
	go func() {
		for {
			cfd, _, err := unix.Accept(fd)
			if err != nil {
				return
			}
			go func() {
				c := os.NewFile(uintptr(cfd), "sctp-conn")
				defer c.Close()
				buf := make([]byte, 512)
				sa, _ := unix.Getpeername(cfd)
				peer := ""
				if s4, ok := sa.(*unix.SockaddrInet4); ok {
					peer = netip.AddrPortFrom(netip.AddrFrom4(s4.Addr), uint16(s4.Port)).String()
				}
				for {
					if _, err := c.Read(buf); err != nil {
						return
					}
					if _, err := fmt.Fprintf(c, "%s %s\n", name, peer); err != nil {
						return
					}
				}
			}()
		}
	}()
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
		if err := unix.Connect(fd, sockaddr(addr)); err != nil {
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
