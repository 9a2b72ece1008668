package nft

import (
	"fmt"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// sockBuf is the netlink socket buffer size. A full sync of a large cluster
// is one batch of tens of thousands of messages, each acknowledged by the
// kernel before we read the first acknowledgement: the default buffers would
// overflow (EMSGSIZE on send, ENOBUFS on receive).
const sockBuf = 512 << 20

func bigBuffers(c *netlink.Conn) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	err = raw.Control(func(fd uintptr) {
		if e := unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, sockBuf); e != nil {
			serr = fmt.Errorf("SO_SNDBUFFORCE: %w", e)
			return
		}
		if e := unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, sockBuf); e != nil {
			serr = fmt.Errorf("SO_RCVBUFFORCE: %w", e)
		}
	})
	if err != nil {
		return err
	}
	return serr
}

// newConn opens an nftables connection in the network namespace netnsFD
// (-1: the caller's), with extra options (nftables.AsLasting for one socket
// across many requests).
func newConn(netnsFD int, extra ...nftables.ConnOption) (*nftables.Conn, error) {
	opts := []nftables.ConnOption{nftables.WithSockOptions(bigBuffers)}
	if netnsFD >= 0 {
		opts = append(opts, nftables.WithNetNSFd(netnsFD))
	}
	return nftables.New(append(opts, extra...)...)
}
