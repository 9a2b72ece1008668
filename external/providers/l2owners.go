package providers

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/onehop/onehop/external/config"
	"github.com/onehop/onehop/external/l2"
)

// l2Candidates is how many ranked candidates an address keeps.
const l2Candidates = 4

// l2Owners keeps the L2 owner of every address as the cluster changes, so
// that a takeover costs in proportion to what moved. The owner is
// l2.Owner over the address's eligible nodes (State.Eligible, those the
// L2 advertisements let answer for it) that are alive: the index must
// always agree with it, on every node alike.
//
// Addresses with the same eligible nodes share a group (all Cluster-policy
// addresses one, the nodes eligible under that policy); each address keeps
// its ranked candidates, the first few of its group by rendezvous weight,
// and its owner is the first of them alive. The candidates hold this:
// every node of the group that is alive and not among them ranks below
// all of them; and when none of them is alive, no node of the group is.
//
// How each event scales (A: the addresses, N: the nodes):
//   - a node dies (its Lease expires, goes, or stops being heard): its
//     own addresses move to their next live candidate, O(its addresses);
//     an address whose candidates are all dead is ranked again over its
//     group, O(N) for that address alone;
//   - a node comes back, joins a group or becomes eligible: it is
//     weighed against each address of its groups once, O(A) hashes, no
//     sort over the nodes;
//   - a node leaves a group (cordoned, not Ready, an advertisement no
//     longer picks it): it leaves the candidates of that group's
//     addresses, O(A), and its own addresses move as on a death;
//   - a Service changes: its addresses whose eligible nodes changed are
//     ranked again, O(N) each, the others are left as they are.
//
// Finding what changed costs a liveness scan, O(N) lookups, and on a
// whole look (update, after any change of the cluster) a comparison of
// each address's group with the last, O(A); a change of liveness alone
// (syncLiveness: a Lease expired or came back) costs the scan and the
// moves. The first look ranks every address over its group, O(A×N)
// hashes, as l2.Owner over every address would.
type l2Owners struct {
	ips    map[netip.Addr]*l2IP
	groups map[string]*l2Group
	nodes  map[string]*l2Node
	// owned are the addresses each node owns.
	owned map[string]map[netip.Addr]bool
	// since is what changed since the last take.
	since l2Moves
}

// l2Moves is what changed in the index over a while: the addresses whose
// owner changed, with their owner before; for each group, the nodes that
// died, came back, joined or left it, with whether they were a live node
// of the group before; the addresses whose group changed.
type l2Moves struct {
	owners    map[netip.Addr]string
	live      map[*l2Group]map[string]bool
	regrouped map[netip.Addr]bool
}

// then adds what changed after m: m keeps what it knew first.
func (m *l2Moves) then(n l2Moves) {
	for ip, was := range n.owners {
		if _, ok := m.owners[ip]; !ok {
			m.owners[ip] = was
		}
	}
	for g, nodes := range n.live {
		for node, was := range nodes {
			if _, ok := m.live[g][node]; !ok {
				if m.live[g] == nil {
					m.live[g] = map[string]bool{}
				}
				m.live[g][node] = was
			}
		}
	}
	for ip := range n.regrouped {
		m.regrouped[ip] = true
	}
}

// l2Group is a set of eligible nodes and the addresses it is theirs for.
type l2Group struct {
	nodes map[string]bool
	ips   map[netip.Addr]*l2IP
}

// l2Node is a node some group names: alive at the last look, and those
// groups.
type l2Node struct {
	alive  bool
	groups map[*l2Group]bool
}

type l2IP struct {
	ip    netip.Addr
	key   string
	group *l2Group
	// cands are ranked, the first first.
	cands []l2Cand
	owner string
}

type l2Cand struct {
	node string
	w    uint64
}

func newL2Owners() *l2Owners {
	o := &l2Owners{ips: map[netip.Addr]*l2IP{}, groups: map[string]*l2Group{}, nodes: map[string]*l2Node{},
		owned: map[string]map[netip.Addr]bool{}}
	o.take()
	return o
}

// owner is ip's owner ("" when none, or ip is not an L2 address).
func (o *l2Owners) owner(ip netip.Addr) string {
	if x := o.ips[ip]; x != nil {
		return x.owner
	}
	return ""
}

// ownedBy are the addresses node owns, unsorted.
func (o *l2Owners) ownedBy(node string) []netip.Addr {
	out := make([]netip.Addr, 0, len(o.owned[node]))
	for ip := range o.owned[node] {
		out = append(out, ip)
	}
	return out
}

