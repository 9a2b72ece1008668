package difftest

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/onehop/onehop/test/cluster"
	"github.com/onehop/onehop/test/netns"
	"github.com/onehop/onehop/test/nsutil"
)

// Twin is one of the two clusters: namespaces, a control plane, echo pods
// and a proxy (kube-proxy or onehop's agent) on every node.
type Twin struct {
	Name   string // the proxy it runs: "kube-proxy" or "onehop"
	ID     string // prefix of every namespace name
	Dir    string
	CP     *cluster.ControlPlane
	Client kubernetes.Interface

	Router    string // namespaces
	ClientNS  string
	ControlNS string
	Nodes     []*Node

	proxy proxy
	log   *slog.Logger

	mu         sync.Mutex
	namespaces []string
	servers    []*nsutil.EchoServer
	barrier    barrierState
	udpNext    map[string]int // vantage namespace -> next UDP source port
}

// Node is one node namespace of a twin.
type Node struct {
	Index int
	Name  string
	Netns string
	Pods  []*Pod
	Proxy *nsutil.Process
}

// Pod is one pod namespace with its echo server.
type Pod struct {
	Ref   podRef
	Netns string
}

// newTwin builds a twin named for its proxy: namespaces, control plane,
// Node objects, echo servers, then the proxy on every node. On error what
// was made is torn down.
func newTwin(ctx context.Context, name, id, dir, binDir string, p proxy, log *slog.Logger) (tw *Twin, err error) {
	tw = &Twin{Name: name, ID: id, Dir: dir, proxy: p, log: log.With("twin", name)}
	defer func() {
		if err != nil {
			tw.Close()
			tw = nil
		}
	}()
	began := time.Now()
	if err := tw.buildTopology(ctx); err != nil {
		return tw, fmt.Errorf("%s topology: %w", name, err)
	}
	tw.CP, err = cluster.Start(ctx, cluster.Options{
		Netns:        tw.ControlNS,
		Address:      netns.ControlPlaneIP().String(),
		Port:         netns.APIServerPort,
		ServiceCIDRs: serviceCIDRs,
		BinDir:       binDir,
		Dir:          filepath.Join(dir, "controlplane"),
		Log:          tw.log,
	})
	if err != nil {
		return tw, fmt.Errorf("%s control plane: %w", name, err)
	}
	// The API server's warnings (externalIPs are deprecated) are expected.
	rc := tw.CP.RESTConfig()
	rc.WarningHandler = rest.NoWarnings{}
	if tw.Client, err = kubernetes.NewForConfig(rc); err != nil {
		return tw, err
	}
	if err := tw.registerNodes(ctx); err != nil {
		return tw, err
	}
	if err := tw.startEcho(); err != nil {
		return tw, err
	}
	if err := p.prepare(ctx, tw); err != nil {
		return tw, fmt.Errorf("%s: %w", name, err)
	}
	if err := tw.awaitServiceCIDRs(ctx); err != nil {
		return tw, fmt.Errorf("%s: %w", name, err)
	}
	for _, n := range tw.Nodes {
		log := filepath.Join(dir, fmt.Sprintf("%s-%s.log", name, n.Name))
		if n.Proxy, err = nsutil.Start(n.Netns, name+" "+n.Name, log, nil, p.argv(tw, n)...); err != nil {
			return tw, err
		}
	}
	// Every node's proxy has programmed the cluster once it serves a
	// barrier Service.
	if err := tw.sync(ctx); err != nil {
		return tw, fmt.Errorf("%s never served its first barrier: %w", name, err)
	}
	if err := tw.awaitProgrammed(ctx, p); err != nil {
		return tw, fmt.Errorf("%s: %w", name, err)
	}
	tw.log.Info("twin up", "took", time.Since(began).Round(time.Millisecond))
	return tw, nil
}

