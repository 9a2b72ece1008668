package netns_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/onehop/onehop/test/netns"
	"github.com/onehop/onehop/test/nsutil"
)

// flowDeadline bounds how long a running flow may take to follow a change.
const flowDeadline = 10 * time.Second

// flowGap is the pause between a flow's datagrams.
const flowGap = 100 * time.Millisecond

// pollGap is the pause between two looks at a flow's outcomes.
const pollGap = 10 * time.Millisecond

// flowOutcome is what became of one datagram of a flow.
type flowOutcome struct {
	at      time.Time // when it was sent
	pod     string    // the pod that answered; "" when none did
	refused bool      // an ICMP error came back (rejected)
}

func (o flowOutcome) String() string {
	switch {
	case o.pod != "":
		return o.pod
	case o.refused:
		return "refused"
	}
	return "-"
}

// udpFlow sends a datagram every flowGap from one socket (one source port,
// so one conntrack entry) and records what became of each.
type udpFlow struct {
	name string
	mu   sync.Mutex
	outs []flowOutcome
	stop chan struct{}
	done chan struct{}
}

// startUDPFlow keeps sending from namespace from to addr, from a new
// source port (srcPort), until the test ends.
func startUDPFlow(t *testing.T, name, from, addr string) *udpFlow {
	t.Helper()
	return goFlow(t, name, from, addr, false)
}

// startServedUDPFlow is startUDPFlow for an address that is being served:
// until a datagram is answered each goes from a new socket, so that the
// flow begins on the rules the node has when it answers, not on a
// conntrack entry made before them; from the first answer on it keeps to
// that socket.
func startServedUDPFlow(t *testing.T, name, from, addr string) *udpFlow {
	t.Helper()
	return goFlow(t, name, from, addr, true)
}

func goFlow(t *testing.T, name, from, addr string, served bool) *udpFlow {
	t.Helper()
	dial := func() (net.Conn, error) {
		var conn net.Conn
		port := srcPort()
		err := nsutil.Do(from, func() error {
			d := net.Dialer{LocalAddr: &net.UDPAddr{Port: port}}
			var err error
			conn, err = d.Dial("udp", addr)
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("%s: UDP socket in %s from port %d to %s: %w", name, from, port, addr, err)
		}
		return conn, nil
	}
	conn, err := dial()
	if err != nil {
		t.Fatal(err)
	}
	f := &udpFlow{name: name, stop: make(chan struct{}), done: make(chan struct{})}
	var redial func() (net.Conn, error)
	if served {
		redial = dial
	}
	go f.run(conn, redial)
	t.Cleanup(f.close)
	return f
}

// run sends until stopped; with redial, datagrams go from a new socket
// until one is answered.
func (f *udpFlow) run(c net.Conn, redial func() (net.Conn, error)) {
	defer close(f.done)
	defer func() { c.Close() }()
	buf := make([]byte, 1024)
	for {
		select {
		case <-f.stop:
			return
		default:
		}
		gap := flowGap
		if redial != nil {
			gap = flowGap / 4
		}
		o := flowOutcome{at: time.Now()}
		_ = c.SetDeadline(o.at.Add(gap))
		_, err := c.Write([]byte("hello\n"))
		for err == nil {
			var n int
			if n, err = c.Read(buf); err == nil {
				var r nsutil.Reply
				if json.Unmarshal(buf[:n], &r) == nil && r.Name != "" {
					o.pod = r.Name
					break
				}
			}
		}
		o.refused = errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EHOSTUNREACH) ||
			errors.Is(err, syscall.ENETUNREACH)
		f.mu.Lock()
		f.outs = append(f.outs, o)
		f.mu.Unlock()
		switch {
		case redial == nil:
		case o.pod != "":
			redial = nil // served: this socket is the flow
		default:
			if next, err := redial(); err == nil {
				c.Close()
				c = next
			}
		}
		time.Sleep(time.Until(o.at.Add(gap)))
	}
}

func (f *udpFlow) close() {
	select {
	case <-f.stop:
	default:
		close(f.stop)
	}
	<-f.done
}

