package nft

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// generation returns the nftables ruleset generation of the network
// namespace of s. The kernel bumps it at every
// committed transaction, by anyone, in any table; set elements that the
// packet path adds or that time out (affinity entries) do not bump it.
// So when it is where onehop's own last transaction left it, the kernel
// holds exactly what onehop wrote.
func generation(s *sockets) (uint32, error) {
	c, err := s.genConn()
	if err != nil {
		return 0, fmt.Errorf("nftables generation: %w", err)
	}
	gen, err := askGeneration(c)
	if err != nil {
		s.dropGen()
	}
	return gen, err
}

func askGeneration(c *netlink.Conn) (uint32, error) {
	msgs, err := c.Execute(netlink.Message{
		Header: netlink.Header{
			Type:  netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETGEN),
			Flags: netlink.Request,
		},
		Data: []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, 0},
	})
	if err != nil {
		return 0, fmt.Errorf("nftables generation: %w", err)
	}
	for _, m := range msgs {
		if len(m.Data) < 4 {
			continue
		}
		ad, err := netlink.NewAttributeDecoder(m.Data[4:])
		if err != nil {
			return 0, fmt.Errorf("nftables generation: %w", err)
		}
		ad.ByteOrder = binary.BigEndian
		for ad.Next() {
			if ad.Type() == unix.NFTA_GEN_ID {
				return ad.Uint32(), nil
			}
		}
	}
	return 0, errors.New("nftables generation: no NFTA_GEN_ID in the kernel's answer")
}

// genTracker follows whether the kernel's nftables state is still what
// onehop's last transaction left: then a full sync can compare the desired
// state with what the backend remembers instead of reading the whole
// table back, which at 10k Services is most of a full sync's cost.
type genTracker struct {
	gen   uint32 // the generation after onehop's last sync
	known bool   // gen is trustworthy: nothing else committed since the state was read or written
}

// after records a sync: before is the generation read when the sync
// started (before it read or relied on the kernel's state), sent whether
// it committed a transaction, and startKnown whether the state it started
// from was the kernel's (read back, or verified). The result is known only
// when exactly that transaction, and nothing else, happened since.
func (g *genTracker) after(s *sockets, before uint32, beforeErr error, sent, startKnown bool) {
	g.known = false
	if beforeErr != nil || !startKnown {
		return
	}
	now, err := generation(s)
	if err != nil {
		return
	}
	want := before
	if sent {
		want++
	}
	g.gen, g.known = now, now == want
}
