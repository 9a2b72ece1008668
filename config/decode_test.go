package config

import (
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
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

// configMapFile returns the file key of the ConfigMap in path, as a
// ConfigMap volume would hold it.
func configMapFile(t *testing.T, path, key string) string {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var cm corev1.ConfigMap
	if err := yaml.UnmarshalStrict(raw, &cm); err != nil {
		t.Fatal(err)
	}
	data, ok := cm.Data[key]
	if !ok {
		t.Fatalf("%s has no %s", path, key)
	}
	return data
}

// kubeadm's ConfigMap, mounted as kube-proxy's DaemonSet mounts it, loads
// unchanged: kube-proxy's defaults, nothing to warn about.
func TestConfigKubeadmConfigMap(t *testing.T) {
	path := writeConfig(t, configMapFile(t, "testdata/kubeadm-configmap.yaml", "config.conf"))

	fc, warnings, err := LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(warnings) != 0 {
		t.Errorf("warnings for kubeadm's defaults: %q", warnings)
	}
	want := &File{
		Path:               path,
		HealthzBindAddress: ptrTo("0.0.0.0:10256"),
		MetricsBindAddress: ptrTo("127.0.0.1:10249"),
		ClusterCIDRs:       []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")},
		Dataplane:          ptrTo(DataplaneNFTables),
		Kubeconfig:         ptrTo("/var/lib/kube-proxy/kubeconfig.conf"),
		KubeProxyFound:     true,
	}
	if !reflect.DeepEqual(fc, want) {
		t.Errorf("loaded\n%+v\nwant\n%+v", *fc, *want)
	}
}

// The ConfigMap deploy/ ships loads without errors or warnings.
func TestConfigDeployConfigMap(t *testing.T) {
	fc, warnings, err := LoadFile(writeConfig(t, configMapFile(t, "../deploy/base/configmap.yaml", "config.conf")))
	if err != nil {
		t.Fatal(err)
	}
	if len(warnings) != 0 {
		t.Errorf("warnings: %q", warnings)
	}
	if !fc.KubeProxyFound || !fc.OnehopFound || *fc.Dataplane != DataplaneNFTables ||
		*fc.Kubeconfig != "/var/lib/kube-proxy/kubeconfig.conf" || *fc.HealthzBindAddress != "0.0.0.0:10256" {
		t.Errorf("loaded %+v", *fc)
	}
	if ct := fc.Conntrack.resolve(ConntrackDefaults()); ct != ConntrackDefaults() {
		t.Errorf("deploy/'s conntrack settings %+v, want kube-proxy's %+v", ct, ConntrackDefaults())
	}
}

func TestConfigPartialWithOnehopKind(t *testing.T) {
	fc, warnings, err := LoadFile("testdata/partial.conf")
	if err != nil {
		t.Fatal(err)
	}
	if len(warnings) != 0 {
		t.Errorf("unexpected warnings: %q", warnings)
	}
	want := &File{
		Path:               "testdata/partial.conf",
		HostnameOverride:   ptrTo("node-a"),
		HealthzBindAddress: ptrTo("[::]:10256"), // from bindAddress "::"
		MetricsBindAddress: ptrTo("0.0.0.0:9100"),
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"),
			netip.MustParsePrefix("fd00:10:244::/56")},
		NodePortAddresses: &NodePortAddresses{CIDRs: []netip.Prefix{netip.MustParsePrefix("192.168.10.0/24"),
			netip.MustParsePrefix("fd00:1::/64")}},
		Dataplane:     ptrTo(DataplaneIPVS),
		MasqueradeBit: ptrTo[int32](12), // ipvs mode reads iptables.masquerade*
		MasqueradeAll: ptrTo(true),
		SyncPeriod:    ptrTo(10 * time.Second),
		MinSyncPeriod: ptrTo(2 * time.Second),
		IPVSScheduler: ptrTo("wrr"),
		Conntrack: FileConntrack{
			MaxPerCore:            ptrTo[int32](0), // explicit 0: leave the kernel's value
			TCPEstablishedTimeout: ptrTo(time.Duration(0)),
			TCPBeLiberal:          ptrTo(true),
			UDPTimeout:            ptrTo(30 * time.Second),
		},
		DetectLocalMode:  ptrTo("NodeCIDR"),
		Kubeconfig:       ptrTo("/etc/onehop/kubeconfig"),
		QPS:              ptrTo[float32](50),
		Burst:            ptrTo[int32](100),
		LogVerbosity:     ptrTo[uint32](2),
		LogFormat:        ptrTo("json"),
		KubeProxyFound:   true,
		ExternalIPCIDRs:  []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")},
		ServiceProxyName: ptrTo("onehop"),
		External:         []byte(`{"leaseNamespace":"onehop-leases"}`),
		OnehopFound:      true,
	}
	if !reflect.DeepEqual(fc, want) {
		t.Errorf("loaded\n%+v\nwant\n%+v", *fc, *want)
	}
}

