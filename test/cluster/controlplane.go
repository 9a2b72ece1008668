package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/onehop/onehop/test/nsutil"
)

// DefaultServiceCIDRs is the dual-stack service range the control plane
// allocates cluster IPs from.
const DefaultServiceCIDRs = "10.96.0.0/16,fd00:96::/112"

// Options says where and how to run the control plane. The zero value runs
// it on loopback of the caller's namespace on free ports.
type Options struct {
	// Netns is the network namespace to run etcd and kube-apiserver in
	// (created by the caller). Empty means the caller's own namespace.
	Netns string
	// Address is the IP kube-apiserver binds and advertises; agents in other
	// namespaces reach it there. Default 127.0.0.1.
	Address string
	// Port is kube-apiserver's secure port: default 6443 inside Netns, a
	// free port otherwise.
	Port int
	// BinDir holds kube-apiserver and etcd; default Binaries().
	BinDir string
	// ServiceCIDRs is --service-cluster-ip-range; default DefaultServiceCIDRs.
	ServiceCIDRs string
	// Dir is where certificates, kubeconfig, etcd data and logs go; default
	// a fresh temp dir, removed by Stop.
	Dir string
	// Log receives progress; default slog.Default().
	Log *slog.Logger
	// Nodes configures the apiserver for real kubelets and controllers
	// (test/node): Node and RBAC authorization, NodeRestriction and
	// ServiceAccount admission, a client certificate for kubelets, and an
	// audit log of every request (AuditLog).
	Nodes bool
}

// ControlPlane is a running etcd + kube-apiserver pair.
type ControlPlane struct {
	// URL is the apiserver's https URL, reachable from any namespace routed
	// to Address.
	URL string
	// Kubeconfig is the path of an admin kubeconfig for URL.
	Kubeconfig string
	// Dir holds everything the control plane wrote.
	Dir string

	opts      Options
	ownDir    bool
	etcd      *Process
	apiserver *Process
	rest      *rest.Config
	pki       *pki
}

// AuditLog is the path of the apiserver's audit log (JSON lines, one
// event per request at Metadata level) when Options.Nodes is set.
func (cp *ControlPlane) AuditLog() string { return filepath.Join(cp.Dir, "audit.log") }

// CAFile is the path of the cluster CA certificate (PEM).
func (cp *ControlPlane) CAFile() string { return cp.pki.CACert }

// ServiceAccountKeyFile is the path of the service-account signing key,
// which kube-controller-manager needs.
func (cp *ControlPlane) ServiceAccountKeyFile() string { return cp.pki.SAKey }

// WriteKubeconfig writes a kubeconfig for the client identity cn in groups
// (a certificate signed by the cluster CA) to path, for server (the
// apiserver's URL when empty).
func (cp *ControlPlane) WriteKubeconfig(path, server, cn string, groups ...string) error {
	if server == "" {
		server = cp.URL
	}
	cert, key, err := cp.pki.issue(cn, groups, nil, nil)
	if err != nil {
		return err
	}
	return writeClientKubeconfig(path, server, cp.pki.caPEM, cert, key)
}

// IssueServing writes a serving certificate and key for ips, signed by the
// cluster CA, to certPath and keyPath.
func (cp *ControlPlane) IssueServing(certPath, keyPath, cn string, ips ...net.IP) error {
	cert, key, err := cp.pki.issue(cn, nil, ips, []string{cn})
	if err != nil {
		return err
	}
	if err := os.WriteFile(certPath, cert, 0o600); err != nil {
		return err
	}
	return os.WriteFile(keyPath, key, 0o600)
}

// Process is a control-plane process.
type Process = nsutil.Process

