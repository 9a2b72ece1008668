package providers

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/onehop/onehop/external/claims"
	"github.com/onehop/onehop/external/config"
	"github.com/onehop/onehop/external/l2"
	"github.com/onehop/onehop/portal"
)

// ownersWorld is a cluster the property test changes at random: nodes
// that die and come back, become eligible or not, change labels; Services
// of either policy that change their addresses and endpoints' nodes; and,
// in some runs, L2 advertisements that pick nodes by label and addresses
// by pool.
type ownersWorld struct {
	rnd      *rand.Rand
	nodes    []string
	alive    map[string]bool
	eligible map[string]bool
	labelled map[string]bool
	svcs     []ownersSvc
	ads      bool
}

type ownersSvc struct {
	ips   []netip.Addr
	local bool
	// on are the nodes with a ready endpoint (the Local policy).
	on []string
}

func (w *ownersWorld) someNodes() []string {
	var out []string
	for _, n := range w.nodes {
		if w.rnd.IntN(3) == 0 {
			out = append(out, n)
		}
	}
	return out
}

func (w *ownersWorld) someIPs() []netip.Addr {
	var out []netip.Addr
	for range 1 + w.rnd.IntN(2) {
		// Few addresses, so that Services share them.
		out = append(out, netip.AddrFrom4([4]byte{198, 51, 100, byte(w.rnd.IntN(40))}))
	}
	return out
}

// state is what the hook would tell the provider.
func (w *ownersWorld) state() *State {
	var cluster []string
	for _, n := range w.nodes {
		if w.eligible[n] {
			cluster = append(cluster, n)
		}
	}
	s := &State{Node: w.nodes[0], view: View{Cluster: cluster, Alive: func(n string) bool { return w.alive[n] }}}
	for i, svc := range w.svcs {
		nodes := cluster
		if svc.local {
			nodes = slices.DeleteFunc(slices.Clone(svc.on), func(n string) bool { return !w.eligible[n] })
		}
		for _, ip := range slices.Compact(slices.SortedFunc(slices.Values(svc.ips), netip.Addr.Compare)) {
			s.Targets = append(s.Targets, Target{IP: ip, Service: portal.ServiceKey{Namespace: "ns", Name: fmt.Sprint("s", i)}, Local: svc.local, Nodes: nodes})
		}
	}
	slices.SortFunc(s.Targets, func(a, b Target) int {
		if c := a.IP.Compare(b.IP); c != 0 {
			return c
		}
		return claims.CompareKeys(a.Service, b.Service)
	})
	s.indexTargets()
	if w.ads {
		rules := &config.AdRules{L2: []config.AdRule{
			{Nodes: []labels.Selector{labels.SelectorFromSet(labels.Set{"l2": "yes"})}},
			{Pools: []string{"odd"}},
		}}
		s.view.Ann = config.NewAnnouncer(rules,
			func(ip netip.Addr) string {
				if ip.As4()[3]%2 == 1 {
					return "odd"
				}
				return "even"
			},
			func(n string) labels.Set {
				if w.labelled[n] {
					return labels.Set{"l2": "yes"}
				}
				return nil
			})
	}
	return s
}

// change makes one random change; it reports whether only liveness
// changed.
func (w *ownersWorld) change() (livenessOnly bool) {
	n := w.nodes[w.rnd.IntN(len(w.nodes))]
	switch w.rnd.IntN(6) {
	case 0, 1:
		w.alive[n] = !w.alive[n]
		return true
	case 2:
		w.eligible[n] = !w.eligible[n]
	case 3:
		w.labelled[n] = !w.labelled[n]
	case 4:
		i := w.rnd.IntN(len(w.svcs))
		switch w.rnd.IntN(3) {
		case 0:
			w.svcs[i].ips = w.someIPs()
		case 1:
			w.svcs[i].local = !w.svcs[i].local
		default:
			w.svcs[i].on = w.someNodes()
		}
	default:
		if w.rnd.IntN(2) == 0 && len(w.svcs) > 1 {
			i := w.rnd.IntN(len(w.svcs))
			w.svcs = slices.Delete(w.svcs, i, i+1)
		} else {
			w.svcs = append(w.svcs, ownersSvc{ips: w.someIPs(), local: w.rnd.IntN(3) == 0, on: w.someNodes()})
		}
	}
	return false
}

