package semantics_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/onehop/onehop/test/netns"
	"github.com/onehop/onehop/test/nsutil"
)

// udpSender keeps one UDP socket (one conntrack entry) sending from a pod
// and records who answers.
type udpSender struct {
	mu      sync.Mutex
	answers []udpAnswer
	stop    chan struct{}
	done    chan struct{}
}

type udpAnswer struct {
	at  time.Time
	pod string // "" for no answer
}

func startUDPSender(t *testing.T, from *netns.Pod, addr string) *udpSender {
	t.Helper()
	conn, err := nsutil.Dialer(from.Netns)(ctxFor(t), "udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	s := &udpSender{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		defer conn.Close()
		buf := make([]byte, 4096)
		for i := 0; ; i++ {
			select {
			case <-s.stop:
				return
			default:
			}
			_, _ = fmt.Fprintf(conn, "ping %d\n", i)
			_ = conn.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
			a := udpAnswer{}
			if n, err := conn.Read(buf); err == nil {
				var rep nsutil.Reply
				if json.Unmarshal([]byte(strings.TrimSpace(string(buf[:n]))), &rep) == nil {
					a.pod = rep.Name
				}
			} else if !isDrop(err) {
				time.Sleep(50 * time.Millisecond) // ICMP error: rejected
			}
			a.at = time.Now()
			s.mu.Lock()
			s.answers = append(s.answers, a)
			s.mu.Unlock()
			time.Sleep(20 * time.Millisecond)
		}
	}()
	t.Cleanup(func() { close(s.stop); <-s.done })
	return s
}

// waitStreak waits until need answers in a row (after since) are from pod
// ("" = unanswered) and returns when the streak began, relative to since.
func (s *udpSender) waitStreak(t *testing.T, pod string, need int, since time.Time) time.Duration {
	t.Helper()
	deadline := time.Now().Add(netns.ConvergeTimeout)
	for time.Now().Before(deadline) {
		s.mu.Lock()
		streak := 0
		var start time.Time
		for _, a := range s.answers {
			if a.at.Before(since) {
				continue
			}
			if a.pod == pod {
				if streak == 0 {
					start = a.at
				}
				streak++
				if streak >= need {
					s.mu.Unlock()
					return start.Sub(since)
				}
			} else {
				streak = 0
			}
		}
		s.mu.Unlock()
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("the running UDP flow never had %d answers in a row from %q within %v; since the change: %s", need, pod, netns.ConvergeTimeout, s.summary(since))
	return 0
}

func (s *udpSender) summary(since time.Time) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	counts := map[string]int{}
	for _, a := range s.answers {
		if !a.at.Before(since) {
			k := a.pod
			if k == "" {
				k = "(none)"
			}
			counts[k]++
		}
	}
	return fmt.Sprint(counts)
}

// A UDP flow from a pod keeps sending (one socket, one conntrack entry)
// while the Service's endpoint is replaced, removed (1 -> 0) and restored
// (0 -> 1). Without conntrack cleanup the entry would keep the flow on the
// old pod, which still answers here.
func testUDPCycle(t *testing.T, c *netns.Cluster) {
	from := c.Nodes[0].Pods[0]
	x, y := c.Nodes[1].Pods[0], c.Nodes[1].Pods[1]
	svc, since := expose(t, c, service("udpcycle", v1.ServiceTypeClusterIP, port("dns", v1.ProtocolUDP, 53, netns.PortDNS)), netns.Ready(x))
	addr := hostPort(svc.Spec.ClusterIP, 53)
	if _, err := netns.WaitBackends(ctxFor(t), from.Netns, "udp", addr, []*netns.Pod{x}, since); err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	s := startUDPSender(t, from, addr)
	logLatency(t, "sender's flow answered by "+x.Name, s.waitStreak(t, x.Name, 5, started))

	for _, step := range []struct {
		what string
		eps  []*netns.Pod
		want string
	}{
		{"endpoint replaced " + x.Name + " -> " + y.Name, []*netns.Pod{y}, y.Name},
		{"scaled 1 -> 0", nil, ""},
		{"scaled 0 -> 1 (" + x.Name + ")", []*netns.Pod{x}, x.Name},
	} {
		at := time.Now()
		if err := c.SetEndpoints(ctxFor(t), svc, netns.Ready(step.eps...)); err != nil {
			t.Fatal(err)
		}
		d := s.waitStreak(t, step.want, 10, at)
		logLatency(t, step.what+": the running flow follows", d)
	}
}