// Fields that do not apply are listed, each once; the honoured ones still apply.
func TestConfigIgnoredFieldsWarn(t *testing.T) {
	fc, warnings, err := LoadFile("testdata/ignored.conf")
	if err != nil {
		t.Fatal(err)
	}
	var fields []string
	for _, w := range warnings {
		f, _, _ := strings.Cut(w, ":")
		fields = append(fields, f)
	}
	slices.Sort(fields)
	want := []string{
		"configSyncPeriod", "featureGates", "iptables.localhostNodePorts", "ipvs.scheduler",
		"mode", "nftables.masqueradeBit", "nftables.syncPeriod",
		"portRange", "showHiddenMetricsForVersion", "winkernel.enableDSR",
	}
	if !slices.Equal(fields, want) {
		t.Errorf("warned about %q\nwant %q\nwarnings: %q", fields, want, warnings)
	}
	if fc.SyncPeriod == nil || *fc.SyncPeriod != 20*time.Second {
		t.Errorf("mode iptables: syncPeriod = %v, want iptables.syncPeriod 20s", fc.SyncPeriod)
	}
	if fc.MasqueradeBit != nil {
		t.Errorf("masqueradeBit = %d from the nftables section, want unset in iptables mode", *fc.MasqueradeBit)
	}
	if *fc.Dataplane != DataplaneNFTables {
		t.Errorf("dataplane = %s, want nftables for mode iptables", *fc.Dataplane)
	}
}

func TestConfigOnehopOnly(t *testing.T) {
	path := writeConfig(t, "apiVersion: onehop.io/v1alpha1\nkind: OnehopConfiguration\n"+
		"dataplane: ipvs\nexternalIPCIDRs: []\nsourceRangesOnNodePorts: true\n")
	fc, warnings, err := LoadFile(path)
	if err != nil || len(warnings) != 0 {
		t.Fatalf("err %v, warnings %q", err, warnings)
	}
	if !fc.OnehopFound || fc.KubeProxyFound || *fc.Dataplane != DataplaneIPVS ||
		fc.ExternalIPCIDRs == nil || len(fc.ExternalIPCIDRs) != 0 || !*fc.SourceRangesOnNodePorts {
		t.Errorf("loaded %+v", *fc)
	}
}

// OnehopConfiguration's dataplane wins over the kube-proxy mode, and says so.
func TestConfigDataplaneOverridesMode(t *testing.T) {
	path := writeConfig(t, "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"+
		"mode: ipvs\n---\napiVersion: onehop.io/v1alpha1\nkind: OnehopConfiguration\ndataplane: nftables\n")
	fc, warnings, err := LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if *fc.Dataplane != DataplaneNFTables {
		t.Errorf("dataplane = %s, want nftables", *fc.Dataplane)
	}
	if len(warnings) != 1 || !strings.HasPrefix(warnings[0], "mode: ipvs overridden") {
		t.Errorf("warnings = %q, want one about mode", warnings)
	}
}

