package dataplane

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

const (
	sysctlEstablished = "net/netfilter/nf_conntrack_tcp_timeout_established"
	sysctlCloseWait   = "net/netfilter/nf_conntrack_tcp_timeout_close_wait"
	sysctlUDP         = "net/netfilter/nf_conntrack_udp_timeout"
	sysctlBeLiberal   = "net/netfilter/nf_conntrack_tcp_be_liberal"
	sysctlMax         = "net/netfilter/nf_conntrack_max"
)

func readSysctl(t *testing.T, ns *testNS, name string) int {
	t.Helper()
	var out string
	if ns == nil {
		b, err := os.ReadFile("/proc/sys/" + name)
		if err != nil {
			t.Fatal(err)
		}
		out = string(b)
	} else {
		out = ns.run(t, "cat", "/proc/sys/"+name)
	}
	n, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// The conntrack sysctls are written in the caller's network namespace,
// only when they differ; nf_conntrack_max is only raised, and where the
// kernel refuses (nf_conntrack_max outside the initial namespace) the
// error names the setting and the sysctl.
func TestWriteSysctls(t *testing.T) {
	if _, err := os.Stat("/proc/sys/" + sysctlEstablished); err != nil {
		t.Skipf("no conntrack sysctls on this machine (nf_conntrack not loaded): %v", err)
	}
	ns := newTestNS(t)
	hostEstablished := readSysctl(t, nil, sysctlEstablished)
	want := map[string]int{sysctlEstablished: hostEstablished + 17, sysctlCloseWait: 3600, sysctlUDP: 45, sysctlBeLiberal: 1}
	var list []Sysctl
	for name, v := range want {
		list = append(list, Sysctl{Field: "field-" + name, Name: name, Value: v})
	}
	var changed []SysctlChange
	var err error
	ns.do(t, func() { changed, err = WriteSysctls("/proc/sys", list) })
	if err != nil {
		t.Fatal(err)
	}
	for name, v := range want {
		if got := readSysctl(t, ns, name); got != v {
			t.Errorf("%s = %d in the namespace, want %d", name, got, v)
		}
	}
	if len(changed) != len(want) {
		t.Errorf("changed %+v, want all %d", changed, len(want))
	}
	if got := readSysctl(t, nil, sysctlEstablished); got != hostEstablished {
		t.Fatalf("the host's %s changed from %d to %d", sysctlEstablished, hostEstablished, got)
	}

	// Again: nothing to change.
	ns.do(t, func() { changed, err = WriteSysctls("/proc/sys", list) })
	if err != nil || len(changed) != 0 {
		t.Errorf("second write: changed %+v, err %v; want nothing", changed, err)
	}

	// nf_conntrack_max is read-only outside the initial namespace: a
	// smaller wanted value is no work, a larger one an error naming both.
	cur := readSysctl(t, ns, sysctlMax)
	lower := []Sysctl{{Field: "conntrack.min", Name: sysctlMax, Value: cur - 1, OnlyRaise: true}}
	ns.do(t, func() { changed, err = WriteSysctls("/proc/sys", lower) })
	if err != nil || len(changed) != 0 {
		t.Errorf("lower nf_conntrack_max: changed %+v, err %v; want nothing", changed, err)
	}
	higher := []Sysctl{{Field: "conntrack.maxPerCore", Name: sysctlMax, Value: cur + 1, OnlyRaise: true},
		{Field: "conntrack.udpStreamTimeout", Name: "net/netfilter/nf_conntrack_udp_timeout_stream", Value: 90}}
	ns.do(t, func() { changed, err = WriteSysctls("/proc/sys", higher) })
	if err == nil {
		t.Fatalf("raising nf_conntrack_max in a namespace: no error (changed %+v)", changed)
	}
	t.Log(err)
	for _, s := range []string{"conntrack.maxPerCore", "net.netfilter.nf_conntrack_max", "not permitted"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q lacks %q", err, s)
		}
	}
	if len(changed) != 1 || readSysctl(t, ns, "net/netfilter/nf_conntrack_udp_timeout_stream") != 90 {
		t.Errorf("the sysctl after the failing one was not set: changed %+v", changed)
	}

	// A sysctl the kernel does not have.
	ns.do(t, func() {
		_, err = WriteSysctls("/proc/sys", []Sysctl{{Field: "some.field", Name: "net/netfilter/no_such_sysctl", Value: 1}})
	})
	if err == nil || !strings.Contains(err.Error(), "some.field") || !strings.Contains(err.Error(), "no such sysctl") {
		t.Errorf("missing sysctl: err %v", err)
	}
}

func TestRaiseConntrackHashsize(t *testing.T) {
	f := t.TempDir() + "/hashsize"
	if err := os.WriteFile(f, []byte("65536\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if wrote, err := RaiseConntrackHashsize(f, 262144); err != nil || wrote {
		t.Errorf("hashsize already max/4: wrote %v, err %v", wrote, err)
	}
	if wrote, err := RaiseConntrackHashsize(f, 1<<20); err != nil || !wrote {
		t.Errorf("hashsize below max/4: wrote %v, err %v", wrote, err)
	}
	if b, _ := os.ReadFile(f); string(b) != "262144" {
		t.Errorf("hashsize file holds %q, want 262144", b)
	}
}
