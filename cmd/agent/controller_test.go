package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/onehop/onehop/external/leases"
	"github.com/onehop/onehop/test/cluster"
)

// `agent controller`, wired as deploy/ runs it: it reads the node agents'
// config file (the API server from clientConnection.kubeconfig, the pools
// from the external section), authenticates as the controller's service
// account under deploy/base's RBAC, wins the leader Lease in the Lease
// namespace, writes a LoadBalancer IP to a Service's status, and releases
// the Lease when it stops.
func TestControllerCommand(t *testing.T) {
	admin, conf := controllerSetup(t, "onehop-controller-test", `  pools: [{name: main, addresses: ["192.0.2.10"]}]
`)
	const leaseNS = "onehop-leases"
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	var logs strings.Builder
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	healthz := ln.Addr().String()
	ln.Close()
	go func() {
		done <- controllerCmd(runCtx, []string{"--config", conf, "--identity", "ctl-a", "--healthz-bind-address", healthz}, &logs)
	}()
	// end stops the controller (once) and returns its log and error.
	var runErr error
	stopped := false
	end := func() string {
		if !stopped {
			stop()
			runErr = <-done
			stopped = true
		}
		return logs.String()
	}
	t.Cleanup(func() { end() })

	if _, err := admin.CoreV1().Services("default").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}}},
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var ips []string
	deadline := time.Now().Add(30 * time.Second)
	for !slices.Equal(ips, []string{"192.0.2.10"}) {
		if time.Now().After(deadline) {
			t.Fatalf("web's status has %v, want 192.0.2.10; controller log:\n%s", ips, end())
		}
		time.Sleep(50 * time.Millisecond)
		s, err := admin.CoreV1().Services("default").Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ips = nil
		for _, in := range s.Status.LoadBalancer.Ingress {
			ips = append(ips, in.IP)
		}
	}
	l, err := admin.CoordinationV1().Leases(leaseNS).Get(ctx, leases.AllocatorLeaseName, metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != "ctl-a" {
		t.Fatalf("leader Lease %s/%s: %+v, %v; want held by ctl-a", leaseNS, leases.AllocatorLeaseName, l, err)
	}
	// The leader, renewing its Lease, is healthy.
	resp, err := http.Get("http://" + healthz + "/healthz")
	if err != nil {
		t.Fatalf("/healthz: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(body) != "ok" {
		t.Errorf("/healthz of the leader: %d %q", resp.StatusCode, body)
	}
	// Its /metrics, on the same port, count the pool's one address as used
	// (no node agent has these in a split install).
	for _, want := range []string{`onehop_allocator_addresses_in_use_total{pool="main"} 1`, `onehop_allocator_addresses_total{pool="main"} 1`} {
		deadline := time.Now().Add(10 * time.Second)
		for {
			resp, err := http.Get("http://" + healthz + "/metrics")
			if err != nil {
				t.Fatalf("/metrics: %v", err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if strings.Contains(string(body), want+"\n") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the leader's /metrics lack %q:\n%s", want, body)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	log := end()
	if runErr != nil {
		t.Fatalf("agent controller: %v\n%s", runErr, log)
	}
	l, err = admin.CoordinationV1().Leases(leaseNS).Get(ctx, leases.AllocatorLeaseName, metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "" {
		t.Errorf("after a clean stop the leader Lease is %+v, %v; want released", l.Spec, err)
	}
	if strings.Contains(strings.ToLower(log), "forbidden") {
		t.Errorf("the controller was refused a request:\n%s", log)
	}
}

// controllerSetup starts a control plane with deploy/base's RBAC and writes
// a config file for `agent controller` with pod's identity: a split install
// (separateController, Leases in onehop-leases) plus the lines of extra
// (indented, inside the external section). It returns the admin client and
// the file's path.
func controllerSetup(t *testing.T, pod, extra string) (kubernetes.Interface, string) {
	t.Helper()
	if os.Getenv(cluster.EnvBinDir) == "" {
		t.Skipf("needs a control plane: set %s (make test does)", cluster.EnvBinDir)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cp, err := cluster.Start(ctx, cluster.Options{}) // loopback of this namespace
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.Stop)
	if err := cp.ApplyRBAC(ctx); err != nil {
		t.Fatal(err)
	}
	id, err := cp.PodIdentity(ctx, cluster.AgentNamespace, cluster.ControllerServiceAccount, pod, "")
	if err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(t.TempDir(), "config.conf")
	if err := os.WriteFile(conf, fmt.Appendf(nil, `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: %s
---
apiVersion: onehop.io/v1alpha1
kind: OnehopConfiguration
externalIPCIDRs: [203.0.113.0/24]
external:
  separateController: true
  leaseNamespace: onehop-leases
%s`, id.Kubeconfig, extra), 0o644); err != nil {
		t.Fatal(err)
	}
	admin, err := cp.Client()
	if err != nil {
		t.Fatal(err)
	}
	return admin, conf
}
