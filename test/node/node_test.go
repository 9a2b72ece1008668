package node_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/onehop/onehop/test/node"
	"github.com/onehop/onehop/test/nsutil"
)

// A node runs a pod from a locally built image, on the CNI bridge, and the
// pod answers at its IP from the control plane's namespace: the kubelet,
// containerd, runc and CNI parts work.
func TestNodeRunsPods(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	bin, err := node.Binaries(ctx)
	if err != nil {
		t.Fatal(err)
	}
	agnhost := filepath.Join(t.TempDir(), "agnhost.tar")
	if err := node.BuildAgnhostImage(bin, agnhost); err != nil {
		t.Fatal(err)
	}
	c := node.Start(t, node.Options{Images: []string{agnhost}})
	client := c.Client(t)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{
				Name: "web", Image: node.AgnhostImage, ImagePullPolicy: corev1.PullNever,
				Args: []string{"netexec", "--http-port=8080"},
				// Ready when it answers, not when the process starts.
				ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/hostname", Port: intstr.FromInt32(8080)}}, PeriodSeconds: 1},
			}},
		},
	}
	if _, err := client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ip := node.WaitPodRunning(t, client, "default", "web")
	out, err := nsutil.Exec(ctx, c.Netns, "curl", "-sS", "--max-time", "5", "http://"+ip+":8080/hostname")
	if err != nil || strings.TrimSpace(out) != "web" {
		t.Fatalf("curl pod %s: %v: %q", ip, err, out)
	}
	// The image's userland works too: a shell and nc, as e2e.test uses them.
	isWeb := func(out string) bool { return strings.TrimSpace(out) == "web" }
	out, err = c.KubectlUntil(ctx, 3, isWeb, "exec", "web", "--", "/bin/sh", "-c", "echo hostName | nc -w 2 127.0.0.1 8080 >/dev/null; curl -s http://127.0.0.1:8080/hostname")
	if err != nil {
		t.Fatalf("kubectl exec: %v: %q", err, out)
	}
}
