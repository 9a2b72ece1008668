package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// The flag and the file accept the same nodePortAddresses and resolve them
// the same way: before, the flag took "primary,10.0.0.0/8" and the file
// refused it.
func TestNodePortAddressesFlagAndFileAgree(t *testing.T) {
	for _, tc := range []struct {
		values []string
		ok     bool
		want   *nodePortAddresses
	}{
		{[]string{"primary"}, true, &nodePortAddresses{Primary: true}},
		{[]string{"primary", "10.0.0.0/8"}, false, nil},
		{[]string{"10.0.0.0/8", "primary"}, false, nil},
		{[]string{"0.0.0.0/0", "::/0"}, true, &nodePortAddresses{CIDRs: []netip.Prefix{
			netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}}},
		{[]string{"192.168.10.7/24"}, true, &nodePortAddresses{CIDRs: []netip.Prefix{netip.MustParsePrefix("192.168.10.0/24")}}},
		{[]string{"10.0.0.0/33"}, false, nil},
		{[]string{"eth0"}, false, nil},
	} {
		flagF, _, flagErr := parseRunFlags([]string{"--nodeport-addresses", strings.Join(tc.values, ",")}, io.Discard)
		var y bytes.Buffer
		y.WriteString("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nnodePortAddresses:\n")
		for _, v := range tc.values {
			y.WriteString("- " + v + "\n")
		}
		fileF, _, fileErr := parseRunFlags([]string{"--config", writeConfig(t, y.String())}, io.Discard)
		if (flagErr == nil) != tc.ok || (fileErr == nil) != tc.ok {
			t.Errorf("%q: flag err %v, file err %v; want ok=%v from both", tc.values, flagErr, fileErr, tc.ok)
			continue
		}
		if !tc.ok {
			for _, err := range []error{flagErr, fileErr} {
				if !strings.Contains(err.Error(), "nodePortAddresses (--nodeport-addresses)") {
					t.Errorf("%q: error %q does not name the field and the flag", tc.values, err)
				}
			}
			continue
		}
		if !reflect.DeepEqual(flagF.nodePorts, tc.want) || !reflect.DeepEqual(fileF.nodePorts, tc.want) {
			t.Errorf("%q: flag %+v, file %+v, want %+v", tc.values, flagF.nodePorts, fileF.nodePorts, tc.want)
		}
	}
}

