package nft

import (
	"errors"
	"fmt"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// sockets are the netlink sockets a Backend keeps from one sync to the
// next: one for the ruleset generation, one for transactions (with large
// buffers) and an nftables connection for queries. Opening a socket costs
// more than most syncs' own requests (socket, bind, buffer sizes, the
// poller, and netlink's random seed), and a sync made four or five: in a
// storm of changes that was a twentieth of the agent's CPU. A socket that
// saw any error is closed and opened afresh for the next request, so
// that nothing left in it from a failed exchange is read as an answer.
type sockets struct {
	netnsFD int
	own     *ownPorts // the port ids of the transaction sockets, for Watch
	gen     *netlink.Conn
	tx      *netlink.Conn
	query   *nftables.Conn
}

func (s *sockets) config() *netlink.Config {
	cfg := &netlink.Config{}
	if s.netnsFD >= 0 {
		cfg.NetNS = s.netnsFD
	}
	return cfg
}

// genConn returns the socket for generation queries.
func (s *sockets) genConn() (*netlink.Conn, error) {
	if s.gen == nil {
		c, err := netlink.Dial(unix.NETLINK_NETFILTER, s.config())
		if err != nil {
			return nil, err
		}
		s.gen = c
	}
	return s.gen, nil
}

// txConn returns the socket transactions are sent on.
func (s *sockets) txConn() (*netlink.Conn, error) {
	if s.tx == nil {
		c, err := netlink.Dial(unix.NETLINK_NETFILTER, s.config())
		if err != nil {
			return nil, err
		}
		if err := bigBuffers(c); err != nil {
			c.Close()
			return nil, err
		}
		port, err := portID(c)
		if err != nil {
			c.Close()
			return nil, err
		}
		s.own.add(port)
		s.tx = c
	}
	return s.tx, nil
}

// queryConn returns the nftables connection for queries (lists, rules).
func (s *sockets) queryConn() (*nftables.Conn, error) {
	if s.query == nil {
		c, err := newConn(s.netnsFD, nftables.AsLasting())
		if err != nil {
			return nil, err
		}
		s.query = c
	}
	return s.query, nil
}

// dropGen, dropTx and dropQuery close a socket after an error.
func (s *sockets) dropGen() {
	if s.gen != nil {
		s.gen.Close()
		s.gen = nil
	}
}

func (s *sockets) dropTx() {
	if s.tx != nil {
		s.tx.Close()
		s.tx = nil
	}
}

func (s *sockets) dropQuery() {
	if s.query != nil {
		s.query.CloseLasting()
		s.query = nil
	}
}

// close closes every socket; the next request opens them again.
func (s *sockets) close() error {
	var errs []error
	if s.query != nil {
		errs = append(errs, s.query.CloseLasting())
		s.query = nil
	}
	s.dropGen()
	s.dropTx()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("close nftables connection: %w", err)
	}
	return nil
}