// awaitServiceCIDRs returns once the API server's default ServiceCIDR
// holds both service CIDRs and is Ready, as in a cluster long before its
// proxies start: kube-proxy reads the service CIDRs from it (to drop
// traffic to unallocated cluster IPs), and one started before it existed
// was seen, on a loaded machine, never to drop it on one node of a twin.
func (tw *Twin) awaitServiceCIDRs(ctx context.Context) error {
	want := []string{serviceCIDR.String(), serviceCIDR6.String()}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		list, err := tw.Client.NetworkingV1().ServiceCIDRs().List(ctx, metav1.ListOptions{})
		if err == nil {
			for _, sc := range list.Items {
				ready := slices.ContainsFunc(sc.Status.Conditions, func(c metav1.Condition) bool {
					return c.Type == networkingv1.ServiceCIDRConditionReady && c.Status == metav1.ConditionTrue
				})
				if ready && slices.Equal(sc.Spec.CIDRs, want) {
					return nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the API server's ServiceCIDR for %v is not Ready: %v", want, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (tw *Twin) addNamespace(ctx context.Context, name string) error {
	tw.mu.Lock()
	tw.namespaces = append(tw.namespaces, name)
	tw.mu.Unlock()
	return nsutil.Create(ctx, name)
}

func (tw *Twin) startEcho() error {
	for _, n := range tw.Nodes {
		for _, p := range n.Pods {
			s, err := nsutil.ServeEcho(p.Netns, p.Ref.Name(), echoTCP, echoUDP, tw.log)
			if err != nil {
				return err
			}
			tw.mu.Lock()
			tw.servers = append(tw.servers, s)
			tw.mu.Unlock()
		}
	}
	return nil
}

// exited returns a message for the first node whose proxy has exited, or "".
func (tw *Twin) exited() string {
	for _, n := range tw.Nodes {
		if n.Proxy == nil {
			continue
		}
		if done, err := n.Proxy.Exited(); done {
			return fmt.Sprintf("%s on %s exited (%v); log %s:\n%s", tw.Name, n.Name, err, n.Proxy.Log, n.Proxy.Tail(3000))
		}
	}
	return ""
}

// Close stops the proxies, echo servers and control plane and deletes
// every namespace. Safe to call more than once.
func (tw *Twin) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, n := range tw.Nodes {
		if n.Proxy != nil {
			n.Proxy.Stop(3 * time.Second)
		}
	}
	tw.mu.Lock()
	servers, namespaces := tw.servers, tw.namespaces
	tw.servers, tw.namespaces = nil, nil
	tw.mu.Unlock()
	for _, s := range servers {
		s.Close()
	}
	if tw.CP != nil {
		tw.CP.Stop()
		tw.CP = nil
	}
	for i := len(namespaces) - 1; i >= 0; i-- {
		if err := nsutil.Delete(ctx, namespaces[i]); err != nil {
			tw.log.Warn("delete netns", "netns", namespaces[i], "err", err)
		}
	}
}

// node returns node n (1-based).
func (tw *Twin) node(n int) *Node { return tw.Nodes[n-1] }

// pod returns the namespace of the plan's pod p.
func (tw *Twin) pod(p podRef) *Pod { return tw.node(p.Node).Pods[p.Index-1] }

// awaitProgrammed syncs the twin (a barrier each time) until every node's
// proxy says it has programmed all it learns at start.
func (tw *Twin) awaitProgrammed(ctx context.Context, p proxy) error {
	deadline := time.Now().Add(barrierTimeout())
	for {
		all, last := true, error(nil)
		for _, n := range tw.Nodes {
			ok, err := p.programmed(ctx, n)
			if err != nil || !ok {
				all, last = false, err
				break
			}
		}
		if all {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the proxies did not program their start within %v (last error: %v)", barrierTimeout(), last)
		}
		time.Sleep(200 * time.Millisecond)
		if err := tw.sync(ctx); err != nil {
			return err
		}
	}
}
