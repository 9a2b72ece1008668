package node

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/onehop/onehop/test/cluster"
	"github.com/onehop/onehop/test/nsutil"
)

const (
	// cpAddress is the control plane's address on the cluster network (a
	// bridge in the control plane's namespace, where the nodes plug in).
	cpAddress = "10.250.0.1"
	// ServiceCIDR is the cluster's Service range (IPv4 only).
	ServiceCIDR = "10.96.0.0/16"
	// ClusterCIDR holds every node's pod range.
	ClusterCIDR = "10.244.0.0/16"
	// PauseImage is the sandbox image containerd starts for every pod.
	PauseImage = "registry.k8s.io/pause:3.10.2"
)

// Options shapes a Cluster.
type Options struct {
	// Nodes is the number of kubelets (default 1).
	Nodes int
	// Images are image tarballs (WriteImage) every node imports, besides
	// the pause image.
	Images []string
}

// Cluster is a control plane (etcd, kube-apiserver, kube-controller-manager,
// kube-scheduler) and real nodes, every part in network namespaces that
// go when the test ends. Nothing replaces kube-proxy: the test deploys one.
type Cluster struct {
	CP *cluster.ControlPlane
	// Bin holds the Kubernetes binaries (hack/controlplane.sh node).
	Bin   string
	Nodes []*Node
	// Netns is the control plane's namespace.
	Netns string

	cpNS   *nsutil.NS
	dir    string
	images []string
	procs  []*nsutil.Process
}

