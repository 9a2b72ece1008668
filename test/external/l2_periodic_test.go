package external

import (
	"maps"
	"testing"
	"time"

	"github.com/onehop/onehop/external/l2"
)

// TestL2PeriodicAnnouncements: with l2.gratuitousIntervalSeconds 1 (and a
// jitter of 0.2 s) on two nodes serving a dual-stack Service, the owner of
// each address keeps announcing it after its takeover burst is over: a
// client on the segment hears, past the burst, announcements in both ARP
// forms for the IPv4 address and unsolicited advertisements for the IPv6
// one, again and again, from the owner alone; and no request is answered
// by two nodes.
func TestL2PeriodicAnnouncements(t *testing.T) {
	d := startDualStackL2With(t, func(c *l2.Config) { c.GratuitousIntervalSeconds, c.GratuitousJitterSeconds = 1, 0.2 })
	// Past every takeover's burst (5 rounds over 4.4 s) since the start.
	time.Sleep(5 * time.Second)
	t1 := time.Now()
	const rounds = 3
	want := map[string]map[string]int{vip: {"request": rounds, "reply": rounds}, vip6: {"na": rounds}}
	for ip, forms := range want {
		owner := d.owners[ip]
		got, ok := d.probe.waitAnnouncements(ip, d.mac[owner], t1, 20*time.Second, forms)
		if !ok {
			t.Errorf("%s: %s announced %v past its burst, want at least %v", ip, owner, got, forms)
		}
		t.Logf("%s: %s announced it %v in %v past its burst (every 1 s ± 0.2 s)", ip, owner, got, time.Since(t1).Round(time.Millisecond))
		for n, mac := range d.mac {
			if n == owner {
				continue
			}
			if other := d.probe.announcements(ip, mac, t1); len(other) > 0 {
				t.Errorf("%s, which does not own %s, announced it %v", n, ip, maps.Clone(other))
			}
		}
	}
	for _, ip := range []string{vip, vip6} {
		if r := d.probe.doubles(ip, d.settled, time.Now()); len(r) > 0 {
			t.Errorf("two nodes answered a request for %s: %v", ip, r)
		}
	}
}

// waitAnnouncements waits until mac's announcements of ip since t0 number
// at least want in each form, and returns them (at timeout too).
func (p *l2Prober) waitAnnouncements(ip, mac string, t0 time.Time, timeout time.Duration, want map[string]int) (map[string]int, bool) {
	var got map[string]int
	_, ok := waitFor(p.t.Context(), timeout, func() bool {
		got = p.announcements(ip, mac, t0)
		for form, n := range want {
			if got[form] < n {
				return false
			}
		}
		return true
	})
	return got, ok
}
