package soak

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/onehop/onehop/test/netns"
	"github.com/onehop/onehop/test/nsutil"
)

// Churn makes a seeded stream of changes through the API server at a
// target rate: Workers writers, each with its own model over its own
// slots, take turns from one pace, so that a slow write delays only its
// own stream. When the API server cannot keep up the pace is not made up
// later: the achieved rate is what the run reports.
type Churn struct {
	writers []*writer
	rate    float64
	from    *netns.Pod // sends UDP to the churned Services
	nodeIP  string     // whose node ports it sends to

	changes, behind atomic.Int64
	udp             atomic.Int64
	byKind          [kinds]atomic.Int64
	errMu           sync.Mutex
	err             error
	began, ended    time.Time
	cancel          context.CancelFunc
	wg              sync.WaitGroup
}

// Churn's shape.
const (
	churnWorkers = 8
	churnSlots   = 25 // per worker: 200 slots, about 100 Services at a time
	udpSenders   = 2
)

func newChurn(c *netns.Cluster, seed uint64, rate float64, from *netns.Pod) *Churn {
	ch := &Churn{rate: rate, from: from, nodeIP: from.Node.IP}
	pods := len(c.Pods())
	for i := range churnWorkers {
		m := NewModel(fmt.Sprintf("churn-%d", i), churnSlots, pods, netns.EchoTCPPorts(), netns.EchoUDPPorts(), seed*churnWorkers+uint64(i))
		ch.writers = append(ch.writers, newWriter(c, m))
	}
	return ch
}

// Start begins the changes and, from the pod, UDP requests to the churned
// Services (new flows that the changes leave pointing the wrong way unless
// the agent cleans them; their answers are not checked).
func (ch *Churn) Start(ctx context.Context) {
	ctx, ch.cancel = context.WithCancel(ctx)
	ch.began = time.Now()
	turns := make(chan struct{}, churnWorkers)
	ch.wg.Go(func() { ch.pace(ctx, turns) })
	for _, w := range ch.writers {
		ch.wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case <-turns:
				}
				c, err := w.step(ctx)
				if ctx.Err() != nil {
					return
				}
				if err != nil {
					ch.fail(err)
					return
				}
				ch.changes.Add(1)
				ch.byKind[c.Kind].Add(1)
			}
		})
	}
	for i := range udpSenders {
		ch.wg.Go(func() { ch.sendUDP(ctx, uint64(i)) })
	}
}

// pace hands out one turn per 1/rate; a turn no writer is free to take is
// dropped and counted.
func (ch *Churn) pace(ctx context.Context, turns chan<- struct{}) {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	var given int64
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			for owed := int64(now.Sub(ch.began).Seconds() * ch.rate); given < owed; given++ {
				select {
				case turns <- struct{}{}:
				default:
					ch.behind.Add(1)
				}
			}
		}
	}
}

func (ch *Churn) sendUDP(ctx context.Context, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 0x0d9))
	for ctx.Err() == nil {
		w := ch.writers[r.IntN(len(ch.writers))]
		if addr := w.udpTarget(r, ch.nodeIP); addr != "" {
			rctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			_, _ = nsutil.Request(rctx, ch.from.Netns, "udp", addr)
			cancel()
			ch.udp.Add(1)
		}
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (ch *Churn) fail(err error) {
	ch.errMu.Lock()
	defer ch.errMu.Unlock()
	if ch.err == nil {
		ch.err = err
		ch.cancel()
	}
}

// Err is the first write that failed (and stopped the churn).
func (ch *Churn) Err() error {
	ch.errMu.Lock()
	defer ch.errMu.Unlock()
	return ch.err
}

// Stop ends the changes and the UDP requests and waits for them.
func (ch *Churn) Stop() {
	ch.cancel()
	ch.wg.Wait()
	if ch.ended.IsZero() {
		ch.ended = time.Now()
	}
}

// Services counts the churned Services as last written.
func (ch *Churn) Services() int {
	n := 0
	for _, w := range ch.writers {
		w.mu.Lock()
		n += len(w.svcs)
		w.mu.Unlock()
	}
	return n
}

// Summary says how many changes of each kind were made, at what rate.
func (ch *Churn) Summary() string {
	end := ch.ended
	if end.IsZero() {
		end = time.Now()
	}
	secs := end.Sub(ch.began).Seconds()
	s := fmt.Sprintf("%d changes in %.0f s: %.1f/s (target %.0f/s; %d turns missed while every writer was busy); ",
		ch.changes.Load(), secs, float64(ch.changes.Load())/secs, ch.rate, ch.behind.Load())
	for k := range kinds {
		s += fmt.Sprintf("%v %d, ", k, ch.byKind[k].Load())
	}
	return s + fmt.Sprintf("%d UDP requests to churned Services", ch.udp.Load())
}