// Start runs etcd and kube-apiserver and returns once /readyz answers ok
// and the default namespace exists. On error everything started is stopped.
func Start(ctx context.Context, opts Options) (cp *ControlPlane, err error) {
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.Address == "" {
		opts.Address = "127.0.0.1"
	}
	if opts.ServiceCIDRs == "" {
		opts.ServiceCIDRs = DefaultServiceCIDRs
	}
	if opts.BinDir == "" {
		if opts.BinDir, err = Binaries(ctx); err != nil {
			return nil, err
		}
	}
	cp = &ControlPlane{opts: opts, Dir: opts.Dir}
	if cp.Dir == "" {
		if cp.Dir, err = os.MkdirTemp("", "onehop-cp-"); err != nil {
			return nil, err
		}
		cp.ownDir = true
	} else if err = os.MkdirAll(cp.Dir, 0o700); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			cp.Stop()
			cp = nil
		}
	}()

	etcdPort, peerPort, apiPort := 2379, 2380, opts.Port
	if opts.Netns == "" {
		if etcdPort, err = freePort(); err != nil {
			return cp, err
		}
		if peerPort, err = freePort(); err != nil {
			return cp, err
		}
		if apiPort == 0 {
			if apiPort, err = freePort(); err != nil {
				return cp, err
			}
		}
	} else if apiPort == 0 {
		apiPort = 6443
	}
	addr := net.ParseIP(opts.Address)
	if addr == nil {
		return cp, fmt.Errorf("control plane address %q is not an IP", opts.Address)
	}
	cp.URL = "https://" + net.JoinHostPort(opts.Address, strconv.Itoa(apiPort))

	ips := []net.IP{addr, net.ParseIP("127.0.0.1"), net.ParseIP("::1")}
	for _, c := range splitComma(opts.ServiceCIDRs) {
		if first, err := firstIP(c); err == nil {
			ips = append(ips, first)
		} else {
			return cp, err
		}
	}
	p, err := newPKI(cp.Dir, ips, []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"})
	if err != nil {
		return cp, fmt.Errorf("generate certificates: %w", err)
	}
	cp.pki = p
	cp.Kubeconfig = filepath.Join(cp.Dir, "admin.kubeconfig")
	if err := writeKubeconfig(cp.Kubeconfig, cp.URL, p); err != nil {
		return cp, err
	}

	began := time.Now()
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(etcdPort)
	peerURL := "http://127.0.0.1:" + strconv.Itoa(peerPort)
	cp.etcd, err = nsutil.Start(opts.Netns, "etcd", filepath.Join(cp.Dir, "etcd.log"), nil,
		filepath.Join(opts.BinDir, "etcd"),
		"--name=default",
		"--data-dir="+filepath.Join(cp.Dir, "etcd-data"),
		"--listen-client-urls="+etcdURL,
		"--advertise-client-urls="+etcdURL,
		"--listen-peer-urls="+peerURL,
		"--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=default="+peerURL,
		"--unsafe-no-fsync=true",
		"--log-level=warn",
	)
	if err != nil {
		return cp, err
	}
	apiArgs := []string{
		filepath.Join(opts.BinDir, "kube-apiserver"),
		"--etcd-servers=" + etcdURL,
		"--bind-address=" + opts.Address,
		"--advertise-address=" + opts.Address,
		"--secure-port=" + strconv.Itoa(apiPort),
		"--tls-cert-file=" + p.ServingCert,
		"--tls-private-key-file=" + p.ServingKey,
		"--client-ca-file=" + p.CACert,
		"--cert-dir=" + filepath.Join(cp.Dir, "certs"),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + p.SAPub,
		"--service-account-signing-key-file=" + p.SAKey,
		"--service-cluster-ip-range=" + opts.ServiceCIDRs,
		"--authorization-mode=RBAC",
		// No controller-manager runs: admission that waits on controllers
		// (service-account tokens) is off.
		"--disable-admission-plugins=ServiceAccount",
		"--allow-privileged=true",
		"--profiling=false",
		"--v=1",
	}
	if opts.Nodes {
		policy := filepath.Join(cp.Dir, "audit-policy.yaml")
		if err := os.WriteFile(policy, []byte(auditPolicy), 0o600); err != nil {
			return cp, err
		}
		apiArgs = replaceArgs(apiArgs,
			"--authorization-mode=Node,RBAC",
			"--disable-admission-plugins=",
			"--enable-admission-plugins=NodeRestriction",
			"--kubelet-client-certificate="+p.AdminCert,
			"--kubelet-client-key="+p.AdminKey,
			"--kubelet-preferred-address-types=InternalIP",
			"--audit-policy-file="+policy,
			"--audit-log-path="+cp.AuditLog(),
			"--audit-log-format=json",
			"--audit-log-mode=blocking",
		)
	}
	if addr.IsLoopback() {
		// The "kubernetes" Service cannot point at loopback.
		apiArgs = append(apiArgs, "--endpoint-reconciler-type=none")
	}
	cp.apiserver, err = nsutil.Start(opts.Netns, "kube-apiserver", filepath.Join(cp.Dir, "kube-apiserver.log"), nil, apiArgs...)
	if err != nil {
		return cp, err
	}
	opts.Log.Info("control plane starting", "netns", opts.Netns, "url", cp.URL, "dir", cp.Dir)

	cp.rest = &rest.Config{
		Host: cp.URL,
		TLSClientConfig: rest.TLSClientConfig{
			CAData: p.caPEM, CertData: p.adminCertPEM, KeyData: p.adminKeyPEM,
		},
		Dial:    nsutil.Dialer(opts.Netns),
		QPS:     200,
		Burst:   400,
		Timeout: 30 * time.Second,
	}
	if err := cp.waitReady(ctx); err != nil {
		return cp, err
	}
	opts.Log.Info("control plane ready", "netns", opts.Netns, "url", cp.URL, "took", time.Since(began).Round(time.Millisecond))
	return cp, nil
}