// The index agrees with l2.Owner over every address's eligible, live
// nodes after every step of random sequences of deaths, comebacks,
// eligibility and label flips and Service changes, whether a liveness
// change alone is looked at in full (update) or as a Lease expiry is
// (syncLiveness); and what it says moved is exactly what moved.
func TestL2OwnersAgreeWithOwner(t *testing.T) {
	for seed := range uint64(60) {
		w := &ownersWorld{rnd: rand.New(rand.NewPCG(seed, 7)), alive: map[string]bool{}, eligible: map[string]bool{}, labelled: map[string]bool{}, ads: seed%3 == 2}
		for i := range 3 + int(seed%10) {
			n := fmt.Sprintf("node-%02d", i)
			w.nodes = append(w.nodes, n)
			w.alive[n], w.eligible[n], w.labelled[n] = w.rnd.IntN(4) > 0, w.rnd.IntN(4) > 0, w.rnd.IntN(2) == 0
		}
		for range 1 + w.rnd.IntN(6) {
			w.svcs = append(w.svcs, ownersSvc{ips: w.someIPs(), local: w.rnd.IntN(3) == 0, on: w.someNodes()})
		}
		o := newL2Owners()
		s := w.state()
		o.update(s)
		o.take()
		before := wantOwners(s)
		for step := range 300 {
			livenessOnly := true
			for range 1 + w.rnd.IntN(3) {
				livenessOnly = w.change() && livenessOnly
			}
			s = w.state()
			if livenessOnly && w.rnd.IntN(2) == 0 {
				o.syncLiveness(s.Alive)
			} else {
				o.update(s)
			}
			if err := o.check(); err != nil {
				t.Fatalf("seed %d step %d (liveness only %v): %v", seed, step, livenessOnly, err)
			}
			want := wantOwners(s)
			for ip, owner := range want {
				if got := o.owner(ip); got != owner {
					x := o.ips[ip]
					t.Fatalf("seed %d step %d (liveness only %v): %s owned by %q, l2.Owner says %q (eligible %v, alive %v) cands %v group %v key %q", seed, step, livenessOnly, ip, got, owner, s.Eligible(ip), w.alive, x.cands, x.group.nodes, x.key)
				}
			}
			moved := o.take().owners
			for ip, owner := range want {
				// Moved away and back within one look is moved too.
				was, ok := moved[ip]
				if !ok && before[ip] != owner || ok && was != before[ip] {
					t.Fatalf("seed %d step %d: %s went from %q to %q; the index says moved %v from %q", seed, step, ip, before[ip], owner, ok, was)
				}
			}
			for ip := range o.ips {
				if _, ok := want[ip]; !ok {
					t.Fatalf("seed %d step %d: the index keeps %s, no Service holds it", seed, step, ip)
				}
			}
			for n, ips := range o.owned {
				for ip := range ips {
					if want[ip] != n {
						t.Fatalf("seed %d step %d: %s listed as owning %s", seed, step, n, ip)
					}
				}
			}
			before = want
		}
	}
}

// wantOwners is l2Owner, the definition, for every address of s, read
// without the index of its targets.
func wantOwners(s *State) map[netip.Addr]string {
	plain := *s
	plain.at = nil
	out := map[netip.Addr]string{}
	for _, ip := range plain.IPs() {
		out[ip], _ = L2Owner(&plain, ip)
	}
	return out
}

// check verifies what the index holds for every address: its candidates
// are ranked, of its group, and every live node of the group that is not
// among them ranks below all of them.
func (o *l2Owners) check() error {
	for ip, x := range o.ips {
		if o.groups[x.key] != x.group || x.group.ips[ip] != x {
			return fmt.Errorf("%s: not in its group %q", ip, x.key)
		}
		for i, c := range x.cands {
			if !x.group.nodes[c.node] {
				return fmt.Errorf("%s: candidate %s is not of its group %v", ip, c.node, x.group.nodes)
			}
			if i > 0 && rankOrder(x.cands[i-1], c) >= 0 {
				return fmt.Errorf("%s: candidates out of order %v", ip, x.cands)
			}
		}
		for n := range x.group.nodes {
			nd := o.nodes[n]
			if nd == nil || !nd.groups[x.group] {
				return fmt.Errorf("%s: group node %s not indexed", ip, n)
			}
			if !nd.alive || slices.ContainsFunc(x.cands, func(c l2Cand) bool { return c.node == n }) {
				continue
			}
			if len(x.cands) == 0 || rankOrder(l2Cand{n, l2.Weight(ip, n)}, x.cands[len(x.cands)-1]) < 0 {
				return fmt.Errorf("%s: live %s outranks a candidate or there is none: %v", ip, n, x.cands)
			}
		}
	}
	return nil
}