// waitStreak waits until flowDeadline after since (after now when since
// is zero) for n datagrams in a row sent after since whose outcome
// satisfies ok, and returns how long after since the first of them was
// sent. When none came it marks t failed and returns false. The flows of a
// case run side by side, so each is given the same time after the change.
func (f *udpFlow) waitStreak(t *testing.T, what string, since time.Time, n int, ok func(flowOutcome) bool) (time.Duration, bool) {
	t.Helper()
	deadline := since.Add(flowDeadline)
	if since.IsZero() {
		deadline = time.Now().Add(flowDeadline)
	}
	for {
		f.mu.Lock()
		streak := 0
		for _, o := range f.outs {
			if o.at.Before(since) {
				continue
			}
			if !ok(o) {
				streak = 0
				continue
			}
			if streak++; streak == n {
				// the streak's first datagram
				d := o.at.Add(-time.Duration(n-1) * flowGap).Sub(since)
				f.mu.Unlock()
				return max(d, 0), true
			}
		}
		f.mu.Unlock()
		if time.Now().After(deadline) {
			t.Errorf("flow %s: %s: no %d datagrams in a row did so within %v; outcomes since the change: %s",
				f.name, what, n, flowDeadline, f.summary(since))
			return 0, false
		}
		time.Sleep(pollGap)
	}
}

// reaches waits until the flow is answered by pod, steadily.
func (f *udpFlow) reaches(t *testing.T, pod *netns.Pod, since time.Time) (time.Duration, bool) {
	t.Helper()
	return f.waitStreak(t, "reach "+pod.Name, since, 5, func(o flowOutcome) bool { return o.pod == pod.Name })
}

// undelivered waits until the flow's datagrams reach no pod, steadily.
func (f *udpFlow) undelivered(t *testing.T, since time.Time) (time.Duration, bool) {
	t.Helper()
	return f.waitStreak(t, "reach no pod", since, 10, func(o flowOutcome) bool { return o.pod == "" })
}

// followed returns a function that records, as what, how long a flow took
// to follow a change, when it did.
func followed(t *testing.T, lat *latencies, what string) func(time.Duration, bool) {
	return func(d time.Duration, ok bool) {
		if ok {
			lat.add(t, what, d)
		}
	}
}

// refused counts the flow's datagrams sent after since that were refused.
func (f *udpFlow) refused(since time.Time) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, o := range f.outs {
		if !o.at.Before(since) && o.refused {
			n++
		}
	}
	return n
}

// answeredBy waits until the flow is answered by one pod steadily and
// returns that pod.
func (f *udpFlow) answeredBy(t *testing.T, c *netns.Cluster, since time.Time) *netns.Pod {
	t.Helper()
	deadline := time.Now().Add(flowDeadline)
	for time.Now().Before(deadline) {
		f.mu.Lock()
		var last []string
		for _, o := range f.outs {
			if !o.at.Before(since) {
				last = append(last, o.pod)
			}
		}
		f.mu.Unlock()
		if n := len(last); n >= 5 && last[n-1] != "" && slices.Equal(last[n-5:n-1], []string{last[n-1], last[n-1], last[n-1], last[n-1]}) {
			for _, p := range c.Pods() {
				if p.Name == last[n-1] {
					return p
				}
			}
		}
		time.Sleep(flowGap)
	}
	t.Fatalf("flow %s: no steady answer within %v: %s", f.name, flowDeadline, f.summary(since))
	return nil
}

// summary lists the outcomes since since, run-length encoded.
func (f *udpFlow) summary(since time.Time) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.summaryLocked(since)
}

// summaryLocked is summary with f.mu held.
func (f *udpFlow) summaryLocked(since time.Time) string {
	var parts []string
	last, n := "", 0
	flush := func() {
		if n > 0 {
			parts = append(parts, fmt.Sprintf("%s x%d", last, n))
		}
	}
	for _, o := range f.outs {
		if o.at.Before(since) {
			continue
		}
		if s := o.String(); s != last {
			flush()
			last, n = s, 0
		}
		n++
	}
	flush()
	if len(parts) == 0 {
		return "(none)"
	}
	return strings.Join(parts, ", ")
}

// srcPort hands out the flows' source ports, a new one each time, so that
// no flow joins a conntrack entry that an earlier case left behind.
func srcPort() int { return 41000 + int(flowsStarted.Add(1)) }

var flowsStarted atomic.Int32

// stays wants the flow answered by pod alone since since (a datagram lost
// on the way does not count against it), and steadily after passed.
func (f *udpFlow) stays(t *testing.T, pod *netns.Pod, since, passed time.Time) {
	t.Helper()
	if _, ok := f.waitStreak(t, "stay on "+pod.Name, passed, 5, func(o flowOutcome) bool { return o.pod == pod.Name }); !ok {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, o := range f.outs {
		if !o.at.Before(since) && (o.refused || o.pod != "" && o.pod != pod.Name) {
			t.Errorf("flow %s left %s: outcomes since the change: %s", f.name, pod.Name, f.summaryLocked(since))
			return
		}
	}
}