// Start runs a cluster for t. It skips t where it cannot run: not root, no
// network namespaces, or no containerd, runc or CNI plugins
// (hack/ci-deps.sh installs them).
func Start(t *testing.T, opts Options) *Cluster {
	t.Helper()
	nsutil.RequireRoot(t)
	for _, bin := range []string{"containerd", "containerd-shim-runc-v2", "runc", "ctr", "nsenter", "unshare", "findmnt"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("skipping: %s not found (hack/ci-deps.sh installs containerd, runc and the CNI plugins)", bin)
		}
	}
	if _, err := os.Stat("/usr/lib/cni/bridge"); err != nil {
		t.Skip("skipping: no CNI bridge plugin in /usr/lib/cni (hack/ci-deps.sh installs containernetworking-plugins)")
	}
	if opts.Nodes == 0 {
		opts.Nodes = 1
	}
	nsutil.Sweep(context.Background(), slog.New(slog.NewTextHandler(t.Output(), nil)))
	sweepCgroups()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	bin, err := Binaries(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c := &Cluster{Bin: bin, dir: t.TempDir()}
	c.cpNS = nsutil.New(t, "kcp-")
	c.Netns = c.cpNS.Name
	c.cpNS.IP(t, "link", "add", "br0", "type", "bridge")
	c.cpNS.IP(t, "addr", "add", cpAddress+"/24", "dev", "br0")
	c.cpNS.IP(t, "link", "set", "br0", "up")
	c.cpNS.Sysctl(t, "net.ipv4.ip_forward", "1")

	cp, err := cluster.Start(ctx, cluster.Options{
		Netns: c.Netns, Address: cpAddress, BinDir: bin, ServiceCIDRs: ServiceCIDR,
		Dir: filepath.Join(c.dir, "cp"), Nodes: true,
		Log: slog.New(slog.NewTextHandler(t.Output(), nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.Stop)
	c.CP = cp
	c.startControllers(t)

	pause := filepath.Join(c.dir, "pause.tar")
	if err := c.pauseImage(ctx, pause); err != nil {
		t.Fatal(err)
	}
	c.images = append([]string{pause}, opts.Images...)
	for i := range opts.Nodes {
		c.Nodes = append(c.Nodes, c.startNode(t, i))
	}
	// Every node reaches every other node's pods directly.
	for _, a := range c.Nodes {
		for _, b := range c.Nodes {
			if a != b {
				a.ns.IP(t, "route", "add", b.PodCIDR, "via", b.IP)
			}
		}
	}
	c.WaitReady(t)
	return c
}

// startControllers runs kube-controller-manager and kube-scheduler in the
// control plane's namespace with the admin identity.
func (c *Cluster) startControllers(t *testing.T) {
	t.Helper()
	kc := c.CP.Kubeconfig
	c.startIn(t, c.Netns, "kube-controller-manager", filepath.Join(c.Bin, "kube-controller-manager"),
		"--kubeconfig="+kc,
		"--authentication-kubeconfig="+kc,
		"--authorization-kubeconfig="+kc,
		"--service-account-private-key-file="+c.CP.ServiceAccountKeyFile(),
		"--root-ca-file="+c.CP.CAFile(),
		"--use-service-account-credentials=true",
		"--service-cluster-ip-range="+ServiceCIDR,
		"--cluster-cidr="+ClusterCIDR,
		"--leader-elect=false",
		"--bind-address=127.0.0.1",
		"--node-monitor-grace-period=20s",
		"--v=1",
	)
	c.startIn(t, c.Netns, "kube-scheduler", filepath.Join(c.Bin, "kube-scheduler"),
		"--kubeconfig="+kc,
		"--authentication-kubeconfig="+kc,
		"--authorization-kubeconfig="+kc,
		"--leader-elect=false",
		"--bind-address=127.0.0.1",
		"--v=1",
	)
}

// pauseImage builds the sandbox image from test/node/cmd/pause.
func (c *Cluster) pauseImage(ctx context.Context, path string) error {
	binPath := filepath.Join(c.dir, "pause")
	if err := GoBuild(ctx, binPath, "./test/node/cmd/pause"); err != nil {
		return err
	}
	return WriteImage(ImageSpec{Ref: PauseImage, Files: map[string]string{"/pause": binPath}, Entrypoint: []string{"/pause"}}, path)
}

// GoBuild builds a static binary of this repository's package pkg (a path
// relative to the repository root) to out.
func GoBuild(ctx context.Context, out, pkg string, flags ...string) error {
	root, err := cluster.RepoRoot()
	if err != nil {
		return err
	}
	args := append([]string{"build", "-trimpath", "-o", out}, flags...)
	cmd := exec.CommandContext(ctx, "go", append(args, pkg)...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build %s: %v\n%s", pkg, err, stderr.String())
	}
	return nil
}

// Binaries returns the directory with the Kubernetes binaries a node needs,
// building them on the first call on a machine (hack/controlplane.sh node).
func Binaries(ctx context.Context) (string, error) {
	return binaries(ctx, "node", "kubelet", "kube-controller-manager", "kube-scheduler", "agnhost")
}

func binaries(ctx context.Context, set string, need ...string) (string, error) {
	dir := os.Getenv(cluster.EnvBinDir)
	if dir != "" && hasAll(dir, need) {
		return dir, nil
	}
	root, err := cluster.RepoRoot()
	if err != nil {
		return "", err
	}
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, filepath.Join(root, "hack", "controlplane.sh"), set)
	cmd.Stdout = &out
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("hack/controlplane.sh %s: %w", set, err)
	}
	dir = strings.TrimSpace(out.String())
	if !hasAll(dir, need) {
		return "", fmt.Errorf("hack/controlplane.sh %s: %s lacks some of %v", set, dir, need)
	}
	return dir, nil
}

func hasAll(dir string, names []string) bool {
	for _, n := range append([]string{"kube-apiserver", "etcd", "kubectl"}, names...) {
		if _, err := os.Stat(filepath.Join(dir, n)); err != nil {
			return false
		}
	}
	return true
}

// Client is an admin clientset that dials from the control plane's
// namespace.
func (c *Cluster) Client(t testing.TB) kubernetes.Interface {
	t.Helper()
	cs, err := c.CP.Client()
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// Kubectl runs kubectl with the admin kubeconfig in the control plane's
// namespace.
func (c *Cluster) Kubectl(ctx context.Context, args ...string) (string, error) {
	return nsutil.Exec(ctx, c.Netns, append([]string{filepath.Join(c.Bin, "kubectl"), "--kubeconfig", c.CP.Kubeconfig}, args...)...)
}

// start runs argv on the host (it enters namespaces itself), logged under
// the cluster's directory and killed when the test ends.
func (c *Cluster) start(t *testing.T, name string, argv ...string) *nsutil.Process {
	return c.startIn(t, "", name, argv...)
}

func (c *Cluster) startIn(t *testing.T, netns, name string, argv ...string) *nsutil.Process {
	t.Helper()
	p, err := nsutil.Start(netns, name, filepath.Join(c.dir, name+".log"), nil, argv...)
	if err != nil {
		t.Fatal(err)
	}
	c.procs = append(c.procs, p)
	t.Cleanup(func() {
		p.Stop(5 * time.Second)
		if t.Failed() {
			t.Logf("%s log (tail):\n%s", name, p.Tail(3000))
		}
	})
	return p
}

func (c *Cluster) waitFor(t testing.TB, what string, limit time.Duration, fn func() error) {
	t.Helper()
	poll(t, what, limit, fn)
}

// poll calls fn every 200 ms until it succeeds, failing t after limit.
func poll(t testing.TB, what string, limit time.Duration, fn func() error) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		err := fn()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %v: %v", what, limit, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// cniConfig is a node's CNI chain: its pods on a bridge, with addresses
// from podCIDR, and their hostPorts forwarded by portmap (iptables rules in
// the node's namespace), as on kind's nodes.
func cniConfig(podCIDR string) string {
	return `{
  "cniVersion": "1.0.0",
  "name": "onehop-test",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "` + podCIDR + `"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {
      "type": "portmap",
      "capabilities": {"portMappings": true}
    }
  ]
}
`
}

func containerdConfig(n *Node) string {
	return `version = 2
root = "` + filepath.Join(n.Dir, "containerd", "root") + `"
state = "` + filepath.Join(n.Dir, "containerd", "state") + `"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = "` + n.Socket + `"

[plugins."io.containerd.internal.v1.opt"]
  path = "` + filepath.Join(n.Dir, "containerd", "opt") + `"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "` + PauseImage + `"
  # This machine may not lower oom_score_adj (no CAP_SYS_RESOURCE): pods
  # get at least containerd's own.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "` + filepath.Join(n.Dir, "cni") + `"
`
}

func (c *Cluster) kubeletConfig(n *Node, cert, key string) string {
	return `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: ` + n.IP + `
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: ` + cert + `
tlsPrivateKeyFile: ` + key + `
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: ` + c.CP.CAFile() + `}
authorization: {mode: AlwaysAllow}
cgroupDriver: cgroupfs
cgroupRoot: ` + n.cgroupRoot + `
failSwapOn: false
failCgroupV1: false
clusterDNS: [10.96.0.10]
clusterDomain: cluster.local
resolvConf: ` + filepath.Join(n.Dir, "resolv.conf") + `
containerRuntimeEndpoint: unix://` + n.Socket + `
podLogsDir: ` + filepath.Join(n.Dir, "pod-logs") + `
volumePluginDir: ` + filepath.Join(n.Dir, "volume-plugins") + `
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%", "nodefs.inodesFree": "1%"}
protectKernelDefaults: false
serializeImagePulls: false
syncFrequency: 10s
nodeStatusUpdateFrequency: 4s
`
}

// ConformanceBinaries is Binaries with e2e.test, the ginkgo CLI that runs
// it in parallel, a test image's server and coredns (hack/controlplane.sh
// conformance).
func ConformanceBinaries(ctx context.Context) (string, error) {
	return binaries(ctx, "conformance", "kubelet", "kube-controller-manager", "kube-scheduler", "agnhost", "kube-proxy", "e2e.test", "ginkgo", "regression-issue-74839", "coredns")
}

// KubectlUntil runs kubectl until ok accepts its output, at most attempts
// times a second apart, and returns the last output and error: for checks
// through kubectl exec, whose API server to kubelet stream a loaded
// machine can drop once.
func (c *Cluster) KubectlUntil(ctx context.Context, attempts int, ok func(string) bool, args ...string) (string, error) {
	var out string
	var err error
	for i := 0; i < attempts; i++ {
		out, err = c.Kubectl(ctx, args...)
		if err == nil && ok(out) {
			return out, nil
		}
		time.Sleep(time.Second)
	}
	if err == nil {
		err = fmt.Errorf("unexpected output")
	}
	return out, err
}