// take returns what changed since the last take and starts afresh.
func (o *l2Owners) take() l2Moves {
	m := o.since
	o.since = l2Moves{owners: map[netip.Addr]string{}, live: map[*l2Group]map[string]bool{}, regrouped: map[netip.Addr]bool{}}
	return m
}

// changedGroups are the groups whose live nodes are other than before m:
// a node of one died, came back, joined or left it, and is not as it was.
func (o *l2Owners) changedGroups(m l2Moves) map[*l2Group]bool {
	out := map[*l2Group]bool{}
	for g, nodes := range m.live {
		for n, was := range nodes {
			nd := o.nodes[n]
			if was != (nd != nil && nd.alive && g.nodes[n]) {
				out[g] = true
				break
			}
		}
	}
	return out
}

// touch records that node n of g, a live node of it (was) or not, is
// about to change.
func (o *l2Owners) touch(g *l2Group, n string, was bool) {
	if o.since.live[g] == nil {
		o.since.live[g] = map[string]bool{}
	}
	if _, ok := o.since.live[g][n]; !ok {
		o.since.live[g][n] = was
	}
}

// update brings the index to s: its addresses, their eligible nodes, and
// liveness now.
func (o *l2Owners) update(s *State) {
	type want struct {
		base  []string
		picks string
	}
	groups := map[string]want{}
	keys := map[netip.Addr]string{}
	for _, ip := range s.IPs() {
		held := s.held(ip)
		base, key := s.view.Cluster, "*"
		if slices.ContainsFunc(held, func(t Target) bool { return !sameNodes(t.Nodes, s.view.Cluster) }) {
			base = s.Eligible(ip)
			key = "=" + strings.Join(base, ",")
		}
		picks := s.view.Ann.L2PicksIP(ip)
		key += "|" + picks
		keys[ip] = key
		if _, ok := groups[key]; !ok {
			groups[key] = want{base, picks}
		}
	}
	nodePicks := map[string]string{}
	for key, w := range groups {
		nodes := make(map[string]bool, len(w.base))
		for _, n := range w.base {
			if w.picks != "" {
				p, ok := nodePicks[n]
				if !ok {
					p = s.view.Ann.L2PicksNode(n)
					nodePicks[n] = p
				}
				if !config.PicksShared(w.picks, p) {
					continue
				}
			}
			nodes[n] = true
		}
		o.setGroup(key, nodes, s.Alive)
	}
	o.syncLiveness(s.Alive)
	for ip, key := range keys {
		x := o.ips[ip]
		if x != nil && x.key == key {
			continue
		}
		if x == nil {
			x = &l2IP{ip: ip}
			o.ips[ip] = x
		} else {
			delete(x.group.ips, ip)
			o.since.regrouped[ip] = true
		}
		x.key, x.group = key, o.groups[key]
		x.group.ips[ip] = x
		o.rank(x)
	}
	for ip, x := range o.ips {
		if _, ok := keys[ip]; !ok {
			delete(x.group.ips, ip)
			o.setOwner(x, "")
			delete(o.ips, ip)
			delete(o.since.owners, ip)
		}
	}
	for key, g := range o.groups {
		if len(g.ips) == 0 {
			o.setGroup(key, nil, s.Alive)
			delete(o.groups, key)
		}
	}
}

// sameNodes: a target's nodes are the Cluster policy's (the very slice).
func sameNodes(nodes, cluster []string) bool {
	return len(nodes) == len(cluster) && (len(nodes) == 0 || &nodes[0] == &cluster[0])
}

// setGroup makes the group of key hold exactly nodes (creating it): nodes
// that leave it leave its addresses' candidates, nodes that join are
// weighed against them.
func (o *l2Owners) setGroup(key string, nodes map[string]bool, alive func(string) bool) {
	g := o.groups[key]
	if g == nil {
		g = &l2Group{nodes: map[string]bool{}, ips: map[netip.Addr]*l2IP{}}
		o.groups[key] = g
	}
	for n := range g.nodes {
		if !nodes[n] {
			o.leave(g, n)
		}
	}
	for n := range nodes {
		if !g.nodes[n] {
			o.join(g, n, alive)
		}
	}
}

func (o *l2Owners) leave(g *l2Group, n string) {
	delete(g.nodes, n)
	nd := o.nodes[n]
	delete(nd.groups, g)
	if len(nd.groups) == 0 {
		delete(o.nodes, n)
	}
	o.touch(g, n, nd.alive)
	for _, x := range g.ips {
		x.cands = slices.DeleteFunc(x.cands, func(c l2Cand) bool { return c.node == n })
		if x.owner == n {
			o.reassign(x)
		}
	}
}

