package l2

import (
	"crypto/sha256"
	"encoding/binary"
	"net/netip"
	"strings"
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

// Weight is the hash Owner always used: SHA-256 over the address's bytes,
// a zero byte and the node's name, written as three pieces.
func TestWeightIsTheOwnerHash(t *testing.T) {
	for _, ip := range []netip.Addr{netip.MustParseAddr("192.0.2.7"), netip.MustParseAddr("::ffff:192.0.2.7"), netip.MustParseAddr("2001:db8::7")} {
		for _, n := range []string{"a", "node-0001", strings.Repeat("n", 80)} {
			h := sha256.New()
			h.Write(ip.Unmap().AsSlice())
			h.Write([]byte{0})
			h.Write([]byte(n))
			if want := binary.BigEndian.Uint64(h.Sum(nil)); Weight(ip, n) != want {
				t.Errorf("Weight(%s, %s) = %x, want %x", ip, n, Weight(ip, n), want)
			}
		}
	}
	if !Outranks(2, "b", 1, "a") || Outranks(1, "a", 2, "b") || !Outranks(1, "a", 1, "b") || Outranks(1, "b", 1, "a") {
		t.Error("Outranks: higher weight first, then the lower name")
	}
}
