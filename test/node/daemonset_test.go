package node_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/onehop/onehop/test/node"
	"github.com/onehop/onehop/test/nsutil"
)

// The shipped manifests on two real kubelets: `kubectl apply -k` of an
// overlay that changes only the image and the API server's address. The
// DaemonSet turns Ready under its own ServiceAccount and securityContext,
// Services work through it to real pods (from a node, from a pod, from
// outside through a NodePort), the kubernetes Service reaches the API
// server, a rolling update of the DaemonSet loses no request, and no
// request of the agents or the controller was forbidden.
func TestShippedDaemonSet(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	bin, err := node.Binaries(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	images := []string{filepath.Join(dir, "agnhost.tar"), filepath.Join(dir, "agent-v1.tar"), filepath.Join(dir, "agent-v2.tar")}
	if err := node.BuildAgnhostImage(bin, images[0]); err != nil {
		t.Fatal(err)
	}
	for i, tag := range []string{"v1", "v2"} {
		if err := node.BuildAgentImage(ctx, "onehop.test/agent:"+tag, images[1+i]); err != nil {
			t.Fatal(err)
		}
	}
	hostConntrack := readHostConntrack(t)
	c := node.Start(t, node.Options{Nodes: 2, Images: images})
	client := c.Client(t)

	out, err := c.Kubectl(ctx, "apply", "-k", c.Overlay(t, "deploy", "onehop.test/agent:v1"))
	if err != nil {
		t.Fatalf("kubectl apply -k: %v\n%s", err, out)
	}
	began := time.Now()
	c.WaitDaemonSet(t, "kube-system", "onehop", 3*time.Minute)
	t.Logf("DaemonSet Ready on %d nodes %v after apply", len(c.Nodes), time.Since(began).Round(time.Millisecond))
	c.WaitDeployment(t, "kube-system", "onehop-controller", 3*time.Minute)

	// The privileged init container set each node's own conntrack
	// timeouts (kube-proxy's, from the ConfigMap), and nothing of the
	// host's: the harness sets maxPerCore and min to 0.
	for _, n := range c.Nodes {
		for sysctl, want := range map[string]string{"nf_conntrack_tcp_timeout_close_wait": "3600", "nf_conntrack_tcp_timeout_established": "86400"} {
			out, err := nsutil.Exec(ctx, n.Name, "cat", "/proc/sys/net/netfilter/"+sysctl)
			if err != nil || strings.TrimSpace(out) != want {
				t.Errorf("node %s: %s = %q (%v), want %s", n.Name, sysctl, strings.TrimSpace(out), err, want)
			}
		}
	}
	if now := readHostConntrack(t); now != hostConntrack {
		t.Errorf("the host's conntrack table changed: %v, before %v", now, hostConntrack)
	}

	for i, n := range c.Nodes {
		createWebPod(ctx, t, client, fmt.Sprintf("web-%d", i), n.Name)
	}
	svc := createWebService(ctx, t, client)
	vip := svc.Spec.ClusterIP
	nodePort := svc.Spec.Ports[0].NodePort
	for i := range c.Nodes {
		node.WaitPodRunning(t, client, "default", fmt.Sprintf("web-%d", i))
	}

	// From each node, the cluster IP reaches both pods.
	for _, n := range c.Nodes {
		seen := map[string]bool{}
		for try := 0; try < 200 && len(seen) < 2; try++ {
			if out, err := nsutil.Exec(ctx, n.Name, "curl", "-sS", "--max-time", "2", "http://"+vip+"/hostname"); err == nil {
				seen[strings.TrimSpace(out)] = true
			}
			time.Sleep(50 * time.Millisecond)
		}
		if !seen["web-0"] || !seen["web-1"] {
			t.Errorf("from node %s, %s reached only %v", n.Name, vip, seen)
		}
	}
	// From outside the nodes, the NodePort of each node answers.
	for _, n := range c.Nodes {
		url := "http://" + n.IP + ":" + strconv.Itoa(int(nodePort)) + "/hostname"
		if out, err := nsutil.Exec(ctx, c.Netns, "curl", "-sS", "--max-time", "5", "--retry", "5", "--retry-all-errors", url); err != nil || !strings.HasPrefix(strings.TrimSpace(out), "web-") {
			t.Errorf("NodePort %s: %v: %q", url, err, out)
		}
	}
	// From a pod: the Service, and the kubernetes Service to the API server.
	isWeb := func(out string) bool { return strings.HasPrefix(strings.TrimSpace(out), "web-") }
	if out, err := c.KubectlUntil(ctx, 3, isWeb, "exec", "web-0", "--", "curl", "-sS", "--max-time", "5", "http://"+vip+"/hostname"); err != nil {
		t.Errorf("pod web-0 to %s: %v: %q", vip, err, out)
	}
	isVersion := func(out string) bool { return strings.Contains(out, "gitVersion") }
	if out, err := c.KubectlUntil(ctx, 3, isVersion, "exec", "web-1", "--", "curl", "-sSk", "--max-time", "5", "https://10.96.0.1/version"); err != nil {
		t.Errorf("pod web-1 to the kubernetes Service: %v: %q", err, out)
	}

	checkAgentSecurity(t, c)

	// A rolling update of the DaemonSet under request loops: from each
	// node to the cluster IP, and from outside to a NodePort.
	var loops []*node.RequestLoop
	for _, n := range c.Nodes {
		loops = append(loops, node.StartRequestLoop(n.Name, "http://"+vip+"/hostname", 20*time.Millisecond))
	}
	loops = append(loops, node.StartRequestLoop(c.Netns, "http://"+c.Nodes[0].IP+":"+strconv.Itoa(int(nodePort))+"/hostname", 20*time.Millisecond))
	time.Sleep(time.Second)
	if out, err := c.Kubectl(ctx, "-n", "kube-system", "set", "image", "daemonset/onehop", "agent=onehop.test/agent:v2"); err != nil {
		t.Fatalf("set image: %v\n%s", err, out)
	}
	began = time.Now()
	ds := c.WaitDaemonSet(t, "kube-system", "onehop", 5*time.Minute)
	t.Logf("rolling update to v2 done in %v (generation %d)", time.Since(began).Round(time.Millisecond), ds.Generation)
	time.Sleep(2 * time.Second)
	for i, l := range loops {
		ok, answers, failures := l.Stop()
		t.Logf("request loop %d: %d answered %v, %d failed", i, ok, answers, len(failures))
		if len(failures) > 0 {
			t.Errorf("request loop %d during the rolling update: %d failed: %v", i, len(failures), failures[:min(len(failures), 10)])
		}
		if ok < 50 {
			t.Errorf("request loop %d: only %d answers", i, ok)
		}
	}

	for _, sa := range []string{"onehop", "onehop-controller"} {
		if refused := c.Forbidden(t, "system:serviceaccount:kube-system:"+sa); len(refused) > 0 {
			t.Errorf("the API server refused %d requests of %s, e.g. %+v: its RBAC lacks what it does", len(refused), sa, refused[0])
		}
	}
}

// readHostConntrack reads the host's conntrack table limits, which only the
// initial network namespace may change: nf_conntrack_max and the hash
// table size.
func readHostConntrack(t *testing.T) [2]string {
	t.Helper()
	var out [2]string
	for i, path := range []string{"/proc/sys/net/netfilter/nf_conntrack_max", "/sys/module/nf_conntrack/parameters/hashsize"} {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = strings.TrimSpace(string(b))
	}
	return out
}

// checkAgentSecurity finds each node's agent process and checks what the
// shipped securityContext promises: only NET_ADMIN and NET_RAW, no new
// privileges, a read-only root filesystem.
func checkAgentSecurity(t *testing.T, c *node.Cluster) {
	t.Helper()
	const want = 1<<12 | 1<<13 // CAP_NET_ADMIN, CAP_NET_RAW
	for _, n := range c.Nodes {
		pids, err := nsutil.Exec(context.Background(), "", "ip", "netns", "pids", n.Name)
		if err != nil {
			t.Fatalf("pids of %s: %v", n.Name, err)
		}
		found := false
		for _, pid := range strings.Fields(pids) {
			cmdline, _ := os.ReadFile("/proc/" + pid + "/cmdline")
			args := strings.Split(string(cmdline), "\x00")
			if len(args) < 2 || args[0] != "/usr/local/bin/agent" || args[1] != "run" {
				continue
			}
			found = true
			status, err := os.ReadFile("/proc/" + pid + "/status")
			if err != nil {
				t.Fatal(err)
			}
			fields := map[string]string{}
			for _, line := range strings.Split(string(status), "\n") {
				if k, v, ok := strings.Cut(line, ":"); ok {
					fields[k] = strings.TrimSpace(v)
				}
			}
			if eff, _ := strconv.ParseUint(fields["CapEff"], 16, 64); eff != want {
				t.Errorf("agent on %s: CapEff %s, want %x (NET_ADMIN, NET_RAW)", n.Name, fields["CapEff"], want)
			}
			if fields["NoNewPrivs"] != "1" {
				t.Errorf("agent on %s: NoNewPrivs %q", n.Name, fields["NoNewPrivs"])
			}
			mounts, err := os.ReadFile("/proc/" + pid + "/mounts")
			if err != nil {
				t.Fatal(err)
			}
			for _, line := range strings.Split(string(mounts), "\n") {
				f := strings.Fields(line)
				if len(f) >= 4 && f[1] == "/" && !strings.HasPrefix(f[3], "ro") {
					t.Errorf("agent on %s: root filesystem mounted %s", n.Name, f[3])
				}
			}
		}
		if !found {
			t.Errorf("no agent process in node %s", n.Name)
		}
	}
}

func createWebPod(ctx context.Context, t *testing.T, client kubernetes.Interface, name, nodeName string) {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{"app": "web"}},
		Spec: corev1.PodSpec{
			NodeName: nodeName,
			Containers: []corev1.Container{{
				Name: "web", Image: node.AgnhostImage, ImagePullPolicy: corev1.PullNever,
				Args:           []string{"netexec", "--http-port=8080"},
				ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/hostname", Port: intstr.FromInt32(8080)}}, PeriodSeconds: 1},
			}},
			TerminationGracePeriodSeconds: new(int64),
		},
	}
	if _, err := client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func createWebService(ctx context.Context, t *testing.T, client kubernetes.Interface) *corev1.Service {
	t.Helper()
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeNodePort,
			Selector: map[string]string{"app": "web"},
			Ports:    []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}},
		},
	}
	svc, err := client.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return svc
}
