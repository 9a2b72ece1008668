package external

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/onehop/onehop/external/l2"
)

// BenchmarkL2Takeover is what one node's hook computes when another node's
// liveness Lease goes (its agent stopped): the new owner of every L2 IP,
// and what this node's responder answers for, as Run looks at a change of
// liveness. 10,000 LoadBalancer Services of one IP each (Cluster policy,
// one ready endpoint), on 3, 500 and 5,000 nodes, every node's agent
// alive until the op. The informer stores and the liveness tracker are
// filled directly; no apiserver runs. Each op takes one node's Lease
// away; bringing it back, and the look after, are not timed.
func BenchmarkL2Takeover(b *testing.B) {
	bySize(b, func(tb *takeoverBench, nodes, i int) {
		// Every node but this one (node 0) dies in turn.
		victim := benchNode(1 + i%(nodes-1))
		tb.hook.liveness.forget(leasePrefix + victim)
		tb.hook.followLiveness()
		tb.b.StopTimer()
		tb.check(victim)
		tb.renew(victim)
		tb.hook.followLiveness()
		tb.b.StartTimer()
	})
}

// BenchmarkL2Look is a whole look (state, fingerprint, providers told)
// after a change that is not of liveness alone: a Service's endpoint
// moved, so the L2 owners are compared with the new state, and none
// moves.
func BenchmarkL2Look(b *testing.B) {
	bySize(b, func(tb *takeoverBench, nodes, i int) {
		tb.moveEndpoint(i%10000, 1+i%(nodes-1))
		tb.look(tb.b.Context())
	})
}

// bySize runs op, the i-th time with i, at 10,000 IPs on 3, 500 and 5,000
// nodes, after a first look.
func bySize(b *testing.B, op func(tb *takeoverBench, nodes, i int)) {
	for _, nodes := range []int{3, 500, 5000} {
		b.Run(fmt.Sprintf("ips=10000/nodes=%d", nodes), func(b *testing.B) {
			tb := newTakeoverBench(b, 10000, nodes)
			tb.look(b.Context())
			for i := 0; b.Loop(); i++ {
				op(tb, nodes, i)
			}
		})
	}
}

// takeoverBench is a node agent's hook with an L2 provider whose
// responder records what it is told.
type takeoverBench struct {
	b    *testing.B
	hook *Hook
	l2   *l2Provider
	told map[Provider]string
	rv   int
}

func benchNode(i int) string { return fmt.Sprintf("node-%04d", i) }

func newTakeoverBench(b *testing.B, ips, nodes int) *takeoverBench {
	b.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	h, err := New(Config{Pools: []PoolConfig{{Name: "p", Addresses: []string{"2001:db8::/112"}}}, SeparateController: true,
		L2: &l2.Config{Interfaces: []string{"eth0"}}}, fake.NewClientset(), benchNode(0), log)
	if err != nil {
		b.Fatal(err)
	}
	pool := netip.MustParseAddr("2001:db8::1")
	prog := map[served]programmed{}
	ip := pool
	for i := range ips {
		name := fmt.Sprintf("s-%05d", i)
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("u" + name)},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Ports: []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}}}
		svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: ip.String()}}
		_ = h.services.GetStore().Add(svc)
		es := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name + "-x",
			Labels: map[string]string{discoveryv1.LabelServiceName: name}}, AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints: []discoveryv1.Endpoint{{Addresses: []string{fmt.Sprintf("10.%d.%d.1", i/256%256, i%256)},
				Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}, NodeName: ptr.To(benchNode(i % nodes))}}}
		_ = h.slices.GetStore().Add(es)
		prog[served{ip, keyOf(svc)}] = programmed{anyEndpoint: true}
		ip = ip.Next()
	}
	h.programmed = prog
	for n := range nodes {
		_ = h.nodes.GetStore().Add(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: benchNode(n)},
			Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
				Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: fmt.Sprintf("10.%d.%d.%d", 100+n/65536, n/256%256, n%256)}}}})
	}
	h.liveness = newLiveness(fake.NewClientset(), "default", benchNode(0), time.Second, 3*time.Second, log, h.poke)
	tb := &takeoverBench{b: b, hook: h, told: map[Provider]string{}}
	for n := range nodes {
		tb.renew(benchNode(n))
	}
	h.liveness.renewedOwn()
	tb.l2 = &l2Provider{r: &answered{}, idx: newL2Owners(), conflicts: l2Conflicts{lv: h.liveness, log: log}}
	h.providers = []Provider{tb.l2}
	return tb
}

// renew is node's liveness Lease renewed, as the Lease informer reports it.
func (tb *takeoverBench) renew(node string) {
	tb.rv++
	now := metav1.NewMicroTime(time.Now())
	tb.hook.liveness.observe(&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: leasePrefix + node, ResourceVersion: fmt.Sprint(tb.rv)},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &node, RenewTime: &now}})
}

// look is what Run does after a change: the state, its fingerprint, and
// the providers told when it changed.
func (tb *takeoverBench) look(ctx context.Context) {
	st := tb.hook.state()
	fp := fingerprint(st)
	for _, p := range tb.hook.providers {
		if tb.told[p] == fp {
			continue
		}
		if err := p.Update(ctx, st); err != nil {
			tb.b.Fatal(err)
		}
		tb.told[p] = fp
	}
}

// check fails the benchmark unless the owners are l2.Owner's over the
// nodes alive, victim dead, and this node answers for its own.
func (tb *takeoverBench) check(victim string) {
	st := tb.l2.last
	if st.Alive(victim) {
		tb.b.Fatalf("%s alive after its Lease went", victim)
	}
	for _, ip := range []netip.Addr{netip.MustParseAddr("2001:db8::1"), netip.MustParseAddr("2001:db8::1000")} {
		if want, _ := l2Owner(st, ip); tb.l2.idx.owner(ip) != want {
			tb.b.Fatalf("%s: owner %q, want %q", ip, tb.l2.idx.owner(ip), want)
		}
	}
	if len(tb.l2.r.Owned()) != len(tb.l2.idx.ownedBy(st.Node)) {
		tb.b.Fatalf("answering for %d IPs, owning %d", len(tb.l2.r.Owned()), len(tb.l2.idx.ownedBy(st.Node)))
	}
}

// moveEndpoint moves Service i's endpoint to node n.
func (tb *takeoverBench) moveEndpoint(i, n int) {
	name := fmt.Sprintf("s-%05d", i)
	obj, _, _ := tb.hook.slices.GetStore().GetByKey("default/" + name + "-x")
	es := obj.(*discoveryv1.EndpointSlice).DeepCopy()
	es.Endpoints[0].NodeName = ptr.To(benchNode(n))
	_ = tb.hook.slices.GetStore().Update(es)
}

// answered records what the L2 provider tells its responder.
type answered struct{ owned []netip.Addr }

func (a *answered) Set(ips []netip.Addr)    { a.owned = ips }
func (a *answered) Reannounce([]netip.Addr) {}
func (a *answered) Owned() []netip.Addr     { return a.owned }
func (a *answered) Close()                  {}
