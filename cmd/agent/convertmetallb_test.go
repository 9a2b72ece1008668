package main

import (
	"bytes"
	"strings"
	"testing"
)

// convert-metallb prints the resources on stdout and the warnings on
// stderr; warnings fail it only with --strict.
func TestConvertMetalLBCmd(t *testing.T) {
	const lossy = "../../external/metallb/testdata/metallb-bgp.yaml"
	const clean = "../../external/metallb/testdata/metallb-l2.yaml"
	for _, tc := range []struct {
		args     []string
		code     int
		out, err string
	}{
		{args: []string{"-f", lossy}, out: "kind: BGPPeer", err: "warning: BGPAdvertisement metallb-system/tenant-a: aggregationLength 24 left out"},
		{args: []string{"-f", lossy, "--strict"}, code: 1, out: "kind: BGPPeer", err: "could not be carried over (--strict)"},
		{args: []string{"--strict", "-f", clean, "-f", lossy}, code: 1, out: "name: first-pool"},
		{args: []string{"--strict", "-f", clean}, out: "kind: L2Advertisement"},
		{args: []string{"-f", "no-such-file.yaml"}, code: 1, err: "no-such-file.yaml"},
		{args: []string{clean}, code: 1, err: "name files with -f"},
	} {
		var stdout, stderr bytes.Buffer
		code := realMain(append([]string{"convert-metallb"}, tc.args...), &stdout, &stderr)
		if code != tc.code || !strings.Contains(stdout.String(), tc.out) || !strings.Contains(stderr.String(), tc.err) {
			t.Errorf("agent convert-metallb %v: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", tc.args, code, tc.code, stdout.String(), stderr.String())
		}
		if tc.code == 0 && strings.Contains(tc.args[len(tc.args)-1], "l2") && stderr.Len() > 0 {
			t.Errorf("agent convert-metallb %v: stderr %q, want none", tc.args, stderr.String())
		}
	}
}