func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name    string
		file    string // a testdata file, or content when it has a newline
		wantAll []string
	}{
		{"unknown field", "testdata/unknown-field.conf",
			[]string{"testdata/unknown-field.conf:6:", `unknown field "conntrack.maxPerCor"`, "KubeProxyConfiguration"}},
		{"wrong apiVersion", "testdata/wrong-apiversion.conf",
			[]string{"testdata/wrong-apiversion.conf:1:", `"kubeproxy.config.k8s.io/v1beta1"`, "kubeproxy.config.k8s.io/v1alpha1"}},
		{"YAML syntax", "testdata/syntax-error.conf",
			[]string{"testdata/syntax-error.conf:8:", "invalid YAML"}},
		{"unknown field in onehop kind", "apiVersion: onehop.io/v1alpha1\nkind: OnehopConfiguration\ndataPlane: ipvs\n",
			[]string{"config.conf:3:", `unknown field "dataPlane"`, "OnehopConfiguration"}},
		{"field in the wrong case", "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nClusterCIDR: 10.0.0.0/8\n",
			[]string{"config.conf:3:", `unknown field "ClusterCIDR"`}},
		{"duplicate key", "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: ipvs\nmode: nftables\n",
			[]string{"config.conf:", `"mode"`}},
		{"wrong type", "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nclientConnection:\n  qps: lots\n",
			[]string{"config.conf:4:", "clientConnection.qps"}},
		{"unknown kind", "apiVersion: v1\nkind: ConfigMap\n",
			[]string{"config.conf:1:", `unknown kind "ConfigMap"`}},
		{"no kind", "clusterCIDR: 10.0.0.0/8\n",
			[]string{"config.conf:1:", "no kind"}},
		{"empty", "# nothing\n",
			[]string{"config.conf:", "no KubeProxyConfiguration or OnehopConfiguration"}},
		{"bad CIDR", "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nclusterCIDR: 10.0.0.0/33\n",
			[]string{"clusterCIDR", `"10.0.0.0/33"`}},
		{"two CIDRs of one family", "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nclusterCIDR: 10.0.0.0/8,11.0.0.0/8\n",
			[]string{"clusterCIDR", "different IP families"}},
		{"bad mode", "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: userspace\n",
			[]string{`mode "userspace"`}},
		{"windows mode", "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: kernelspace\n",
			[]string{"Windows-only"}},
		{"bad dataplane", "apiVersion: onehop.io/v1alpha1\nkind: OnehopConfiguration\ndataplane: ebpf\n",
			[]string{`dataplane "ebpf"`}},
		{"masquerade bit", "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: nftables\nnftables:\n  masqueradeBit: 32\n",
			[]string{"nftables.masqueradeBit 32"}},
		{"bad healthz address", "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nhealthzBindAddress: localhost:x\n",
			[]string{"healthzBindAddress", "localhost:x"}},
		{"primary mixed with CIDRs", "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nnodePortAddresses: [primary, 10.0.0.0/8]\n",
			[]string{"nodePortAddresses", "primary"}},
		{"bridge mode", "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\ndetectLocalMode: BridgeInterface\ndetectLocal:\n  bridgeInterface: cbr0\n",
			[]string{"detectLocalMode", "BridgeInterface", "ClusterCIDR", "NodeCIDR"}},
		{"interface prefix mode", "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\ndetectLocalMode: InterfaceNamePrefix\n",
			[]string{"detectLocalMode", "InterfaceNamePrefix", "ClusterCIDR", "NodeCIDR"}},
		{"negative conntrack timeout", "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nconntrack:\n  udpTimeout: -1s\n",
			[]string{"conntrack.udpTimeout"}},
		{"min above max sync period", "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\niptables:\n  syncPeriod: 1s\n  minSyncPeriod: 5s\n",
			[]string{"iptables.minSyncPeriod 5s"}},
		{"two of a kind", "apiVersion: onehop.io/v1alpha1\nkind: OnehopConfiguration\n---\napiVersion: onehop.io/v1alpha1\nkind: OnehopConfiguration\n",
			[]string{"config.conf:4:", "a second OnehopConfiguration"}},
		{"missing file", "testdata/no-such.conf", []string{"testdata/no-such.conf", "no such file"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := tc.file
			if strings.Contains(tc.file, "\n") {
				path = writeConfig(t, tc.file)
			}
			fc, _, err := LoadFile(path)
			if err == nil {
				t.Fatalf("loaded %+v, want an error", *fc)
			}
			msg := err.Error()
			t.Log(msg)
			if !strings.Contains(msg, path) {
				t.Errorf("error %q does not name the file %s", msg, path)
			}
			for _, w := range tc.wantAll {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q lacks %q", msg, w)
				}
			}
		})
	}
}

// A key the external section does not know stops the agent at start, with
// its name, instead of being ignored.
func TestConfigExternalUnknownKey(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.conf")
	conf := "apiVersion: onehop.io/v1alpha1\nkind: OnehopConfiguration\nexternal:\n  pools: [{name: main, addresses: [192.0.2.10]}]\n  communities: [\"65000:1\"]\n"
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := LoadFile(path); err == nil || !strings.Contains(err.Error(), `"communities"`) {
		t.Errorf("loaded a config with external.communities: %v", err)
	}
}
