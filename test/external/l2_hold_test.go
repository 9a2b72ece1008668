package external

import (
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/onehop/onehop/external/l2"
)

// TestL2RestartHoldEnds: what bounds the hold a restarting agent's
// addresses get (l2.heartbeat.restartHoldSeconds, here 3 s), on two nodes
// with heartbeats. The agent of vip's owner is stopped with SIGTERM, its
// Node staying, and:
//   - never comes back: the other node takes its addresses over when the
//     hold ends, not before;
//   - its node goes down 0.5 s later (its link down, as a node shut down
//     after its pods were stopped): the other node, whose echo requests
//     are no longer answered, takes over within a second, well before
//     the hold ends;
//   - its Node was cordoned first, as a drain does: its addresses move
//     then (a cordoned node serves no load balancer), within a second,
//     and stay with the other node when its agent stops.
//
// No request is answered by two nodes, but during the move a cordon
// makes: both compute the new owner at once, and the old one may answer
// for a moment after the new one began.
func TestL2RestartHoldEnds(t *testing.T) {
	const hold = 3 * time.Second
	for _, tc := range []struct {
		name     string
		nodeDown bool
		drained  bool
	}{{"agent-not-back", false, false}, {"node-down", true, false}, {"drained", false, true}} {
		t.Run(tc.name, func(t *testing.T) {
			key := filepath.Join(t.TempDir(), "l2-heartbeat-key")
			if err := os.WriteFile(key, []byte("a key for the lab only, 32 bytes\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			secs := hold.Seconds()
			d := startDualStackL2With(t, func(c *l2.Config) {
				c.Heartbeat = &l2.HeartbeatConfig{KeyFile: key, RestartHoldSeconds: &secs}
			})
			x := d.owners[vip]
			y := map[string]string{"node1": "node2", "node2": "node1"}[x]
			var mine []string
			for ip, owner := range d.owners {
				if owner == x {
					mine = append(mine, ip)
				}
			}
			slices.Sort(mine)

			var tCordon time.Time
			if tc.drained {
				tCordon = time.Now()
				n, err := d.c.CoreV1().Nodes().Get(t.Context(), x, metav1.GetOptions{})
				if err == nil {
					n.Spec.Unschedulable = true
					_, err = d.c.CoreV1().Nodes().Update(t.Context(), n, metav1.UpdateOptions{})
				}
				if err != nil {
					t.Fatalf("cordon %s: %v", x, err)
				}
				for _, ip := range mine {
					at, ok := d.probe.waitAnswers(ip, tCordon, 10*time.Second, d.mac[y])
					if !ok || at.Sub(tCordon) > time.Second {
						t.Fatalf("%s cordoned: %s not answered by %s alone within a second: %v", x, ip, y, d.probe.tail(ip, 5))
					}
					t.Logf("drained: %s answered for %s alone %v after the cordon", y, ip, at.Sub(tCordon).Round(time.Millisecond))
				}
				time.Sleep(time.Second)
			}
			tTerm := time.Now()
			_ = d.agents[x].Process.Signal(syscall.SIGTERM)
			if err := d.agents[x].Wait(); err != nil {
				t.Errorf("%s's agent exit after SIGTERM: %v", x, err)
			}
			from := tTerm
			if tc.nodeDown {
				time.Sleep(500*time.Millisecond - time.Since(tTerm))
				from = time.Now()
				d.lab.ip(x, "link", "set", "eth0", "down")
			}
			if tc.drained {
				time.Sleep(time.Second)
			}
			for _, ip := range mine {
				switch first, ok := d.probe.waitAnswerFrom(ip, tTerm, hold+10*time.Second, d.mac[y]); {
				case !ok:
					t.Fatalf("%s never answered for %s after %s's agent stopped: %v", y, ip, x, d.probe.tail(ip, 5))
				case tc.drained:
					after := d.probe.since(ip, tTerm)
					if slices.ContainsFunc(after, func(a l2Answers) bool { return !slices.Equal(a.macs, []string{d.mac[y]}) }) {
						t.Errorf("%s drained, its agent stopped: %s not answered by %s alone: %v", x, ip, y, d.probe.tail(ip, 5))
					}
					t.Logf("drained: %s's agent stopped, %s answered by %s alone in all %d requests of the next second", x, ip, y, len(after))
				default:
					took := first.at.Sub(from)
					switch {
					case tc.nodeDown && took > time.Second:
						t.Errorf("%s's node down: %s answered for %s only %v later (hold %v)", x, y, ip, took.Round(time.Millisecond), hold)
					case !tc.nodeDown && took < hold-probeEvery:
						t.Errorf("%s's agent restarting: %s answered for %s %v after the SIGTERM, before the hold (%v) ended", x, y, ip, took.Round(time.Millisecond), hold)
					case !tc.nodeDown && took > hold+2*time.Second:
						t.Errorf("%s's agent not back: %s answered for %s only %v after the SIGTERM (hold %v)", x, y, ip, took.Round(time.Millisecond), hold)
					}
					t.Logf("%s: %s answered for %s %v after %s", tc.name, y, ip, took.Round(time.Millisecond), map[bool]string{true: "the node went down", false: "the SIGTERM"}[tc.nodeDown])
				}
				for _, r := range d.probe.doubles(ip, d.settled, time.Now()) {
					if !tc.drained || r.at.Before(tCordon) || r.at.After(tCordon.Add(time.Second)) {
						t.Errorf("two nodes answered one request: %v", r)
					}
				}
			}
		})
	}
}
