package main

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/onehop/onehop/config"
)

// fakeProcSys is a directory laid out as /proc/sys with the conntrack
// sysctls at the kernel's own defaults, or without them (nf_conntrack not
// loaded).
func fakeProcSys(t *testing.T, loaded bool) string {
	t.Helper()
	root := t.TempDir()
	if loaded {
		writeKernelDefaults(t, root)
	}
	return root
}

func writeKernelDefaults(t *testing.T, root string) {
	t.Helper()
	dir := filepath.Join(root, "net", "netfilter")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string]int{"nf_conntrack_max": 262144, "nf_conntrack_tcp_timeout_established": 432000,
		"nf_conntrack_tcp_timeout_close_wait": 60, "nf_conntrack_tcp_be_liberal": 0, "nf_conntrack_udp_timeout": 30,
		"nf_conntrack_udp_timeout_stream": 120} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(strconv.Itoa(v)+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func readSysctl(t *testing.T, root, name string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "net", "netfilter", name))
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func setupFlags(t *testing.T, conf string, args ...string) *config.Settings {
	t.Helper()
	f, _, err := parseRunFlagsAs("agent conntrack-setup", append([]string{"--config", writeConfig(t, conf)}, args...), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// conntrack-setup writes the timeouts of the file and leaves what is 0
// alone: with maxPerCore 0, nf_conntrack_max (host-wide) is not touched.
func TestConntrackSetupWritesTheFilesTimeouts(t *testing.T) {
	f := setupFlags(t, "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"+
		"conntrack:\n  maxPerCore: 0\n  min: 0\n  tcpEstablishedTimeout: 24h\n  tcpCloseWaitTimeout: 1h\n")
	root := fakeProcSys(t, true)
	loads := 0
	err := conntrackSetup(context.Background(), slog.New(slog.DiscardHandler), root, f, 4, func() error { loads++; return nil })
	if err != nil {
		t.Fatal(err)
	}
	if loads != 0 {
		t.Errorf("asked the kernel to load nf_conntrack %d times, though its sysctls were there", loads)
	}
	for name, want := range map[string]int{"nf_conntrack_tcp_timeout_established": 86400, "nf_conntrack_tcp_timeout_close_wait": 3600,
		"nf_conntrack_max": 262144, "nf_conntrack_udp_timeout": 30} {
		if got := readSysctl(t, root, name); got != want {
			t.Errorf("%s = %d, want %d", name, got, want)
		}
	}
}

// The sysctls appear only once nf_conntrack is loaded: conntrack-setup
// asks for it first, and fails, naming the setting, when they still miss.
func TestConntrackSetupLoadsConntrackFirst(t *testing.T) {
	f := setupFlags(t, "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"+
		"conntrack:\n  maxPerCore: 0\n  tcpCloseWaitTimeout: 1h\n")
	root := fakeProcSys(t, false)
	err := conntrackSetup(context.Background(), slog.New(slog.DiscardHandler), root, f, 4, func() error {
		writeKernelDefaults(t, root)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := readSysctl(t, root, "nf_conntrack_tcp_timeout_close_wait"); got != 3600 {
		t.Errorf("close-wait timeout %d after loading, want 3600", got)
	}

	root = fakeProcSys(t, false)
	err = conntrackSetup(context.Background(), slog.New(slog.DiscardHandler), root, f, 4, func() error { return nil })
	if err == nil || !strings.Contains(err.Error(), "conntrack.tcpCloseWaitTimeout") {
		t.Errorf("an explicit setting with no sysctl to write: %v, want an error naming conntrack.tcpCloseWaitTimeout", err)
	}
}

// Every setting 0: nothing to write, and nf_conntrack is not loaded for
// nothing.
func TestConntrackSetupAllZeroDoesNothing(t *testing.T) {
	f := setupFlags(t, "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"+
		"conntrack:\n  maxPerCore: 0\n  tcpEstablishedTimeout: 0s\n  tcpCloseWaitTimeout: 0s\n")
	root := fakeProcSys(t, false)
	err := conntrackSetup(context.Background(), slog.New(slog.DiscardHandler), root, f, 4, func() error {
		t.Error("loaded nf_conntrack with nothing to set")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// The agent's container has a read-only /proc/sys: the conntrack sysctls
// of its --config are set by a privileged init container that reads the
// same file, and the agent stays unprivileged.
func TestDaemonSetSetsConntrackBeforeTheAgent(t *testing.T) {
	raw, err := os.ReadFile("../../deploy/base/daemonset.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var ds appsv1.DaemonSet
	if err := yaml.UnmarshalStrict(raw, &ds); err != nil {
		t.Fatal(err)
	}
	spec := ds.Spec.Template.Spec
	if len(spec.Containers) != 1 || len(spec.InitContainers) != 1 {
		t.Fatalf("%d containers and %d init containers, want one of each", len(spec.Containers), len(spec.InitContainers))
	}
	agent, setup := spec.Containers[0], spec.InitContainers[0]
	if sc := agent.SecurityContext; sc == nil || sc.Privileged == nil || *sc.Privileged {
		t.Errorf("the agent's securityContext %+v, want privileged: false", sc)
	}
	if sc := setup.SecurityContext; sc == nil || sc.Privileged == nil || !*sc.Privileged {
		t.Errorf("%s's securityContext %+v, want privileged: it writes /proc/sys", setup.Name, sc)
	}
	config := func(c corev1.Container) (string, string) {
		for _, a := range c.Args {
			if v, ok := strings.CutPrefix(a, "--config="); ok {
				for _, m := range c.VolumeMounts {
					if strings.HasPrefix(v, m.MountPath+"/") {
						return v, m.Name
					}
				}
				return v, ""
			}
		}
		return "", ""
	}
	agentConf, agentVol := config(agent)
	setupConf, setupVol := config(setup)
	if len(setup.Args) == 0 || setup.Args[0] != "conntrack-setup" || setup.Image != agent.Image ||
		setupConf != agentConf || setupVol != agentVol || agentVol == "" {
		t.Errorf("init container %s runs %s %q (config %s from volume %q), want the agent's image %s running conntrack-setup "+
			"with its --config %s from volume %q", setup.Name, setup.Image, setup.Args, setupConf, setupVol, agent.Image, agentConf, agentVol)
	}
	if setup.Resources.Limits.Memory().IsZero() {
		t.Errorf("%s has no memory limit", setup.Name)
	}
}
