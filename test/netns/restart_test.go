package netns_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/onehop/onehop/test/netns"
	"github.com/onehop/onehop/test/nsutil"
)

// outcome is one request of the steady loop.
type outcome struct {
	at          time.Time
	established bool
	err         error
}

// The agent of the client's node is SIGKILLed and restarted while a pod sends
// a steady stream of requests: every established connection keeps working
// throughout, and no new connection fails once the agent is back.
func testAgentRestart(t *testing.T, c *netns.Cluster, lat *latencies) {
	ctx := ctxFor(t)
	pods := c.Pods()
	node := c.Nodes[0]
	from := node.Pods[1]
	svc, since := expose(t, c, service("steady", v1.ServiceTypeClusterIP, port("http", v1.ProtocolTCP, 80, netns.PortHTTP)), pods)
	addr := hostPort(svc.Spec.ClusterIP, 80)
	if _, err := netns.WaitBackends(ctx, from.Netns, "tcp", addr, pods, since); err != nil {
		t.Fatal(err)
	}

	var conns []*nsutil.EchoConn
	for i := 0; i < 4; i++ {
		conn, err := nsutil.DialEcho(ctx, from.Netns, addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if _, err := conn.Ask(ctx); err != nil {
			t.Fatal(err)
		}
		conns = append(conns, conn)
	}

	loopCtx, stop := context.WithCancel(ctx)
	var (
		mu       sync.Mutex
		outcomes []outcome
		wg       sync.WaitGroup
	)
	record := func(o outcome) {
		mu.Lock()
		outcomes = append(outcomes, o)
		mu.Unlock()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for loopCtx.Err() == nil {
			_, err := nsutil.Request(loopCtx, from.Netns, "tcp", addr)
			if loopCtx.Err() != nil {
				return
			}
			record(outcome{at: time.Now(), err: err})
			for i, conn := range conns {
				_, err := conn.Ask(loopCtx)
				if loopCtx.Err() != nil {
					return
				}
				if err != nil {
					err = fmt.Errorf("established conn %d (%s): %w", i, conn.LocalAddr(), err)
				}
				record(outcome{at: time.Now(), established: true, err: err})
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()

	// Three cycles: the agent is killed (fail static), stays down 2 s,
	// comes back and serves for a while before the next kill.
	const cycles = 3
	type window struct{ from, to time.Time }
	up := []window{{}} // when the agent ran: new connections must work
	var killed, healthy time.Time
	time.Sleep(time.Second)
	for cycle := 0; cycle < cycles; cycle++ {
		killed = time.Now()
		up[len(up)-1].to = killed
		c.KillAgent(node)
		time.Sleep(2 * time.Second)
		restarted := time.Now()
		if err := c.StartAgent(ctx, node); err != nil {
			stop()
			wg.Wait()
			t.Fatal(err)
		}
		healthy = time.Now()
		up = append(up, window{from: healthy, to: time.Now().Add(time.Hour)})
		t.Logf("cycle %d: agent on %s killed, restarted after %v, healthy %v after restart",
			cycle+1, node.Name, restarted.Sub(killed).Round(time.Millisecond), healthy.Sub(restarted).Round(time.Millisecond))
		time.Sleep(3 * time.Second)
	}
	stop()
	wg.Wait()
	inUp := func(at time.Time) bool {
		for _, w := range up {
			if !at.Before(w.from) && at.Before(w.to) {
				return true
			}
		}
		return false
	}

	var newAfter, newAfterFail, newDown, newDownFail, est, estFail int
	for _, o := range outcomes {
		switch {
		case o.established:
			est++
			if o.err != nil {
				estFail++
				t.Errorf("established connection failed at %v: %v", o.at.Format("15:04:05.000"), o.err)
			}
		case inUp(o.at):
			newAfter++
			if o.err != nil {
				newAfterFail++
				t.Errorf("new connection at %v, with the agent back: %v", o.at.Format("15:04:05.000"), o.err)
			}
		default:
			newDown++
			if o.err != nil {
				newDownFail++
			}
		}
	}
	t.Logf("established-connection requests: %d, failed %d; new connections while the agent was down or starting: %d, failed %d; after it was back: %d, failed %d",
		est, estFail, newDown, newDownFail, newAfter, newAfterFail)
	if est == 0 || newAfter == 0 {
		t.Fatalf("the request loop did not run (established %d, new after restart %d)", est, newAfter)
	}

	// The restarted agent still follows the API.
	if err := c.SetEndpoints(ctx, svc, netns.Ready(pods[0])); err != nil {
		t.Fatal(err)
	}
	d, err := netns.WaitBackends(ctx, from.Netns, "tcp", addr, pods[:1], time.Now())
	if err != nil {
		t.Fatalf("after restart: %v", err)
	}
	lat.add(t, "endpoint change after agent restart", d)
}
