package node

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// The shipped config.conf sets maxPerCore and min; the harness turns both
// to 0 and changes no other line. A config without them is refused: they
// would take kube-proxy's defaults and raise the host's nf_conntrack_max.
func TestHostConntrackOff(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "deploy", "base", "configmap.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var cm struct {
		Data map[string]string `json:"data"`
	}
	if err := yaml.Unmarshal(raw, &cm); err != nil {
		t.Fatal(err)
	}
	conf := cm.Data["config.conf"]
	out, err := hostConntrackOff(conf)
	if err != nil {
		t.Fatal(err)
	}
	before, after := strings.Split(conf, "\n"), strings.Split(out, "\n")
	if len(before) != len(after) {
		t.Fatalf("%d lines became %d", len(before), len(after))
	}
	changed := map[string]bool{}
	for i := range before {
		if before[i] != after[i] {
			changed[strings.TrimSpace(after[i])] = true
		}
	}
	if len(changed) != 2 || !changed["maxPerCore: 0"] || !changed["min: 0"] {
		t.Errorf("changed lines %v, want maxPerCore: 0 and min: 0", changed)
	}
	if _, err := hostConntrackOff("conntrack:\n  maxPerCore: 0\n  tcpCloseWaitTimeout: 1h\n"); err == nil {
		t.Error("a config without conntrack.min passed")
	}
}
