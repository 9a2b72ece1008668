package ns

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"

	"golang.org/x/sys/unix"
)

// Do runs fn with the calling goroutine's OS thread switched into the named
// network namespace. Sockets created inside fn belong to that namespace for
// their whole life, also after Do returns. /proc/sys/net opened inside fn is
// the namespace's.
func Do(name string, fn func() error) error {
	target, err := os.Open(filepath.Join(Dir, name))
	if err != nil {
		return fmt.Errorf("netns %s: %w", name, err)
	}
	defer target.Close()

	runtime.LockOSThread()
	self, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer self.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("setns %s: %w", name, err)
	}
	ferr := fn()
	if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
		// Leave the thread locked: the runtime ends it with this goroutine
		// instead of reusing a thread stuck in the wrong namespace.
		return fmt.Errorf("setns back from %s: %w", name, err)
	}
	runtime.UnlockOSThread()
	return ferr
}

// Dialer returns a dial function that opens connections from inside the
// named namespace. An empty name dials from the caller's namespace.
func Dialer(name string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		if name == "" {
			return d.DialContext(ctx, network, addr)
		}
		var c net.Conn
		err := Do(name, func() error {
			var err error
			c, err = d.DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
}

// Listen opens a stream listener inside the named namespace.
func Listen(name, network, addr string) (net.Listener, error) {
	var l net.Listener
	err := Do(name, func() error {
		var err error
		l, err = net.Listen(network, addr)
		return err
	})
	return l, err
}

// ListenPacket opens a datagram socket inside the named namespace.
func ListenPacket(name, network, addr string) (net.PacketConn, error) {
	var c net.PacketConn
	err := Do(name, func() error {
		var err error
		c, err = net.ListenPacket(network, addr)
		return err
	})
	return c, err
}
