package cluster_test

import (
	"context"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/onehop/onehop/test/cluster"
	"github.com/onehop/onehop/test/nsutil"
)

// The control plane comes up inside a fresh namespace, serves the admin
// kubeconfig (through kubectl too), allocates dual-stack cluster IPs from
// the configured ranges, and Stop leaves no process and no file behind.
func TestControlPlaneInNamespace(t *testing.T) {
	if err := nsutil.Available(); err != nil {
		t.Skipf("skipping: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	name := nsutil.RunID() + "-cpt"
	if err := nsutil.Create(ctx, name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := nsutil.Delete(context.Background(), name); err != nil {
			t.Errorf("delete netns: %v", err)
		}
	})

	// A documentation address on loopback: the apiserver advertises it as
	// the "kubernetes" Service's endpoint (it refuses 127.0.0.1 for that).
	const addr = "192.0.2.2"
	if err := nsutil.IP(ctx, name, "addr", "add", addr+"/32", "dev", "lo"); err != nil {
		t.Fatal(err)
	}

	began := time.Now()
	cp, err := cluster.Start(ctx, cluster.Options{
		Netns:   name,
		Address: addr,
		Log:     slog.New(slog.NewTextHandler(t.Output(), nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.Stop)
	t.Logf("control plane ready in %v", time.Since(began).Round(time.Millisecond))

	client, err := cp.Client()
	if err != nil {
		t.Fatal(err)
	}
	policy := v1.IPFamilyPolicyRequireDualStack
	svc, err := client.CoreV1().Services("default").Create(ctx, &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "dual"},
		Spec: v1.ServiceSpec{
			IPFamilyPolicy: &policy,
			Ports:          []v1.ServicePort{{Port: 80}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(svc.Spec.ClusterIPs) != 2 {
		t.Fatalf("cluster IPs %v, want one per family", svc.Spec.ClusterIPs)
	}
	for i, cidr := range strings.Split(cluster.DefaultServiceCIDRs, ",") {
		if !netip.MustParsePrefix(cidr).Contains(netip.MustParseAddr(svc.Spec.ClusterIPs[i])) {
			t.Errorf("cluster IP %s not in %s", svc.Spec.ClusterIPs[i], cidr)
		}
	}

	bin, err := cluster.Binaries(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out, err := nsutil.Exec(ctx, name, filepath.Join(bin, "kubectl"), "--kubeconfig", cp.Kubeconfig, "get", "--raw", "/readyz")
	if err != nil || strings.TrimSpace(out) != "ok" {
		t.Fatalf("kubectl with the admin kubeconfig: %q, %v", out, err)
	}

	procs := cp.Processes()
	cp.Stop()
	for _, p := range procs {
		if done, _ := p.Exited(); !done {
			t.Errorf("%s still running after Stop", p.Name)
		}
	}
	if _, err := os.Stat(cp.Dir); !os.IsNotExist(err) {
		t.Errorf("%s still exists after Stop (%v)", cp.Dir, err)
	}
}