func (o *l2Owners) join(g *l2Group, n string, alive func(string) bool) {
	g.nodes[n] = true
	nd := o.nodes[n]
	if nd == nil {
		nd = &l2Node{alive: alive(n), groups: map[*l2Group]bool{}}
		o.nodes[n] = nd
	}
	nd.groups[g] = true
	o.touch(g, n, false)
	if !nd.alive {
		return
	}
	for _, x := range g.ips {
		o.weigh(x, n)
	}
}

// syncLiveness looks at every node's liveness and moves what the nodes
// that died or came back since the last look change.
func (o *l2Owners) syncLiveness(alive func(string) bool) {
	var died, back []string
	for n, nd := range o.nodes {
		if a := alive(n); a != nd.alive {
			nd.alive = a
			if a {
				back = append(back, n)
			} else {
				died = append(died, n)
			}
		}
	}
	for _, n := range died {
		for g := range o.nodes[n].groups {
			o.touch(g, n, true)
		}
		for ip := range o.owned[n] {
			o.reassign(o.ips[ip])
		}
	}
	for _, n := range back {
		for g := range o.nodes[n].groups {
			o.touch(g, n, false)
			for _, x := range g.ips {
				o.weigh(x, n)
			}
		}
	}
}

// weigh takes node n, eligible for x and alive, into x's candidates if it
// ranks among them, and makes it x's owner if it outranks the owner.
func (o *l2Owners) weigh(x *l2IP, n string) {
	i := slices.IndexFunc(x.cands, func(c l2Cand) bool { return c.node == n })
	if i < 0 {
		w := l2.Weight(x.ip, n)
		i, _ = slices.BinarySearchFunc(x.cands, l2Cand{n, w}, rankOrder)
		// Below every candidate, n may rank below a live node left out
		// (pushed out, or not weighed after a ranking): it is taken
		// only when no candidate is alive, when none is.
		if i == len(x.cands) && x.owner != "" || i >= l2Candidates {
			return
		}
		x.cands = slices.Insert(x.cands, i, l2Cand{n, w})
		if len(x.cands) > l2Candidates {
			x.cands = x.cands[:l2Candidates]
		}
	}
	// The owner may have just been pushed out: it was the last
	// candidate, and every one above it dead.
	if j := slices.IndexFunc(x.cands, func(c l2Cand) bool { return c.node == x.owner }); j < 0 || i < j {
		o.setOwner(x, n)
	}
}

// rankOrder orders candidates the first first.
func rankOrder(a, b l2Cand) int {
	switch {
	case a.node == b.node:
		return 0
	case l2.Outranks(a.w, a.node, b.w, b.node):
		return -1
	}
	return 1
}

// reassign makes x's owner its first live candidate, ranking its group
// again when none is alive.
func (o *l2Owners) reassign(x *l2IP) {
	for _, c := range x.cands {
		if o.nodes[c.node].alive {
			o.setOwner(x, c.node)
			return
		}
	}
	o.rank(x)
}

// rank ranks x's candidates over its group's live nodes.
func (o *l2Owners) rank(x *l2IP) {
	x.cands = x.cands[:0]
	for n := range x.group.nodes {
		if !o.nodes[n].alive {
			continue
		}
		c := l2Cand{n, l2.Weight(x.ip, n)}
		i, _ := slices.BinarySearchFunc(x.cands, c, rankOrder)
		if i < l2Candidates {
			x.cands = slices.Insert(x.cands, i, c)
			if len(x.cands) > l2Candidates {
				x.cands = x.cands[:l2Candidates]
			}
		}
	}
	owner := ""
	if len(x.cands) > 0 {
		owner = x.cands[0].node
	}
	o.setOwner(x, owner)
}

func (o *l2Owners) setOwner(x *l2IP, n string) {
	if x.owner == n {
		return
	}
	if _, ok := o.since.owners[x.ip]; !ok {
		o.since.owners[x.ip] = x.owner
	}
	if x.owner != "" {
		delete(o.owned[x.owner], x.ip)
		if len(o.owned[x.owner]) == 0 {
			delete(o.owned, x.owner)
		}
	}
	x.owner = n
	if n != "" {
		if o.owned[n] == nil {
			o.owned[n] = map[netip.Addr]bool{}
		}
		o.owned[n][x.ip] = true
	}
}
