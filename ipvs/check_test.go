package ipvs

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestCheckCleanup: Check notices a deleted dummy interface and a deleted
// jump (with a canary period of 0, every Check runs the iptables canary);
// a full sync repairs them; Cleanup removes onehop's state and leaves an
// IPVS service someone else made.
func TestCheckCleanup(t *testing.T) {
	n := newTestNet(t, 1)
	b := n.backend(testCfg, WithCanaryPeriod(0))
	s := web(1)
	s.Portals[0].NodePort = 30082
	b.sync(true, s)
	check := func() error { return b.do(func(b *Backend) error { return b.Check(context.Background()) }) }
	run := func(args ...string) string {
		out, err := exec.Command("ip", append([]string{"netns", "exec", n.node}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	run("ip", "link", "del", DummyInterface)
	if err := check(); err == nil {
		t.Error("Check missed the deleted dummy interface")
	}
	b.sync(true, s)
	if err := check(); err != nil {
		t.Errorf("after repair: %v", err)
	}
	run("iptables", "-t", "nat", "-D", "POSTROUTING", "-m", "comment", "--comment", jumpComment, "-j", chainPostrouting)
	if err := check(); err == nil {
		t.Error("Check missed the deleted jump")
	}
	b.sync(true, s)
	if pod, _ := n.get(t, n.client, vip+":80"); pod != "pod-1" {
		t.Errorf("after repair: %s", pod)
	}
	run("ipvsadm", "-A", "-t", "192.0.2.1:80", "-s", "rr")
	if err := b.do(func(b *Backend) error { return b.Cleanup(context.Background()) }); err != nil {
		t.Fatal(err)
	}
	left := run("ipvsadm", "-Ln")
	if !strings.Contains(left, "192.0.2.1:80") || strings.Contains(left, vip) || strings.Contains(left, ":30082") {
		t.Errorf("after Cleanup:\n%s", left)
	}
	if out, _ := exec.Command("ip", "-n", n.node, "link", "show", DummyInterface).CombinedOutput(); !strings.Contains(string(out), "does not exist") {
		t.Errorf("dummy interface left: %s", out)
	}
	for _, table := range []string{"nat", "filter"} {
		if rules := run("iptables", "-t", table, "-S"); strings.Contains(rules, "ONEHOP") {
			t.Errorf("%s table after Cleanup:\n%s", table, rules)
		}
	}
}

// TestCheckCanaryPeriod: within the canary period Check runs no iptables
// command (it would take the node's xtables lock), so a deleted jump is
// noticed only once the period is over; the dummy interface, read over
// netlink, is checked every time.
func TestCheckCanaryPeriod(t *testing.T) {
	n := newTestNet(t, 1)
	const period = 1500 * time.Millisecond
	b := n.backend(testCfg, WithCanaryPeriod(period))
	b.sync(true, web(1))
	check := func() error { return b.do(func(b *Backend) error { return b.Check(context.Background()) }) }
	canaries := func() int { b.b.mu.Lock(); defer b.b.mu.Unlock(); return b.b.canaries }
	if out, err := exec.Command("ip", "netns", "exec", n.node, "iptables", "-t", "nat", "-D", "POSTROUTING",
		"-m", "comment", "--comment", jumpComment, "-j", chainPostrouting).CombinedOutput(); err != nil {
		t.Fatalf("deleting the jump: %v\n%s", err, out)
	}
	start := time.Now()
	for range 20 {
		err := check()
		if time.Since(start) < period && err != nil {
			t.Fatalf("Check within the canary period after a full sync: %v", err)
		}
	}
	if time.Since(start) < period && canaries() != 0 {
		t.Errorf("%d iptables canaries within the period after a full sync, want 0", canaries())
	}
	// Once the period is over, the next Check runs the canary and sees it.
	time.Sleep(time.Until(start.Add(period)))
	if err := check(); err == nil {
		t.Error("Check after the canary period missed the deleted jump")
	}
	if canaries() != 1 {
		t.Errorf("%d canaries, want 1", canaries())
	}
	// It keeps looking (the failed canary does not count as whole).
	if err := check(); err == nil {
		t.Error("the second Check after a failed canary passed")
	}
	b.sync(true, web(1))
	if err := check(); err != nil {
		t.Errorf("after repair: %v", err)
	}
	// The dummy interface is read on every Check.
	if out, err := exec.Command("ip", "-n", n.node, "link", "del", DummyInterface).CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if err := check(); err == nil {
		t.Error("Check missed the deleted dummy interface within the canary period")
	}
}