// RESTConfig returns an admin client config that dials from inside the
// control plane's namespace, so the caller needs no route to it.
func (cp *ControlPlane) RESTConfig() *rest.Config { return rest.CopyConfig(cp.rest) }

// Client returns an admin clientset (see RESTConfig).
func (cp *ControlPlane) Client() (kubernetes.Interface, error) {
	return kubernetes.NewForConfig(cp.RESTConfig())
}

// Processes returns etcd and kube-apiserver, for log inspection.
func (cp *ControlPlane) Processes() []*Process {
	var out []*Process
	for _, p := range []*Process{cp.etcd, cp.apiserver} {
		if p != nil {
			out = append(out, p)
		}
	}
	return out
}

// readyTimeout is how long Start waits for the API server to be ready:
// three minutes, ten in the test VM (test/vm sets ONEHOP_VM in the guest),
// whose emulated CPU makes the API server's start take one to three
// minutes, four with two at once on a loaded machine.
func readyTimeout() time.Duration {
	if os.Getenv("ONEHOP_VM") != "" {
		return 10 * time.Minute
	}
	return 3 * time.Minute
}

func (cp *ControlPlane) waitReady(ctx context.Context) error {
	client, err := cp.Client()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, readyTimeout())
	defer cancel()
	var last error
	for {
		for _, p := range cp.Processes() {
			if done, exitErr := p.Exited(); done {
				return fmt.Errorf("%s exited (%v) before the control plane was ready; log %s:\n%s", p.Name, exitErr, p.Log, p.Tail(3000))
			}
		}
		body, err := client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err == nil && string(body) == "ok" {
			if _, err = client.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{}); err == nil {
				return nil
			}
		}
		if err == nil {
			err = errors.New(string(body))
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("control plane not ready: %v (last: %v); apiserver log %s:\n%s", ctx.Err(), last, cp.apiserver.Log, cp.apiserver.Tail(3000))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Stop kills kube-apiserver and etcd and removes the directory it created.
// It is safe to call more than once.
func (cp *ControlPlane) Stop() {
	if cp.apiserver != nil {
		cp.apiserver.Stop(5 * time.Second)
	}
	if cp.etcd != nil {
		cp.etcd.Stop(5 * time.Second)
	}
	if cp.ownDir && cp.Dir != "" {
		_ = os.RemoveAll(cp.Dir)
	}
}

// auditPolicy records every request, without bodies.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
`

// replaceArgs sets each --flag=value in args, replacing an earlier value of
// the same flag, and drops flags set to the empty value.
func replaceArgs(args []string, set ...string) []string {
	out := args[:0:0]
	flag := func(a string) string { f, _, _ := strings.Cut(a, "="); return f }
	drop := map[string]bool{}
	for _, s := range set {
		drop[flag(s)] = true
	}
	for _, a := range args {
		if !drop[flag(a)] {
			out = append(out, a)
		}
	}
	for _, s := range set {
		if !strings.HasSuffix(s, "=") {
			out = append(out, s)
		}
	}
	return out
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
