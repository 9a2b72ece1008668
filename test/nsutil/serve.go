package nsutil

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// Echo serves TCP and UDP on addr (host:port) inside n: every request gets
// one line back, "<name> <source address seen>". It stops when the test ends.
func (n *NS) Echo(t testing.TB, name, addr string) {
	t.Helper()
	var ln net.Listener
	var pc net.PacketConn
	err := n.Do(func() error {
		var err error
		if ln, err = net.Listen("tcp", addr); err != nil {
			return err
		}
		pc, err = net.ListenPacket("udp", addr)
		return err
	})
	if err != nil {
		t.Fatalf("echo %s in %s: %v", addr, n.Name, err)
	}
	t.Cleanup(func() { ln.Close(); pc.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					if _, err := r.ReadString('\n'); err != nil {
						return
					}
					if _, err := fmt.Fprintf(c, "%s %s\n", name, c.RemoteAddr()); err != nil {
						return
					}
				}
			}()
		}
	}()
	go func() {
		buf := make([]byte, 2048)
		for {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo([]byte(fmt.Sprintf("%s %s\n", name, from)), from)
		}
	}()
}

// Reply is one answer of an echo server.
type Reply struct {
	Name   string // the server's name
	Source string // the source address the server saw
}

// Ask sends one request from n to an echo server over network (tcp or udp)
// and returns its reply.
func (n *NS) Ask(network, addr string, timeout time.Duration) (Reply, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	c, err := n.Dial(ctx, network, addr)
	if err != nil {
		return Reply{}, err
	}
	defer c.Close()
	return AskOn(c, timeout)
}

// AskOn sends one request on an open connection and reads the reply.
func AskOn(c net.Conn, timeout time.Duration) (Reply, error) {
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := io.WriteString(c, "hello\n"); err != nil {
		return Reply{}, err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return Reply{}, err
	}
	f := strings.Fields(line)
	if len(f) != 2 {
		return Reply{}, errors.New("bad reply: " + line)
	}
	return Reply{Name: f[0], Source: f[1]}, nil
}
