package node

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/onehop/onehop/test/cluster"
)

// Overlay writes a kustomization that takes deploy/ (or variant, e.g.
// "deploy/ipvs") as shipped and changes only what every installation
// changes: the agent's image and the API server's address in
// kubeconfig.conf; patches are added as the migration guide adds its own.
// Because the nodes are network namespaces of one host, config.conf's
// conntrack.maxPerCore and min are set to 0 as well (hostConntrackOff): the
// DaemonSet's init container sets only the nodes' own conntrack timeouts.
// It returns the overlay's directory, for kubectl -k.
func (c *Cluster) Overlay(t testing.TB, variant, image string, patches ...map[string]any) string {
	t.Helper()
	return c.OverlayConfig(t, variant, image, nil, patches...)
}

// OverlayConfig is Overlay with edit applied to config.conf too, as an
// operator edits the ConfigMap; nil leaves it as shipped.
func (c *Cluster) OverlayConfig(t testing.TB, variant, image string, edit func(conf string) (string, error), patches ...map[string]any) string {
	t.Helper()
	root, err := cluster.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	base, err := os.ReadFile(filepath.Join(root, "deploy", "base", "configmap.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var cm struct {
		Data map[string]string `json:"data"`
	}
	if err := yaml.Unmarshal(base, &cm); err != nil {
		t.Fatal(err)
	}
	kubeconfig := cm.Data["kubeconfig.conf"]
	const shipped = "server: https://kube-apiserver.invalid:6443"
	if !strings.Contains(kubeconfig, shipped) {
		t.Fatalf("deploy/base/configmap.yaml: kubeconfig.conf has no %q to replace", shipped)
	}
	kubeconfig = strings.Replace(kubeconfig, shipped, "server: "+c.CP.URL, 1)
	name, tag, ok := strings.Cut(image, ":")
	if !ok {
		t.Fatalf("image %q has no tag", image)
	}
	conf, err := hostConntrackOff(cm.Data["config.conf"])
	if err == nil && edit != nil {
		conf, err = edit(conf)
	}
	if err != nil {
		t.Fatalf("deploy/base/configmap.yaml: config.conf: %v", err)
	}
	patch, err := json.Marshal([]map[string]any{{"op": "replace", "path": "/data/kubeconfig.conf", "value": kubeconfig},
		{"op": "replace", "path": "/data/config.conf", "value": conf}})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	// kustomize takes only relative paths to other kustomizations.
	rel, err := filepath.Rel(dir, filepath.Join(root, variant))
	if err != nil {
		t.Fatal(err)
	}
	k := map[string]any{
		"apiVersion": "kustomize.config.k8s.io/v1beta1",
		"kind":       "Kustomization",
		"resources":  []string{rel},
		"images":     []map[string]string{{"name": "onehop/agent", "newName": name, "newTag": tag}},
		"patches":    append([]map[string]any{{"target": map[string]string{"kind": "ConfigMap", "name": "onehop"}, "patch": string(patch)}}, patches...),
	}
	b, err := yaml.Marshal(k)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// hostConntrackSetting is a conntrack setting of config.conf that changes
// the whole host: nf_conntrack_max and the hash table size.
var hostConntrackSetting = regexp.MustCompile(`(?m)^([ \t]*)(maxPerCore|min): *\d+ *$`)

// hostConntrackOff sets conntrack.maxPerCore and min to 0 in conf, so that
// nothing run on a node raises the host's nf_conntrack_max or resizes its
// conntrack hash table. Both must be there: left out, they would take
// kube-proxy's defaults.
func hostConntrackOff(conf string) (string, error) {
	found := map[string]bool{}
	out := hostConntrackSetting.ReplaceAllStringFunc(conf, func(line string) string {
		m := hostConntrackSetting.FindStringSubmatch(line)
		found[m[2]] = true
		return m[1] + m[2] + ": 0"
	})
	if !found["maxPerCore"] || !found["min"] {
		return "", fmt.Errorf("no conntrack.maxPerCore and conntrack.min to set to 0 (found %v)", found)
	}
	return out, nil
}

// WaitDaemonSet waits until the DaemonSet's newest generation runs Ready on
// every node.
func (c *Cluster) WaitDaemonSet(t testing.TB, namespace, name string, limit time.Duration) *appsv1.DaemonSet {
	t.Helper()
	client := c.Client(t)
	var ds *appsv1.DaemonSet
	poll(t, "DaemonSet "+namespace+"/"+name+" rolled out", limit, func() error {
		var err error
		if ds, err = client.AppsV1().DaemonSets(namespace).Get(context.Background(), name, metav1.GetOptions{}); err != nil {
			return err
		}
		st := ds.Status
		if st.ObservedGeneration < ds.Generation || st.DesiredNumberScheduled != int32(len(c.Nodes)) ||
			st.UpdatedNumberScheduled != st.DesiredNumberScheduled || st.NumberReady != st.DesiredNumberScheduled ||
			st.NumberAvailable != st.DesiredNumberScheduled {
			return fmt.Errorf("status %+v", st)
		}
		return nil
	})
	return ds
}

// WaitDeployment waits until the Deployment's newest generation is fully
// available.
func (c *Cluster) WaitDeployment(t testing.TB, namespace, name string, limit time.Duration) {
	t.Helper()
	client := c.Client(t)
	poll(t, "Deployment "+namespace+"/"+name+" available", limit, func() error {
		d, err := client.AppsV1().Deployments(namespace).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		st := d.Status
		want := int32(1)
		if d.Spec.Replicas != nil {
			want = *d.Spec.Replicas
		}
		if st.ObservedGeneration < d.Generation || st.UpdatedReplicas != want || st.AvailableReplicas != want || st.Replicas != want {
			return fmt.Errorf("status %+v", st)
		}
		return nil
	})
}

// AuditEvent is the part of an apiserver audit event the tests read.
type AuditEvent struct {
	Verb       string `json:"verb"`
	RequestURI string `json:"requestURI"`
	User       struct {
		Username string `json:"username"`
	} `json:"user"`
	ResponseStatus struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
}

// Requests lists the requests of user from the apiserver's audit log.
func (c *Cluster) Requests(t testing.TB, user string) []AuditEvent {
	t.Helper()
	f, err := os.Open(c.CP.AuditLog())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []AuditEvent
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var ev AuditEvent
		if json.Unmarshal(sc.Bytes(), &ev) != nil {
			continue
		}
		if ev.User.Username == user {
			out = append(out, ev)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// Forbidden lists the requests of user that the apiserver refused with 403.
// It fails t when user made no request at all: a check that looked at the
// wrong name would otherwise always pass.
func (c *Cluster) Forbidden(t testing.TB, user string) []AuditEvent {
	t.Helper()
	all := c.Requests(t, user)
	if len(all) == 0 {
		t.Fatalf("no request of %s in the audit log", user)
	}
	var out []AuditEvent
	for _, ev := range all {
		if ev.ResponseStatus.Code == 403 {
			out = append(out, ev)
		}
	}
	return out
}

// applyTestdata applies testdata/<file> with the API server's placeholder
// address replaced by the real one.
func (c *Cluster) applyTestdata(t testing.TB, file string) {
	t.Helper()
	root, err := cluster.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "test", "node", "testdata", file))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), file)
	if err := os.WriteFile(path, []byte(strings.ReplaceAll(string(b), "https://kube-apiserver.invalid:6443", c.CP.URL)), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := c.Kubectl(context.Background(), "apply", "-f", path); err != nil {
		t.Fatalf("kubectl apply -f %s: %v\n%s", file, err, out)
	}
}

// DeployKubeProxy runs kube-proxy's DaemonSet (testdata/kube-proxy.yaml,
// image BuildKubeProxyImage) and waits until it is Ready everywhere.
func (c *Cluster) DeployKubeProxy(t testing.TB) {
	t.Helper()
	c.applyTestdata(t, "kube-proxy.yaml")
	c.WaitDaemonSet(t, "kube-system", "kube-proxy", 3*time.Minute)
}

// DeployDNS runs CoreDNS as kube-dns (testdata/coredns.yaml, image
// BuildCoreDNSImage) and waits until it is available; it needs a Service
// proxy in place.
func (c *Cluster) DeployDNS(t testing.TB) {
	t.Helper()
	c.applyTestdata(t, "coredns.yaml")
	c.WaitDeployment(t, "kube-system", "coredns", 3*time.Minute)
}
