package difftest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/onehop/onehop/test/nsutil"
)

// How probes are sent. A first pass is short: tries requests of at most
// timeout each, stopping after two failures with no answer. Where the twins
// differ, the probe is sent again on both, recheckTries requests of
// recheckTimeout each, all of them, up to recheckRounds times while they
// still differ, so that chance (an endpoint not drawn, a request lost on a
// busy machine) does not pass for a difference.
const (
	tries          = 6
	timeout        = 300 * time.Millisecond
	giveUp         = 2
	recheckTries   = 20
	recheckTimeout = 600 * time.Millisecond
	recheckRounds  = 2
	parallelProbes = 16
)

// A TCP connection over IPv6 refused by an ICMPv6 error (kube-proxy's
// reject) is refused only at the SYN's retransmission, a second later:
// the first error reaches the client while connect() still holds the
// socket, and the kernel drops it (TcpExtLockDroppedIcmps; ICMPv4 errors
// are not dropped so). Each such request waits long enough to see the
// second, so that "refused" is compared with "refused" (onehop's reset is
// seen at once) and a drop still times out.
const (
	timeout6        = 1500 * time.Millisecond
	recheckTimeout6 = 2500 * time.Millisecond
)

// requestWait returns how long a request of p waits for its answer: each, or for
// TCP over IPv6 at least the retransmission's refusal (above).
func requestWait(p probe, each time.Duration) time.Duration {
	if p.To.Proto != "tcp" || !isIPv6(p.To.Addr) {
		return each
	}
	if each > timeout {
		return max(each, recheckTimeout6)
	}
	return max(each, timeout6)
}

func isIPv6(hostPort string) bool {
	host, _, err := net.SplitHostPort(hostPort)
	if err != nil {
		return false
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.Is6()
}

// outcome is what one probe saw over its tries, as a sorted set of labels:
// "<pod>:<port> saw <source IP>" for each answer, "refused",
// "unreachable", "timeout" or "error: ..." for each failure.
type outcome []string

func (o outcome) String() string { return "{" + strings.Join(o, ", ") + "}" }

func (o outcome) equal(p outcome) bool { return slices.Equal(o, p) }

// send runs p n times (fresh source port each time, so each is a new flow
// and a fresh choice of endpoint) from tw and returns what it saw. It
// stops early after giveUp failures while nothing answered (0: never).
//
// The requests of a probe without affinity go out in batches at once: the
// first giveUp of them (one when giveUp is 0), then the rest, at most
// batchLimit at a time. A refused or dropped request costs its whole wait
// (a second for TCP over IPv6), so a probe that fails costs one wait, not
// giveUp of them, and sending them together changes nothing else: each is
// its own flow. A probe of a Service with ClientIP affinity sends them one
// after another, so that the first decides the pod the others stick to.
func (tw *Twin) send(ctx context.Context, p probe, n int, each time.Duration, giveUp int) outcome {
	var mu sync.Mutex
	seen := map[string]bool{}
	failures, answers := 0, 0
	from := p.From.netns(tw)
	each = requestWait(p, each)
	one := func() {
		rctx, cancel := context.WithTimeout(ctx, each)
		rep, err := tw.request(rctx, from, p.To.Proto, p.To.Addr, each)
		cancel()
		mu.Lock()
		defer mu.Unlock()
		switch {
		case ctx.Err() != nil:
			seen["error: "+ctx.Err().Error()] = true
		case err != nil:
			seen[classify(err)] = true
			failures++
		default:
			answers++
			seen[fmt.Sprintf("%s:%d saw %s", rep.Name, rep.Port, rep.SourceIP())] = true
		}
	}
	for sent := 0; sent < n && ctx.Err() == nil; {
		if giveUp > 0 && answers == 0 && failures >= giveUp {
			break
		}
		batch := n - sent
		switch {
		case p.To.Sticky:
			batch = 1
		case sent == 0:
			batch = min(batch, max(giveUp, 1))
		}
		batch = min(batch, batchLimit)
		var wg sync.WaitGroup
		for range batch {
			wg.Go(one)
		}
		wg.Wait()
		sent += batch
	}
	out := make(outcome, 0, len(seen))
	for l := range seen {
		out = append(out, l)
	}
	slices.Sort(out)
	return out
}

// batchLimit bounds the requests one probe has in flight.
const batchLimit = 5

// UDP requests take their source port from udpPorts, in turn, per
// vantage point, below the kernel's ephemeral range: a port the kernel
// picked could be one an earlier request used, and that request's
// conntrack entry, made under the state before a change, would then
// decide where this one goes.
const (
	udpPortFirst = 20000
	udpPorts     = 12000
)

// request sends one request from namespace from, a fresh connection or
// socket each time, and returns the reply.
func (tw *Twin) request(ctx context.Context, from, proto, addr string, wait time.Duration) (nsutil.Reply, error) {
	if proto != "udp" {
		return nsutil.Request(ctx, from, proto, addr)
	}
	tw.mu.Lock()
	if tw.udpNext == nil {
		tw.udpNext = map[string]int{}
	}
	port := udpPortFirst + tw.udpNext[from]
	tw.udpNext[from] = (tw.udpNext[from] + 1) % udpPorts
	tw.mu.Unlock()
	var c net.Conn
	err := nsutil.Do(from, func() error {
		d := net.Dialer{LocalAddr: &net.UDPAddr{Port: port}}
		var err error
		c, err = d.DialContext(ctx, "udp", addr)
		return err
	})
	if err != nil {
		return nsutil.Reply{}, err
	}
	defer c.Close()
	f := &flow{conn: c, r: bufio.NewReader(c)}
	return f.ask(ctx, wait)
}

// classify names a failed request the way the client's kernel reported it.
func classify(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "refused"
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return "unreachable"
	case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.Is(err, syscall.ECONNRESET):
		return "reset"
	}
	// Only the kind of error: its text holds the request's own port.
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return "error: " + errno.Error()
	}
	return fmt.Sprintf("error: %T", err)
}

// sendAll runs every probe on tw, parallelProbes at a time (a client's
// probes of a Service with affinity one after another), and returns their
// outcomes in order.
func (tw *Twin) sendAll(ctx context.Context, ps []probe, n int, each time.Duration, giveUp int) []outcome {
	out := make([]outcome, len(ps))
	var groups [][]int
	sticky := map[string]int{}
	for i, p := range ps {
		if !p.To.Sticky {
			groups = append(groups, []int{i})
			continue
		}
		key := p.From.Name + "/" + p.To.Service
		g, ok := sticky[key]
		if !ok {
			g = len(groups)
			sticky[key] = g
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], i)
	}
	inParallel(len(groups), func(g int) {
		for _, i := range groups[g] {
			out[i] = tw.send(ctx, ps[i], n, each, giveUp)
		}
	})
	return out
}

// inParallel runs fn(0) to fn(n-1), parallelProbes at a time, and waits
// for them.
func inParallel(n int, fn func(i int)) {
	sem := make(chan struct{}, parallelProbes)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			fn(i)
		}()
	}
	wg.Wait()
}
