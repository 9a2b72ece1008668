package difftest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/onehop/onehop/test/cluster"
	"github.com/onehop/onehop/test/netns"
	"github.com/onehop/onehop/test/nsutil"
)

// proxy is what a twin runs on every node in kube-proxy's place (or as
// kube-proxy).
type proxy interface {
	// prepare runs once the twin's API server is up: identities, RBAC.
	prepare(ctx context.Context, tw *Twin) error
	// argv is the command line for node n.
	argv(tw *Twin, n *Node) []string
	// programmed reports whether node n's proxy has programmed what it
	// learns apart from Services and EndpointSlices (which a barrier
	// proves); the twin syncs again until it has.
	programmed(ctx context.Context, n *Node) (bool, error)
}

// Both proxies get the same settings, dual-stack: pod CIDRs of both
// families (traffic to a Service from outside them is masqueraded),
// NodePorts on the node segment's addresses of both families, every sync
// at once, and the namespace's conntrack limits left alone. The agent also
// gets the twins' service CIDRs (kube-proxy reads them from the
// ServiceCIDR objects) and the allowed halves of the external ranges.
var (
	clusterCIDRs      = netns.ClusterCIDR + "," + netns.ClusterCIDR6
	nodePortAddresses = netns.NodeCIDR + "," + netns.NodeCIDR6
	healthzAddress    = "0.0.0.0:" + strconv.Itoa(netns.HealthzPort)
	metricsAddress    = "127.0.0.1:" + strconv.Itoa(netns.MetricsPort)
)

// kubeProxy is kube-proxy v1.37 (built from its Go module by
// hack/controlplane.sh's node set) in nftables mode with the admin's
// identity, as a DaemonSet pod of kubeadm's would run.
type kubeProxy struct{ bin string }

func (kubeProxy) prepare(context.Context, *Twin) error { return nil }

// programmed: kube-proxy drops traffic to unallocated cluster IPs once its
// rules name the ServiceCIDRs. It learns them from an informer whose
// events start no sync (OnServiceCIDRsChanged only stores them), so a sync
// done before the first event lacks the drop until another sync: a probe
// to an unallocated cluster IP is then routed, and answered unreachable.
func (kubeProxy) programmed(ctx context.Context, n *Node) (bool, error) {
	out, err := nsutil.Exec(ctx, n.Netns, "nft", "list", "table", "ip", "kube-proxy")
	if err != nil {
		return false, err
	}
	out6, err := nsutil.Exec(ctx, n.Netns, "nft", "list", "table", "ip6", "kube-proxy")
	if err != nil {
		return false, err
	}
	return strings.Contains(out, serviceCIDR.String()) && strings.Contains(out6, serviceCIDR6.String()), nil
}

func (k kubeProxy) argv(tw *Twin, n *Node) []string {
	// Its minimum sync period flag keeps the old name (it is every mode's).
	return append([]string{k.bin, "--proxy-mode", "nftables", "--kubeconfig", tw.CP.Kubeconfig,
		"--iptables-min-sync-period", "0s"}, sharedFlags(n)...)
}

// sharedFlags are the flags both proxies take, with the same meaning.
func sharedFlags(n *Node) []string {
	return []string{
		"--hostname-override", n.Name,
		"--cluster-cidr", clusterCIDRs,
		"--nodeport-addresses", nodePortAddresses,
		"--healthz-bind-address", healthzAddress,
		"--metrics-bind-address", metricsAddress,
		"--conntrack-max-per-core", "0", "--conntrack-min", "0",
		"--conntrack-tcp-timeout-established", "0", "--conntrack-tcp-timeout-close-wait", "0",
		"--oom-score-adj", "0",
	}
}

// onehopAgent is the agent with test/netns's flags (what deploy/ ships,
// as flags) and the identity deploy/base gives it: the node agents'
// service account, under its RBAC and admission policy.
type onehopAgent struct {
	bin         string
	kubeconfigs map[string]string // node name -> kubeconfig
}

func (a *onehopAgent) prepare(ctx context.Context, tw *Twin) error {
	if err := tw.CP.ApplyRBAC(ctx); err != nil {
		return fmt.Errorf("deploy/base RBAC: %w", err)
	}
	a.kubeconfigs = map[string]string{}
	for _, n := range tw.Nodes {
		id, err := tw.CP.PodIdentity(ctx, cluster.AgentNamespace, cluster.NodeAgentServiceAccount, "onehop-"+n.Name, n.Name)
		if err != nil {
			return err
		}
		a.kubeconfigs[n.Name] = id.Kubeconfig
	}
	return nil
}

// programmed: the agent is given the service CIDRs on its command line.
func (*onehopAgent) programmed(context.Context, *Node) (bool, error) { return true, nil }

func (a *onehopAgent) argv(_ *Twin, n *Node) []string {
	return append([]string{a.bin, "run",
		"--kubeconfig", a.kubeconfigs[n.Name],
		"--service-cidr", serviceCIDRs,
		"--external-ip-cidrs", allowedExternalCIDR + "," + allowedExternalCIDR6,
		"--min-sync-period", "0s",
	}, sharedFlags(n)...)
}

// kubeProxyBinary returns kube-proxy from the control-plane binaries'
// directory (hack/controlplane.sh node or conformance).
func kubeProxyBinary(binDir string) (string, error) {
	p := filepath.Join(binDir, "kube-proxy")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("kube-proxy is built with the node set: %s=$(hack/controlplane.sh node): %w", cluster.EnvBinDir, err)
	}
	return p, nil
}
