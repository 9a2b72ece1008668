package node

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/onehop/onehop/test/nsutil"
)

// Node is one kubelet with its own containerd, in its own network
// namespace (named like the Node object) and a private mount namespace:
// what containerd and the kubelet mount (container root filesystems, pod
// network namespaces, volumes) vanishes with the node.
type Node struct {
	// Name is the Node's name and its network namespace's.
	Name string
	// IP is the node's address on the cluster's network.
	IP string
	// PodCIDR is the range its pods get addresses from.
	PodCIDR string
	// Dir holds its configuration, containerd's root and the kubelet's.
	Dir string
	// Socket is containerd's gRPC socket.
	Socket string

	ns         *nsutil.NS
	cgroupRoot string
	holder     *nsutil.Process
	containerd *nsutil.Process
	kubelet    *nsutil.Process
}

// cgroupControllers are the cgroup v1 hierarchies the kubelet uses, and
// the unified (v2) one runc also writes on a hybrid host; the node's cgroup
// root is created in each (and removed at the end).
var cgroupControllers = []string{"cpu", "cpuacct", "cpuset", "memory", "pids", "devices", "freezer", "blkio", "systemd", "unified"}

// startNode brings up node i of c: addresses, routes, mounts, containerd,
// kubelet. It returns once containerd answers; the Node object turns Ready
// later (Cluster.WaitReady).
func (c *Cluster) startNode(t *testing.T, i int) *Node {
	t.Helper()
	ns := nsutil.New(t, "kn-")
	n := &Node{
		Name:       ns.Name,
		IP:         fmt.Sprintf("10.250.0.%d", 11+i),
		PodCIDR:    fmt.Sprintf("10.244.%d.0/24", i+1),
		Dir:        filepath.Join(c.dir, ns.Name),
		ns:         ns,
		cgroupRoot: "/" + ns.Name,
	}
	n.Socket = filepath.Join(n.Dir, "containerd.sock")
	for _, d := range []string{"cni", "containerd", "kubelet", "pod-logs", "volume-plugins"} {
		if err := os.MkdirAll(filepath.Join(n.Dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	nsutil.Veth(t, c.cpNS, "n"+strconv.Itoa(i), nil, ns, "eth0", []string{n.IP + "/24"})
	c.cpNS.IP(t, "link", "set", "n"+strconv.Itoa(i), "master", "br0")
	ns.IP(t, "route", "add", "default", "via", cpAddress)
	c.cpNS.IP(t, "route", "add", n.PodCIDR, "via", n.IP)
	ns.Sysctl(t, "net.ipv4.ip_forward", "1")

	if err := os.WriteFile(filepath.Join(n.Dir, "cni", "10-onehop-test.conflist"), []byte(cniConfig(n.PodCIDR)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(n.Dir, "containerd.toml"), []byte(containerdConfig(n)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(n.Dir, "resolv.conf"), []byte("nameserver "+cpAddress+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c.makeCgroups(t, n)

	// The holder owns the node's mount namespace: a slave of the host's
	// (host mounts show through, the node's stay inside), with its own
	// tmpfs where containerd and the CNI plugins keep host-wide state.
	script := "set -e; for d in /run/containerd /var/lib/cni /run/netns; do mkdir -p $d; mount -t tmpfs -o mode=0755 tmpfs $d; done; exec sleep infinity"
	n.holder = c.start(t, n.Name+"-holder", "nsenter", "--net="+filepath.Join(nsutil.Dir, n.Name), "unshare", "--mount", "--propagation", "slave", "sh", "-c", script)
	c.waitFor(t, "node mount namespace", 10*time.Second, func() error {
		out, err := exec.Command("nsenter", "--target", strconv.Itoa(n.holder.Pid()), "--mount", "findmnt", "-n", "/run/netns").CombinedOutput()
		if err != nil || !strings.Contains(string(out), "tmpfs") {
			return fmt.Errorf("mounts not ready: %v %s", err, out)
		}
		return nil
	})
	enter := []string{"nsenter", "--target", strconv.Itoa(n.holder.Pid()), "--net", "--mount", "--"}
	n.containerd = c.start(t, n.Name+"-containerd", append(enter, "containerd", "--config", filepath.Join(n.Dir, "containerd.toml"))...)
	c.waitFor(t, "containerd", time.Minute, func() error {
		if ok, err := n.containerd.Exited(); ok {
			return fmt.Errorf("containerd exited: %v\n%s", err, n.containerd.Tail(2000))
		}
		out, err := exec.Command("ctr", "--address", n.Socket, "version").CombinedOutput()
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	})
	for _, img := range c.images {
		out, err := exec.Command("ctr", "--address", n.Socket, "-n", "k8s.io", "images", "import", "--snapshotter", "overlayfs", img).CombinedOutput()
		if err != nil {
			t.Fatalf("import %s into %s: %v\n%s", img, n.Name, err, out)
		}
	}

	kubeconfig := filepath.Join(n.Dir, "kubelet.kubeconfig")
	if err := c.CP.WriteKubeconfig(kubeconfig, "", "system:node:"+n.Name, "system:nodes"); err != nil {
		t.Fatal(err)
	}
	cert, key := filepath.Join(n.Dir, "kubelet.crt"), filepath.Join(n.Dir, "kubelet.key")
	if err := c.CP.IssueServing(cert, key, n.Name, net.ParseIP(n.IP)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(n.Dir, "kubelet.yaml"), []byte(c.kubeletConfig(n, cert, key)), 0o644); err != nil {
		t.Fatal(err)
	}
	n.kubelet = c.start(t, n.Name+"-kubelet", append(enter, filepath.Join(c.Bin, "kubelet"),
		"--config="+filepath.Join(n.Dir, "kubelet.yaml"),
		"--kubeconfig="+kubeconfig,
		"--root-dir="+filepath.Join(n.Dir, "kubelet"),
		"--hostname-override="+n.Name,
		"--node-ip="+n.IP,
		"--v=2",
	)...)
	t.Cleanup(func() { c.stopNode(n) })
	return n
}

// stopNode ends every process of the node: the pods (through their
// cgroups), the kubelet, containerd and its shims (through the network
// namespace), the mount namespace's holder; then removes its cgroups.
func (c *Cluster) stopNode(n *Node) {
	if n.kubelet != nil {
		n.kubelet.Kill()
	}
	killCgroup(n.cgroupRoot)
	nsutil.KillAll(context.Background(), n.Name)
	if n.containerd != nil {
		n.containerd.Kill()
	}
	if n.holder != nil {
		n.holder.Kill()
	}
	killCgroup(n.cgroupRoot)
	removeCgroups(n.cgroupRoot)
}

// makeCgroups creates the node's cgroup root in every hierarchy (the
// kubelet wants it to exist); cpuset needs its cpus and mems set first.
func (c *Cluster) makeCgroups(t *testing.T, n *Node) {
	t.Helper()
	for _, ctrl := range cgroupControllers {
		base := filepath.Join("/sys/fs/cgroup", ctrl)
		if _, err := os.Stat(base); err != nil {
			continue
		}
		dir := filepath.Join(base, n.cgroupRoot)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatalf("cgroup %s: %v", dir, err)
		}
		if ctrl == "cpuset" {
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				b, err := os.ReadFile(filepath.Join(base, f))
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
					t.Fatalf("%s: %v", filepath.Join(dir, f), err)
				}
			}
		}
	}
}

// killCgroup SIGKILLs every process in the node's pids cgroup tree.
func killCgroup(root string) {
	_ = filepath.WalkDir(filepath.Join("/sys/fs/cgroup/pids", root), func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
			return nil
		}
		b, _ := os.ReadFile(p)
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		return nil
	})
}

// removeCgroups removes the node's cgroup directories, deepest first,
// retrying while killed processes are still exiting.
func removeCgroups(root string) {
	for _, ctrl := range cgroupControllers {
		base := filepath.Join("/sys/fs/cgroup", ctrl, root)
		var dirs []string
		_ = filepath.WalkDir(base, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			for try := 0; try < 50; try++ {
				if err := syscall.Rmdir(dirs[i]); err == nil || os.IsNotExist(err) {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
	}
}

// sweepCgroups ends the pods and removes the cgroups of nodes whose test
// binary is gone (killed before its cleanup ran): the node's processes
// died with it, but its pods' processes live in their own cgroups.
func sweepCgroups() {
	stale := map[string]bool{}
	for _, ctrl := range cgroupControllers {
		entries, _ := os.ReadDir(filepath.Join("/sys/fs/cgroup", ctrl))
		for _, e := range entries {
			if e.IsDir() && strings.Contains(e.Name(), "-kn-") && nsutil.OwnerGone(e.Name()) {
				stale[e.Name()] = true
			}
		}
	}
	for name := range stale {
		killCgroup("/" + name)
		removeCgroups("/" + name)
	}
}

// Ready reports whether the Node object says Ready.
func Ready(node *corev1.Node) bool {
	for _, cond := range node.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

// WaitReady waits until every node is Ready and pods can be created.
func (c *Cluster) WaitReady(t *testing.T) {
	t.Helper()
	client := c.Client(t)
	c.waitFor(t, "nodes Ready", 3*time.Minute, func() error {
		for _, n := range c.Nodes {
			if ok, err := n.kubelet.Exited(); ok {
				t.Fatalf("kubelet of %s exited: %v\n%s", n.Name, err, n.kubelet.Tail(6000))
			}
			node, err := client.CoreV1().Nodes().Get(context.Background(), n.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if !Ready(node) {
				return fmt.Errorf("node %s not Ready: %v", n.Name, node.Status.Conditions)
			}
		}
		// kube-controller-manager has made the default ServiceAccount,
		// without which no pod is admitted.
		_, err := client.CoreV1().ServiceAccounts("default").Get(context.Background(), "default", metav1.GetOptions{})
		return err
	})
}

// Exec runs argv in the node's network namespace (the host's mounts).
func (n *Node) Exec(ctx context.Context, argv ...string) (string, error) {
	return nsutil.Exec(ctx, n.Name, argv...)
}

// KubeletLog is the tail of the kubelet's log.
func (n *Node) KubeletLog(bytes int) string { return n.kubelet.Tail(bytes) }

// WaitPodRunning waits until the pod runs with all containers ready and
// returns its IP.
func WaitPodRunning(t testing.TB, client kubernetes.Interface, namespace, name string) string {
	t.Helper()
	var ip string
	poll(t, "pod "+namespace+"/"+name+" running", 3*time.Minute, func() error {
		pod, err := client.CoreV1().Pods(namespace).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if pod.Status.Phase != corev1.PodRunning || !podReady(pod) {
			return fmt.Errorf("%+v", pod.Status)
		}
		ip = pod.Status.PodIP
		return nil
	})
	return ip
}

func podReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
