package nsutil

import (
	"context"
	"net"
)

// inside is how a socket call enters a namespace: Do for a name, (*NS).Do
// for a test's namespace.
type inside func(fn func() error) error

func byName(name string) inside {
	return func(fn func() error) error { return Do(name, fn) }
}

func (in inside) dial(ctx context.Context, network, addr string) (c net.Conn, err error) {
	err = in(func() error {
		var d net.Dialer
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

func (in inside) listen(network, addr string) (l net.Listener, err error) {
	err = in(func() error { l, err = net.Listen(network, addr); return err })
	return l, err
}

func (in inside) listenPacket(network, addr string) (c net.PacketConn, err error) {
	err = in(func() error { c, err = net.ListenPacket(network, addr); return err })
	return c, err
}

// Dialer returns a dial function that opens connections from inside the
// named namespace. An empty name dials from the caller's namespace.
func Dialer(name string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	if name == "" {
		var d net.Dialer
		return d.DialContext
	}
	return byName(name).dial
}

// Listen opens a stream listener inside the named namespace.
func Listen(name, network, addr string) (net.Listener, error) {
	return byName(name).listen(network, addr)
}

// ListenPacket opens a datagram socket inside the named namespace.
func ListenPacket(name, network, addr string) (net.PacketConn, error) {
	return byName(name).listenPacket(network, addr)
}

// Dial opens a connection from inside n.
func (n *NS) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	return inside(n.Do).dial(ctx, network, addr)
}

// Listen opens a stream listener inside n.
func (n *NS) Listen(network, addr string) (net.Listener, error) {
	return inside(n.Do).listen(network, addr)
}

// ListenPacket opens a datagram socket inside n.
func (n *NS) ListenPacket(network, addr string) (net.PacketConn, error) {
	return inside(n.Do).listenPacket(network, addr)
}
