package main

import (
	"bytes"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/config"
)

// writeConfig writes content to a file in a fresh directory and returns its path.
func writeConfig(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.conf")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// The flag and the file accept the same nodePortAddresses and resolve them
// the same way: before, the flag took "primary,10.0.0.0/8" and the file
// refused it.
func TestNodePortAddressesFlagAndFileAgree(t *testing.T) {
	for _, tc := range []struct {
		values []string
		ok     bool
		want   *config.NodePortAddresses
	}{
		{[]string{"primary"}, true, &config.NodePortAddresses{Primary: true}},
		{[]string{"primary", "10.0.0.0/8"}, false, nil},
		{[]string{"10.0.0.0/8", "primary"}, false, nil},
		{[]string{"0.0.0.0/0", "::/0"}, true, &config.NodePortAddresses{CIDRs: []netip.Prefix{
			netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}}},
		{[]string{"192.168.10.7/24"}, true, &config.NodePortAddresses{CIDRs: []netip.Prefix{netip.MustParsePrefix("192.168.10.0/24")}}},
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
		if !reflect.DeepEqual(flagF.NodePorts, tc.want) || !reflect.DeepEqual(fileF.NodePorts, tc.want) {
			t.Errorf("%q: flag %+v, file %+v, want %+v", tc.values, flagF.NodePorts, fileF.NodePorts, tc.want)
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
	if f.Conntrack != config.ConntrackDefaults() || len(f.Explicit) != 0 {
		t.Errorf("defaults: %+v, explicit %v", f.Conntrack, f.Explicit)
	}
	path := writeConfig(t, "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"+
		"conntrack:\n  maxPerCore: 0\n  tcpEstablishedTimeout: 2h\n  udpTimeout: 30s\n  tcpBeLiberal: true\n")
	f, _, err = parseRunFlags([]string{"--config", path, "--conntrack-udp-timeout", "45s"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := config.Conntrack{MaxPerCore: 0, Min: 131072, TCPEstablishedTimeout: 2 * time.Hour,
		TCPCloseWaitTimeout: time.Hour, TCPBeLiberal: true, UDPTimeout: 45 * time.Second}
	if f.Conntrack != want {
		t.Errorf("merged %+v, want %+v", f.Conntrack, want)
	}
	for _, flag := range []string{"conntrack-max-per-core", "conntrack-tcp-timeout-established", "conntrack-udp-timeout",
		"conntrack-tcp-be-liberal"} {
		if !f.Explicit[flag] {
			t.Errorf("%s not marked as given", flag)
		}
	}
	if f.Explicit["conntrack-tcp-timeout-close-wait"] {
		t.Error("close-wait marked as given; it is kube-proxy's default")
	}
	for _, args := range [][]string{{"--conntrack-udp-timeout", "-1s"},
		{"--config", writeConfig(t, "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nconntrack:\n  udpTimeout: -1s\n")}} {
		if _, _, err := parseRunFlags(args, io.Discard); err == nil || !strings.Contains(err.Error(), "conntrack.udpTimeout (--conntrack-udp-timeout)") {
			t.Errorf("%q: err %v", args, err)
		}
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
		if tc.ok && (flagF.ClusterCIDR != fileF.ClusterCIDR || flagF.HealthzAddr != fileF.HealthzAddr ||
			flagF.DetectLocalMode != fileF.DetectLocalMode) {
			t.Errorf("%s: flag resolved %+v, file %+v", tc.name, *flagF, *fileF)
		}
	}
}
