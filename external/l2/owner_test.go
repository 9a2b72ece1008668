package l2

import (
	"net/netip"
	"testing"
)

func TestOwnerSpreadsAndMovesOnlyTheLeaversIPs(t *testing.T) {
	nodes := []string{"a", "b", "c", "d"}
	count := map[string]int{}
	before := map[netip.Addr]string{}
	ip := netip.MustParseAddr("192.0.2.0")
	for range 400 {
		o := Owner(ip, nodes)
		if o2 := Owner(ip, []string{"d", "c", "b", "a"}); o2 != o {
			t.Fatalf("%s: owner depends on order: %s vs %s", ip, o, o2)
		}
		count[o]++
		before[ip] = o
		ip = ip.Next()
	}
	for _, n := range nodes {
		if count[n] < 60 { // 100 expected each
			t.Errorf("node %s owns %d of 400 IPs: %v", n, count[n], count)
		}
	}
	moved := 0
	for ip, o := range before {
		n := Owner(ip, []string{"a", "b", "d"}) // c left
		if o != "c" && n != o {
			t.Fatalf("%s moved from %s to %s though its owner stayed", ip, o, n)
		}
		if o == "c" {
			moved++
			if n == "c" {
				t.Fatalf("%s still owned by the leaver", ip)
			}
		}
	}
	if Owner(ip, nil) != "" {
		t.Error("owner among no nodes")
	}
	t.Logf("spread %v; %d IPs moved when c left", count, moved)
}
