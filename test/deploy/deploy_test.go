// Package deploy_test validates the manifests in deploy/ with a server-side
// dry run against a real kube-apiserver.
package deploy_test

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/onehop/onehop/test/cluster"
	"github.com/onehop/onehop/test/nsutil"
)

func repoRoot(t *testing.T) string {
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("repository root not found from %s", file)
	}
	return root
}

// kubectl apply -k deploy/ (and the ipvs overlay) is accepted by a real
// apiserver with strict field validation; a manifest with an unknown field
// is not, so the check can fail.
func TestManifestsServerSideDryRun(t *testing.T) {
	cp, name := cluster.StartTest(t, "dep", "192.0.2.3")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	bin, err := cluster.Binaries(ctx)
	if err != nil {
		t.Fatal(err)
	}
	kubectl := func(args ...string) (string, error) {
		return nsutil.Exec(ctx, name, append([]string{filepath.Join(bin, "kubectl"), "--kubeconfig", cp.Kubeconfig}, args...)...)
	}
	root := repoRoot(t)
	// A dry run creates nothing, so the objects in the Lease namespace
	// would find no namespace: it is created for real first.
	if out, err := kubectl("create", "namespace", "onehop-leases"); err != nil {
		t.Fatalf("create namespace onehop-leases: %v\n%s", err, out)
	}
	for _, dir := range []string{"deploy", "deploy/ipvs"} {
		out, err := kubectl("apply", "-k", filepath.Join(root, dir), "--dry-run=server", "--validate=strict")
		if err != nil {
			t.Errorf("kubectl apply -k %s --dry-run=server: %v\n%s", dir, err, out)
			continue
		}
		t.Logf("%s:\n%s", dir, out)
		for _, want := range []string{"daemonset.apps/onehop ", "deployment.apps/onehop-controller ",
			"customresourcedefinition.apiextensions.k8s.io/loadbalancerippools.onehop.io ",
			"customresourcedefinition.apiextensions.k8s.io/bgppeers.onehop.io ",
			"customresourcedefinition.apiextensions.k8s.io/bgpadvertisements.onehop.io ",
			"customresourcedefinition.apiextensions.k8s.io/l2advertisements.onehop.io ",
			"customresourcedefinition.apiextensions.k8s.io/loadbalancerwebhooks.onehop.io ",
			"validatingadmissionpolicy.admissionregistration.k8s.io/onehop-node-own-lease ",
			"validatingadmissionpolicybinding.admissionregistration.k8s.io/onehop-node-own-lease "} {
			if !strings.Contains(out, want) {
				t.Errorf("%s: no %s in the dry run:\n%s", dir, strings.TrimSpace(want), out)
			}
		}
	}

	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n  namespace: kube-system\ndata: {}\nnonsense: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := kubectl("apply", "-f", bad, "--dry-run=server", "--validate=strict"); err == nil {
		t.Errorf("a manifest with an unknown field passed the dry run:\n%s", out)
	}
}

// The workloads of deploy/base are bounded and unprivileged where they can
// be: every container has a memory limit (a system-node-critical pod
// without one is the last the kernel's OOM killer picks), and the
// controller, which touches no kernel state, runs as non-root on a
// read-only root filesystem, two replicas with one leader.
func TestWorkloadsAreBounded(t *testing.T) {
	objs, err := cluster.DeployObjects()
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]bool{}
	for _, o := range objs {
		var spec *corev1.PodSpec
		switch o := o.(type) {
		case *appsv1.DaemonSet:
			spec = &o.Spec.Template.Spec
			found["DaemonSet/"+o.Name] = true
		case *appsv1.Deployment:
			spec = &o.Spec.Template.Spec
			found["Deployment/"+o.Name] = true
			if o.Name == "onehop-controller" {
				if o.Spec.Replicas == nil || *o.Spec.Replicas != 2 {
					t.Errorf("%s: replicas %v, want 2", o.Name, o.Spec.Replicas)
				}
				sc := spec.Containers[0].SecurityContext
				if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
					sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.Capabilities == nil || len(sc.Capabilities.Add) > 0 {
					t.Errorf("%s: securityContext %+v, want non-root, read-only root, no privilege escalation, no capabilities", o.Name, sc)
				}
				if spec.ServiceAccountName != cluster.ControllerServiceAccount {
					t.Errorf("%s runs as %q, want %s", o.Name, spec.ServiceAccountName, cluster.ControllerServiceAccount)
				}
			}
		default:
			continue
		}
		for _, c := range spec.Containers {
			if c.Resources.Limits.Memory().IsZero() {
				t.Errorf("%T %s: container %s has no memory limit", o, spec.ServiceAccountName, c.Name)
			}
		}
	}
	for _, w := range []string{"DaemonSet/onehop", "Deployment/onehop-controller"} {
		if !found[w] {
			t.Errorf("deploy/base has no %s", w)
		}
	}
}

// Both variants name a release tag or a digest for the agent's image, never
// latest or nothing: a node that pulls a moved tag runs another agent than
// its neighbours.
func TestImagesArePinned(t *testing.T) {
	root := repoRoot(t)
	for _, dir := range []string{"deploy/base", "deploy/ipvs"} {
		b, err := os.ReadFile(filepath.Join(root, dir, "kustomization.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		var k struct {
			Images []struct {
				Name   string `json:"name"`
				NewTag string `json:"newTag"`
				Digest string `json:"digest"`
			} `json:"images"`
		}
		if err := yaml.Unmarshal(b, &k); err != nil {
			t.Fatalf("%s: %v", dir, err)
		}
		if len(k.Images) == 0 {
			t.Errorf("%s/kustomization.yaml sets no image", dir)
		}
		for _, img := range k.Images {
			if img.Digest == "" && (img.NewTag == "" || strings.HasPrefix(img.NewTag, "latest")) {
				t.Errorf("%s: image %s has tag %q and no digest", dir, img.Name, img.NewTag)
			}
		}
	}
}