// Conntrack settings: kube-proxy's defaults, the file over them, the
// command line over the file, and the same refusal of negative values.
func TestConntrackSettingsMerge(t *testing.T) {
	f, _, err := parseRunFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if f.conntrack != conntrackDefaults() || len(f.explicit) != 0 {
		t.Errorf("defaults: %+v, explicit %v", f.conntrack, f.explicit)
	}
	path := writeConfig(t, "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"+
		"conntrack:\n  maxPerCore: 0\n  tcpEstablishedTimeout: 2h\n  udpTimeout: 30s\n  tcpBeLiberal: true\n")
	f, _, err = parseRunFlags([]string{"--config", path, "--conntrack-udp-timeout", "45s"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := conntrackConfig{MaxPerCore: 0, Min: 131072, TCPEstablishedTimeout: 2 * time.Hour,
		TCPCloseWaitTimeout: time.Hour, TCPBeLiberal: true, UDPTimeout: 45 * time.Second}
	if f.conntrack != want {
		t.Errorf("merged %+v, want %+v", f.conntrack, want)
	}
	for _, flag := range []string{"conntrack-max-per-core", "conntrack-tcp-timeout-established", "conntrack-udp-timeout",
		"conntrack-tcp-be-liberal"} {
		if !f.explicit[flag] {
			t.Errorf("%s not marked as given", flag)
		}
	}
	if f.explicit["conntrack-tcp-timeout-close-wait"] {
		t.Error("close-wait marked as given; it is kube-proxy's default")
	}
	for _, args := range [][]string{{"--conntrack-udp-timeout", "-1s"},
		{"--config", writeConfig(t, "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nconntrack:\n  udpTimeout: -1s\n")}} {
		if _, _, err := parseRunFlags(args, io.Discard); err == nil || !strings.Contains(err.Error(), "conntrack.udpTimeout (--conntrack-udp-timeout)") {
			t.Errorf("%q: err %v", args, err)
		}
	}
}

func TestConntrackSysctls(t *testing.T) {
	c := conntrackDefaults()
	got := map[string]int{}
	fields := map[string]string{}
	for _, s := range c.sysctls(2) {
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
	if m := c.nfConntrackMax(8); m != 262144 {
		t.Errorf("8 CPUs: nf_conntrack_max %d, want 262144", m)
	}
	c = conntrackConfig{MaxPerCore: 0, Min: 1 << 20, UDPTimeout: 30 * time.Second, UDPStreamTimeout: 2 * time.Minute, TCPBeLiberal: true}
	got = map[string]int{}
	for _, s := range c.sysctls(64) {
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
	c := conntrackConfig{TCPEstablishedTimeout: 2 * time.Hour, TCPCloseWaitTimeout: time.Hour}
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

// Every setting with both a flag and a field is checked by the same
// function: both refuse the same bad values and resolve good ones alike.
func TestFlagsAndFileShareValidation(t *testing.T) {
	const head = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
	for _, tc := range []struct {
		name  string
		flags []string
		file  string
		ok    bool
	}{
		{"cluster CIDRs of one family", []string{"--cluster-cidr", "10.0.0.0/8,11.0.0.0/8"}, "clusterCIDR: 10.0.0.0/8,11.0.0.0/8\n", false},
		{"dual-stack cluster CIDRs", []string{"--cluster-cidr", "10.0.0.0/8,fd00::/48"}, "clusterCIDR: 10.0.0.0/8,fd00::/48\n", true},
		{"min sync above sync", []string{"--sync-period", "1s", "--min-sync-period", "5s"}, "iptables:\n  syncPeriod: 1s\n  minSyncPeriod: 5s\n", false},
		{"negative qps", []string{"--kube-api-qps", "-1"}, "clientConnection:\n  qps: -1\n", false},
		{"log format", []string{"--log-format", "xml"}, "logging:\n  format: xml\n", false},
		{"bad healthz address", []string{"--healthz-bind-address", "localhost:x"}, "healthzBindAddress: localhost:x\n", false},
		{"bare healthz IP", []string{"--healthz-bind-address", "127.0.0.1"}, "healthzBindAddress: 127.0.0.1\n", true},
		{"detect-local NodeCIDR", []string{"--detect-local-mode", "NodeCIDR"}, "detectLocalMode: NodeCIDR\n", true},
		{"detect-local bridge", []string{"--detect-local-mode", "BridgeInterface"}, "detectLocalMode: BridgeInterface\n", false},
		{"detect-local typo", []string{"--detect-local-mode", "nodecidr"}, "detectLocalMode: nodecidr\n", false},
		{"negative conntrack min", []string{"--conntrack-min", "-1"}, "conntrack:\n  min: -1\n", false},
		{"oom score", []string{"--oom-score-adj", "-1001"}, "oomScoreAdj: -1001\n", false},
	} {
		flagF, _, flagErr := parseRunFlags(tc.flags, io.Discard)
		fileF, _, fileErr := parseRunFlags([]string{"--config", writeConfig(t, head+tc.file)}, io.Discard)
		if (flagErr == nil) != tc.ok || (fileErr == nil) != tc.ok {
			t.Errorf("%s: flag err %v, file err %v; want ok=%v from both", tc.name, flagErr, fileErr, tc.ok)
			continue
		}
		if tc.ok && (flagF.clusterCIDR != fileF.clusterCIDR || flagF.healthzAddr != fileF.healthzAddr ||
			flagF.detectLocalMode != fileF.detectLocalMode) {
			t.Errorf("%s: flag resolved %+v, file %+v", tc.name, *flagF, *fileF)
		}
	}
}
