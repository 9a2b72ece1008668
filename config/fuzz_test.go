package config

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// FuzzConfigFile loads fuzzed --config files: a KubeProxyConfiguration, an
// OnehopConfiguration, or both. Loading must not panic, and what it accepts
// must be in range: a known dataplane, a masquerade bit of 0 to 31,
// non-negative periods with minSyncPeriod at most syncPeriod, and an
// external section that is JSON for package external to decode.
func FuzzConfigFile(f *testing.F) {
	for _, name := range []string{"ignored.conf", "partial.conf", "syntax-error.conf", "unknown-field.conf", "wrong-apiversion.conf"} {
		b, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	raw, err := os.ReadFile("testdata/kubeadm-configmap.yaml")
	if err != nil {
		f.Fatal(err)
	}
	var cm corev1.ConfigMap
	if err := yaml.Unmarshal(raw, &cm); err != nil {
		f.Fatal(err)
	}
	f.Add([]byte(cm.Data["config.conf"]))
	f.Add([]byte("apiVersion: onehop.io/v1alpha1\nkind: OnehopConfiguration\ndataplane: ipvs\nexternalIPCIDRs: [203.0.113.0/24]\n" +
		"external:\n  pools:\n  - name: main\n    addresses: [192.0.2.0/24]\n  bgp:\n    asn: 64513\n    peers: [{address: 10.0.0.1, asn: 64512}]\n" +
		"---\napiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: ipvs\nipvs:\n  scheduler: mh\n  syncPeriod: 30s\n"))
	path := filepath.Join(f.TempDir(), "config.conf")
	f.Fuzz(func(t *testing.T, data []byte) {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		fc, _, err := LoadFile(path)
		if err != nil {
			return
		}
		if fc == nil {
			t.Fatal("no error and no configuration")
		}
		if fc.Dataplane != nil && *fc.Dataplane != DataplaneNFTables && *fc.Dataplane != DataplaneIPVS {
			t.Errorf("dataplane %q", *fc.Dataplane)
		}
		if fc.MasqueradeBit != nil && (*fc.MasqueradeBit < 0 || *fc.MasqueradeBit > 31) {
			t.Errorf("masquerade bit %d", *fc.MasqueradeBit)
		}
		if fc.SyncPeriod != nil && *fc.SyncPeriod <= 0 {
			t.Errorf("sync period %v", *fc.SyncPeriod)
		}
		if fc.MinSyncPeriod != nil && (*fc.MinSyncPeriod < 0 || (fc.SyncPeriod != nil && *fc.MinSyncPeriod > *fc.SyncPeriod)) {
			t.Errorf("min sync period %v (sync period %v)", *fc.MinSyncPeriod, fc.SyncPeriod)
		}
		if fc.External != nil && !json.Valid(fc.External) {
			t.Errorf("external section is not JSON: %q", fc.External)
		}
	})
}
