package echo

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"time"

	"github.com/onehop/onehop/test/nsutil"
)

// Timeout bounds one request when the caller's context has no sooner
// deadline: long enough for a loaded 2-core machine, short enough for
// polling loops.
const Timeout = 2 * time.Second

// Request opens a fresh connection (TCP) or socket (UDP) from inside netns to
// addr, sends one line and returns the reply. A new source port per call
// means a new conntrack entry, hence a fresh load-balancing decision.
func Request(ctx context.Context, netns, proto, addr string) (Reply, error) {
	ctx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()
	c, err := nsutil.Dialer(netns)(ctx, proto, addr)
	if err != nil {
		return Reply{}, err
	}
	defer c.Close()
	return exchange(ctx, c, bufio.NewReader(c), "hello")
}

func exchange(ctx context.Context, c net.Conn, r *bufio.Reader, line string) (Reply, error) {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(Timeout)
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

// Conn is a long-lived TCP connection for established-connection checks.
type Conn struct {
	c net.Conn
	r *bufio.Reader
	n int
}

// Dial opens a TCP connection from inside netns to addr.
func Dial(ctx context.Context, netns, addr string) (*Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()
	c, err := nsutil.Dialer(netns)(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return &Conn{c: c, r: bufio.NewReader(c)}, nil
}

// Ask sends one line over the open connection and returns the reply.
func (c *Conn) Ask(ctx context.Context) (Reply, error) {
	ctx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()
	c.n++
	return exchange(ctx, c.c, c.r, fmt.Sprintf("ping %d", c.n))
}

// LocalAddr is the client side of the connection.
func (c *Conn) LocalAddr() net.Addr { return c.c.LocalAddr() }

// Close closes the connection.
func (c *Conn) Close() error { return c.c.Close() }
