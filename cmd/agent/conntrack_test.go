package main

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/config"
)

func TestConntrackSysctls(t *testing.T) {
	c := config.ConntrackDefaults()
	got := map[string]int{}
	fields := map[string]string{}
	for _, s := range conntrackSysctls(c, 2) {
		got[s.Name] = s.Value
		fields[s.Name] = s.Field
		if s.OnlyRaise != strings.HasSuffix(s.Name, "nf_conntrack_max") {
			t.Errorf("%s: OnlyRaise %v", s.Name, s.OnlyRaise)
		}
	}
	want := map[string]int{"net/netfilter/nf_conntrack_max": 131072, // 2 x 32768 < min
		"net/netfilter/nf_conntrack_tcp_timeout_established": 86400,
		"net/netfilter/nf_conntrack_tcp_timeout_close_wait":  3600}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("defaults on 2 CPUs: %v, want %v", got, want)
	}
	if fields["net/netfilter/nf_conntrack_max"] != "conntrack.min (--conntrack-min)" {
		t.Errorf("nf_conntrack_max from %q, want conntrack.min", fields["net/netfilter/nf_conntrack_max"])
	}
	if m := nfConntrackMax(c, 8); m != 262144 {
		t.Errorf("8 CPUs: nf_conntrack_max %d, want 262144", m)
	}
	c = config.Conntrack{MaxPerCore: 0, Min: 1 << 20, UDPTimeout: 30 * time.Second, UDPStreamTimeout: 2 * time.Minute, TCPBeLiberal: true}
	got = map[string]int{}
	for _, s := range conntrackSysctls(c, 64) {
		got[s.Name] = s.Value
	}
	want = map[string]int{"net/netfilter/nf_conntrack_udp_timeout": 30, "net/netfilter/nf_conntrack_udp_timeout_stream": 120,
		"net/netfilter/nf_conntrack_tcp_be_liberal": 1}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("maxPerCore 0 leaves nf_conntrack_max: %v, want %v", got, want)
	}
}

// A setting the user gave that cannot be written stops the agent; one left
// at kube-proxy's default is logged and the agent runs on. (The real
// kernel's refusals are in dataplane's TestWriteSysctls.)
func TestApplyConntrackExplicitIsFatal(t *testing.T) {
	root := t.TempDir()
	est := filepath.Join(root, "net/netfilter/nf_conntrack_tcp_timeout_established")
	if err := os.MkdirAll(filepath.Dir(est), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(est, []byte("432000\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// close_wait is missing: writing it fails.
	c := config.Conntrack{TCPEstablishedTimeout: 2 * time.Hour, TCPCloseWaitTimeout: time.Hour}
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	if err := applyConntrack(context.Background(), log, root, c, map[string]bool{}, 2); err != nil {
		t.Errorf("defaults only: %v", err)
	}
	if !strings.Contains(logs.String(), "level=ERROR") || !strings.Contains(logs.String(), "conntrack.tcpCloseWaitTimeout") {
		t.Errorf("defaults that cannot be written are not logged:\n%s", logs.String())
	}
	if b, _ := os.ReadFile(est); strings.TrimSpace(string(b)) != "7200" {
		t.Errorf("established = %s, want 7200", b)
	}
	err := applyConntrack(context.Background(), log, root, c, map[string]bool{"conntrack-tcp-timeout-close-wait": true}, 2)
	if err == nil || !strings.Contains(err.Error(), "conntrack.tcpCloseWaitTimeout (--conntrack-tcp-timeout-close-wait)") ||
		!strings.Contains(err.Error(), "net.netfilter.nf_conntrack_tcp_timeout_close_wait") {
		t.Errorf("explicit setting that cannot be written: err %v", err)
	}
}
