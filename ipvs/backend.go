package ipvs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"slices"
	"sync"
	"syscall"
	"time"

	libipvs "github.com/moby/ipvs"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/portal"
)

// DummyInterface holds every Service VIP so that the kernel treats them as
// local and hands their packets to IPVS.
const DummyInterface = "onehop-ipvs0"

// Schedulers are the IPVS schedulers the backend accepts.
var Schedulers = []string{"rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "mh", "fo", "ovf", "twos"}

const (
	svcFlagPersistent    = 0x1 // IP_VS_SVC_F_PERSISTENT
	svcFlagHashed        = 0x2 // IP_VS_SVC_F_HASHED: the kernel's, on every listed virtual server
	svcFlagSchedFallback = 0x8 // IP_VS_SVC_F_SCHED1: sh-fallback, mh-fallback
)

// Option configures a Backend.
type Option func(*Backend)

// WithScheduler sets the IPVS scheduler of every virtual server (default rr).
func WithScheduler(s string) Option { return func(b *Backend) { b.sched = s } }

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(b *Backend) { b.log = l } }

// WithStateFile sets where the names of the virtual servers are kept for
// Dump and Cleanup (default /run/onehop/ipvs-services.json).
func WithStateFile(path string) Option { return func(b *Backend) { b.stateFile = path } }

// WithCanaryPeriod sets how often Check runs iptables to see that onehop's
// jumps and chains are still there (default one minute, kube-proxy's
// canary cadence). Every iptables command takes the node's xtables lock,
// which every other iptables user on the node competes for; the other
// checks are netlink reads and run on every Check. 0 checks every time.
func WithCanaryPeriod(d time.Duration) Option { return func(b *Backend) { b.canaryPeriod = d } }

// WithDrainTimeout bounds how long a removed TCP/SCTP destination stays at
// weight 0 while its connections drain (default 2 minutes).
func WithDrainTimeout(d time.Duration) Option { return func(b *Backend) { b.drainTimeout = d } }

// Backend is the IPVS dataplane. It works in the network namespace of the
// thread that called New (netlink sockets) and of the thread calling its
// methods (iptables commands, sysctls): in production both are the host's.
type Backend struct {
	cfg          dataplane.Config
	sched        string
	log          *slog.Logger
	stateFile    string
	drainTimeout time.Duration
	canaryPeriod time.Duration

	mu        sync.Mutex
	ipvs      *libipvs.Handle
	nl        *netlink.Handle
	ipt       map[portal.Family]*iptables
	sets      *ipsets                // nil without netfilter netlink
	applied   *plan                  // what the kernel holds after the last successful sync
	drains    map[drainKey]time.Time // destinations at weight 0, since when
	synced    bool
	needFull  bool
	nodeAddrs []netip.Addr // NodePort addresses of the last sync
	// canaryAt is when the iptables chains were last known to be whole
	// (a sync, or a canary check).
	canaryAt time.Time
	// canaries counts the iptables canary checks Check ran.
	canaries int
	// stateErr is the last error writing the state file (logged once).
	stateErr string
	// v6 turns on the IPv6 chains once an IPv6 Service shows up, so that
	// IPv4-only clusters pay for one family of iptables commands.
	v6 bool
	// scheds is what the kernel said to each scheduler a Service asked
	// for (nil: it has it; see schedulerErr).
	scheds map[string]error
	// failed are the virtual servers the kernel refused; every sync tries
	// them again, and their Service has an event.
	failed map[vsKey]vsFailure
	// problems are the problems reported and still current, per Service
	// (see report).
	problems map[portal.ServiceKey]map[string]bool
	// host are the node's own addresses (not on the dummy) at the last
	// full sync: the Service IP filter leaves them alone.
	host map[netip.Addr]bool
}

// activeIPT returns the iptables of the families in use.
func (b *Backend) activeIPT() map[portal.Family]*iptables {
	m := map[portal.Family]*iptables{}
	for fam, t := range b.ipt {
		if fam == portal.IPv4 || b.v6 {
			m[fam] = t
		}
	}
	return m
}

type drainKey struct {
	vs   vsKey
	dest netip.AddrPort
}

// New returns an IPVS backend. It opens its netlink sockets and checks the
// iptables binaries, but changes nothing before the first Sync.
func New(cfg dataplane.Config, opts ...Option) (*Backend, error) {
	b := &Backend{cfg: cfg, sched: "rr", log: slog.Default(), stateFile: "/run/onehop/ipvs-services.json",
		drainTimeout: 2 * time.Minute, canaryPeriod: time.Minute, drains: map[drainKey]time.Time{},
		scheds: map[string]error{}, failed: map[vsKey]vsFailure{}, problems: map[portal.ServiceKey]map[string]bool{}}
	for _, o := range opts {
		o(b)
	}
	if !slices.Contains(Schedulers, b.sched) {
		return nil, fmt.Errorf("ipvs: unknown scheduler %q (want one of %v)", b.sched, Schedulers)
	}
	h, err := libipvs.New("")
	if err != nil {
		return nil, fmt.Errorf("ipvs: netlink (is the ip_vs module available?): %w", err)
	}
	if _, err := h.GetServices(); err != nil {
		h.Close()
		return nil, fmt.Errorf("ipvs: kernel has no IPVS (modprobe ip_vs): %w", err)
	}
	nh, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		h.Close()
		return nil, fmt.Errorf("ipvs: rtnetlink: %w", err)
	}
	b.ipvs, b.nl = h, nh
	if b.sets, err = openIPSets(); err != nil {
		b.log.Warn("ipvs: no netfilter netlink; Services with loadBalancerSourceRanges will fail to sync", "err", err)
	}
	b.ipt = map[portal.Family]*iptables{}
	for _, fam := range []portal.Family{portal.IPv4, portal.IPv6} {
		t, err := newIPTables(fam)
		if err != nil {
			if fam == portal.IPv4 {
				b.Close()
				return nil, err
			}
			b.log.Warn("ipvs: no ip6tables; IPv6 Services will fail to sync", "err", err)
			continue
		}
		b.ipt[fam] = t
	}
	return b, nil
}

// Close releases the netlink sockets; the kernel state stays.
func (b *Backend) Close() {
	if b.ipvs != nil {
		b.ipvs.Close()
	}
	if b.nl != nil {
		b.nl.Close()
	}
	if b.sets != nil {
		b.sets.close()
	}
}

// Name implements dataplane.Dataplane.
func (b *Backend) Name() string { return "ipvs" }

var _ dataplane.Dataplane = (*Backend)(nil)

// Sync implements dataplane.Dataplane. It computes the whole desired state
// in memory (cheap) and sends the kernel only the differences: against what
// the previous sync applied, or, on a full sync, against what the kernel
// holds. IPVS has no transactions: on error the kernel may hold part of the
// change, and the next (full) sync converges it.
//
// One Service's trouble is that Service's: a scheduler the kernel lacks is
// replaced by the default before anything is sent, a virtual server the
// kernel refuses is left out (and tried again by every sync) while the
// others are programmed, and both are in SyncStats.Problems.
func (b *Backend) Sync(ctx context.Context, snap *portal.Snapshot, full bool) (dataplane.SyncStats, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	sp := newSyncProblems()
	st, err := b.sync(snap, full, sp)
	st.Problems = b.report(sp)
	return st, err
}

func (b *Backend) sync(snap *portal.Snapshot, full bool, sp *syncProblems) (dataplane.SyncStats, error) {
	start := time.Now()
	full = full || !b.synced || b.needFull
	st := dataplane.SyncStats{Full: full, Services: len(snap.Services)}
	if !full {
		st.Services = len(snap.Dirty)
	}
	b.needFull = true // cleared on success
	nodeAddrs, err := b.nodePortAddrs(snap.Node)
	if err != nil {
		return st, err
	}
	in := planInput{Cfg: b.cfg, Sched: b.sched, NodeAddrs: nodeAddrs}
	if !full && !slices.Equal(nodeAddrs, b.nodeAddrs) {
		full, st.Full, st.Services = true, true, len(snap.Services) // every NodePort moves
	}
	if !full && !b.v6 {
		for _, k := range snap.Dirty {
			if s := snap.Services[k]; s != nil && slices.ContainsFunc(s.Portals, func(p *portal.Portal) bool { return p != nil && p.Key.Family == portal.IPv6 }) {
				full, st.Full, st.Services = true, true, len(snap.Services) // sets up the IPv6 chains
			}
		}
	}
	// The Services this sync looks at: their schedulers are asked about
	// before anything is planned, and their problems are reported.
	var looked []portal.ServiceKey
	if full {
		b.forgetRefusals()
		looked = slices.Collect(maps.Keys(snap.Services))
		for k := range b.problems {
			sp.looked[k] = true // gone Services' problems end
		}
	} else {
		looked = append(slices.Clone(snap.Dirty), b.failingServices()...)
		if b.applied != nil {
			looked = b.applied.expandDirty(looked)
		}
	}
	for _, k := range looked {
		sp.looked[k] = true
	}
	in.Refused = b.refusedSchedulers(snap.Services, looked)
	// whole is the complete desired plan; have and want are what the diff
	// looks at: everything on a full sync, only the keys the dirty
	// Services had or now have on an incremental one.
	var whole, have, want *plan
	stateChanged := true
	if full {
		whole = buildPlan(in, snap.Services)
		want = whole
	} else {
		whole = b.applied
		dirty := looked // expanded, with the failing Services
		t := newTouched()
		scratch := newPlan()
		for _, k := range dirty {
			t.addPart(whole.Parts[k])
			if s := snap.Services[k]; s != nil {
				scratch.addService(in, k, s)
			}
		}
		for _, pt := range scratch.Parts {
			t.addPart(pt)
		}
		have = whole.subset(t)
		before := labels(whole, t, dirty, scratch)
		whole.replace(in, dirty, snap.Services)
		want = whole.subset(t)
		stateChanged = before != labels(whole, t, dirty, scratch)
	}
	st.Panics = whole.Panics // left out; the runner reports them
	sp.schedulerProblems(b, snap.Services)
	for _, c := range whole.Conflicts {
		b.log.Warn("ipvs: entry not programmed", "conflict", c)
	}
	for k, v := range want.Servers {
		if b.ipt[k.family()] == nil {
			return st, fmt.Errorf("ipvs: %s needs ip6tables, which is missing", v.Portal)
		}
		if k.family() == portal.IPv6 {
			b.v6 = true
		}
	}
	batches := map[portal.Family]batch{}
	if full {
		if err := b.setup(); err != nil {
			return st, err
		}
		if have, err = b.readKernel(); err != nil {
			return st, err
		}
		if !b.synced {
			b.logForeign(have.Foreign, want)
		}
		if !b.v6 && !b.synced && b.ipt[portal.IPv6] != nil {
			// A previous process had IPv6 Services: reconcile (and
			// remove, if they are gone) its ip6tables rules too.
			if tr, err := b.ipt[portal.IPv6].snapshot("nat"); err == nil {
				_, b.v6 = tr[chainPostrouting]
			}
		}
		for fam, t := range b.activeIPT() {
			tables, err := t.tablesNow()
			if err != nil {
				return st, err
			}
			bt := batch{}
			t.ensureBase(b.cfg, fam, tables, bt, b.sets != nil)
			readRules(fam, have, tables)
			batches[fam] = bt
		}
	}
	changed := map[portal.PortKey]bool{}
	msgs, err := b.applyServers(have, want, !full, changed, sp)
	st.Messages += msgs
	if err != nil {
		return st, err
	}
	if full {
		if b.host, err = b.hostAddrs(); err != nil {
			return st, err
		}
	}
	haveFilter, wantFilter := have.Filter, filterOf(want, b.host)
	if !full {
		haveFilter = filterOf(have, b.host)
	}
	msgs, err = b.sets.applyFilter(haveFilter, wantFilter, slices.Collect(maps.Keys(b.activeIPT())))
	st.Messages += msgs
	if err != nil {
		return st, err
	}
	msgs, err = b.applyVIPs(have, want)
	st.Messages += msgs
	if err != nil {
		return st, err
	}
	msgs, err = b.sets.apply(have, want)
	st.Messages += msgs
	if err != nil {
		return st, err
	}
	msgs, err = b.applyRules(have, want, batches)
	st.Messages += msgs
	if err != nil {
		return st, err
	}
	st.Messages += b.sets.destroyStale(have, want)
	if stateChanged {
		b.saveState(whole)
	}
	// Keep the draining destinations in the applied state: they are in the kernel.
	for dk := range b.drains {
		if v := whole.Servers[dk.vs]; v != nil {
			if _, ok := v.Dests[dk.dest]; !ok {
				v.Dests[dk.dest] = 0
			}
		}
	}
	b.applied, b.nodeAddrs, b.synced, b.needFull = whole, nodeAddrs, true, false
	if full {
		b.canaryAt = time.Now() // the full sync made the chains whole
	}
	st.Changed = len(changed)
	st.Rules = len(whole.Rules)
	for _, v := range whole.Servers {
		st.Elements += 1 + len(v.Dests)
	}
	for _, c := range whole.Sets {
		st.Elements += len(c.Nets)
	}
	b.reapLocked(time.Now())
	st.Duration = time.Since(start)
	return st, nil
}

// nodePortAddrs are the addresses NodePorts are served on: the node's
// configured ones, or else every global unicast address of the node.
func (b *Backend) nodePortAddrs(n portal.Node) ([]netip.Addr, error) {
	if len(n.NodePortAddrs) > 0 {
		out := slices.Clone(n.NodePortAddrs)
		for i, a := range out {
			out[i] = a.Unmap()
		}
		slices.SortFunc(out, netip.Addr.Compare)
		return slices.Compact(out), nil
	}
	own, err := b.ownAddrs()
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, a := range own {
		if a.IsGlobalUnicast() {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out), nil
}

// ownAddrs are the node's addresses on interfaces other than the dummy.
func (b *Backend) ownAddrs() ([]netip.Addr, error) {
	addrs, err := b.nl.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("ipvs: listing node addresses: %w", err)
	}
	dummyIdx := -1
	if l, err := b.nl.LinkByName(DummyInterface); err == nil {
		dummyIdx = l.Attrs().Index
	}
	var out []netip.Addr
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && a.LinkIndex != dummyIdx {
			out = append(out, ip.Unmap())
		}
	}
	return out, nil
}

// setup sets the sysctls (see doc.go for why each) and creates the dummy
// interface.
func (b *Backend) setup() error {
	if err := setSysctls(); err != nil {
		return err
	}
	_, err := b.ensureDummy()
	return err
}

func (b *Backend) ensureDummy() (netlink.Link, error) {
	l, err := b.nl.LinkByName(DummyInterface)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if !errors.As(err, &nf) {
			return nil, fmt.Errorf("ipvs: %s: %w", DummyInterface, err)
		}
		la := netlink.NewLinkAttrs()
		la.Name = DummyInterface
		if err := b.nl.LinkAdd(&netlink.Dummy{LinkAttrs: la}); err != nil {
			return nil, fmt.Errorf("ipvs: creating %s (needs the dummy module): %w", DummyInterface, err)
		}
		if l, err = b.nl.LinkByName(DummyInterface); err != nil {
			return nil, err
		}
	}
	if l.Attrs().Flags&net.FlagUp == 0 {
		if err := b.nl.LinkSetUp(l); err != nil {
			return nil, fmt.Errorf("ipvs: %s up: %w", DummyInterface, err)
		}
	}
	return l, nil
}

// readKernel reads the state onehop owns from the kernel: the IPVS services
// (those on its VIPs or NodePorts it recorded) and the dummy's addresses;
// Sync adds the iptables rules (readRules).
func (b *Backend) readKernel() (*plan, error) {
	pl := newPlan()
	vips, err := b.dummyAddrs()
	if err != nil {
		return nil, err
	}
	for _, a := range vips {
		pl.VIPs[a] = true
	}
	pl.Filter = filterState{Sets: map[string]bool{}, VIPs: map[netip.Addr]bool{}, Ports: map[vsKey]bool{}}
	if err := b.sets.read(pl); err != nil {
		return nil, err
	}
	names := b.namesLocked()
	svcs, err := b.ipvs.GetServices()
	if err != nil {
		return nil, fmt.Errorf("ipvs: listing services: %w", err)
	}
	for _, s := range svcs {
		v, err := b.readServer(s)
		if err != nil {
			return nil, err
		}
		if v == nil {
			continue
		}
		if _, ours := names[v.Key.String()]; !ours && !pl.VIPs[v.Key.Addr] {
			pl.Foreign = append(pl.Foreign, v.Key) // not onehop's
			continue
		}
		pl.Servers[v.Key] = v
	}
	return pl, nil
}

func (b *Backend) readServer(s *libipvs.Service) (*virtualServer, error) {
	if s.FWMark != 0 {
		return nil, nil
	}
	addr, ok := netip.AddrFromSlice(s.Address)
	if !ok {
		return nil, nil
	}
	if s.AddressFamily == syscall.AF_INET {
		addr = addr.Unmap()
		if addr.Is6() { // moby/ipvs returns 16 bytes for some IPv4 services
			return nil, nil
		}
	}
	v := &virtualServer{Key: vsKey{Proto: portal.Protocol(s.Protocol), Addr: addr.Unmap(), Port: s.Port}, Sched: s.SchedName,
		Dests: map[netip.AddrPort]int{}}
	v.Fallback = s.Flags&svcFlagSchedFallback != 0
	if s.Flags&svcFlagPersistent != 0 {
		v.Timeout = s.Timeout
	}
	ds, err := b.ipvs.GetDestinations(s)
	if err != nil {
		return nil, fmt.Errorf("ipvs: destinations of %s: %w", v.Key, err)
	}
	for _, d := range ds {
		a, ok := netip.AddrFromSlice(d.Address)
		if !ok {
			continue
		}
		v.Dests[netip.AddrPortFrom(a.Unmap(), d.Port)] = d.Weight
	}
	return v, nil
}

func (b *Backend) dummyAddrs() ([]netip.Addr, error) {
	l, err := b.nl.LinkByName(DummyInterface)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil, nil
		}
		return nil, err
	}
	as, err := b.nl.AddrList(l, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("ipvs: addresses of %s: %w", DummyInterface, err)
	}
	var out []netip.Addr
	for _, a := range as {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && !ip.IsLinkLocalUnicast() {
			out = append(out, ip.Unmap())
		}
	}
	return out, nil
}

func toService(v *virtualServer) *libipvs.Service {
	s := &libipvs.Service{Address: net.IP(v.Key.Addr.AsSlice()), Protocol: uint16(v.Key.Proto), Port: v.Key.Port,
		SchedName: v.Sched, AddressFamily: syscall.AF_INET, Netmask: 0xffffffff}
	if v.Key.Addr.Is6() {
		s.AddressFamily, s.Netmask = syscall.AF_INET6, 128
	}
	if v.Timeout > 0 {
		s.Flags, s.Timeout = svcFlagPersistent, v.Timeout
	}
	if v.Fallback {
		s.Flags |= svcFlagSchedFallback
	}
	return s
}

func toDest(d netip.AddrPort, weight int) *libipvs.Destination {
	fam := uint16(syscall.AF_INET)
	if d.Addr().Is6() {
		fam = syscall.AF_INET6
	}
	return &libipvs.Destination{Address: net.IP(d.Addr().AsSlice()), Port: d.Port(), Weight: weight,
		ConnectionFlags: libipvs.ConnectionFlagMasq, AddressFamily: fam}
}

// applyServers sends the IPVS differences between have and want. A virtual
// server the kernel refuses is recorded in b.failed and sp, and the others
// go on; one that exists already without onehop knowing it (kube-proxy's,
// or onehop's after its state file was lost) is adopted: updated to what
// the Service asks for. With haveFromPlan, have is the applied plan rather
// than the kernel, and the failed virtual servers in it are created (or
// adopted) again.
func (b *Backend) applyServers(have, want *plan, haveFromPlan bool, changed map[portal.PortKey]bool, sp *syncProblems) (int, error) {
	msgs := 0
	now := time.Now()
	for k, v := range want.Servers {
		old := have.Servers[k]
		if _, failed := b.failed[k]; failed && haveFromPlan {
			old = nil
		}
		n, err := b.applyServer(k, v, old, now, changed)
		msgs += n
		if err != nil && !refusedByKernel(err) {
			return msgs, fmt.Errorf("ipvs: %s for %s: %w", k, v.Portal, err) // the node's trouble, not the Service's
		}
		if err != nil {
			if prev, ok := b.failed[k]; !ok || prev.err.Error() != err.Error() {
				b.log.Error("ipvs: virtual server not programmed; the other Services are", "service", v.Portal.String(), "virtual_server", k.String(), "err", err)
			}
			b.failed[k] = vsFailure{service: v.Portal.Service, err: err}
			sp.add(v.Portal.Service, ReasonVirtualServerFailed, "%s not served at %s: %v", v.Portal.Port, k, err)
			continue
		}
		delete(b.failed, k)
	}
	if !haveFromPlan {
		for k := range b.failed {
			if _, ok := want.Servers[k]; !ok {
				delete(b.failed, k) // no longer wanted
			}
		}
	}
	for k, old := range have.Servers {
		if _, ok := want.Servers[k]; ok {
			continue
		}
		msgs++
		delete(b.failed, k)
		if err := b.ipvs.DelService(toService(old)); err != nil && !isNotExist(err) {
			return msgs, fmt.Errorf("ipvs: removing %s: %w", k, err)
		}
		for dk := range b.drains {
			if dk.vs == k {
				delete(b.drains, dk)
			}
		}
		changed[old.Portal] = true
	}
	return msgs, nil
}

// applyServer brings one virtual server from old (nil: not in the kernel,
// as far as onehop knows) to v.
func (b *Backend) applyServer(k vsKey, v, old *virtualServer, now time.Time, changed map[portal.PortKey]bool) (int, error) {
	msgs := 0
	svc := toService(v)
	switch {
	case old == nil:
		msgs++
		err := b.ipvs.NewService(svc)
		if errors.Is(err, syscall.EEXIST) {
			msgs += 2
			old, err = b.adopt(svc, v)
		} else if err != nil {
			err = fmt.Errorf("adding it: %w", err)
		}
		if err != nil {
			return msgs, err
		}
		if old == nil {
			old = &virtualServer{Dests: map[netip.AddrPort]int{}}
		}
		changed[v.Portal] = true
	case !old.sameService(v):
		msgs++
		if err := b.ipvs.UpdateService(svc); err != nil {
			return msgs, fmt.Errorf("updating it: %w", err)
		}
		changed[v.Portal] = true
	}
	for d, w := range v.Dests {
		ow, ok := old.Dests[d]
		switch {
		case !ok:
			msgs++
			if err := b.ipvs.NewDestination(svc, toDest(d, w)); err != nil {
				return msgs, fmt.Errorf("adding endpoint %s: %w", d, err)
			}
			changed[v.Portal] = true
		case ow != w:
			msgs++
			if err := b.ipvs.UpdateDestination(svc, toDest(d, w)); err != nil {
				return msgs, fmt.Errorf("weight of endpoint %s: %w", d, err)
			}
			changed[v.Portal] = true
		}
		delete(b.drains, drainKey{k, d})
	}
	for d, ow := range old.Dests {
		if _, ok := v.Dests[d]; ok {
			continue
		}
		dk := drainKey{k, d}
		if k.Proto == portal.UDP {
			// No graceful termination for UDP: flows have no end, and
			// expire_nodest_conn moves them on their next packet.
			msgs++
			if err := b.ipvs.DelDestination(svc, toDest(d, 0)); err != nil && !isNotExist(err) {
				return msgs, fmt.Errorf("removing endpoint %s: %w", d, err)
			}
			delete(b.drains, dk)
			changed[v.Portal] = true
			continue
		}
		if ow != 0 {
			msgs++
			if err := b.ipvs.UpdateDestination(svc, toDest(d, 0)); err != nil {
				return msgs, fmt.Errorf("draining endpoint %s: %w", d, err)
			}
			changed[v.Portal] = true
		}
		if _, ok := b.drains[dk]; !ok {
			b.drains[dk] = now
		}
	}
	return msgs, nil
}

// logForeign says, once per process, which virtual servers that onehop
// did not make it leaves alone: those at no address, port and protocol of a
// Service (the others it adopts).
func (b *Backend) logForeign(foreign []vsKey, want *plan) {
	var left []string
	for _, k := range foreign {
		if want.Servers[k] == nil {
			left = append(left, k.String())
		}
	}
	if len(left) == 0 {
		return
	}
	slices.Sort(left)
	b.log.Info("ipvs: virtual servers onehop did not make and no Service asks for are left alone",
		"count", len(left), "first", left[:min(len(left), 10)])
}

// refusedByKernel reports whether err is the kernel refusing one virtual
// server or destination as asked (a scheduler it lacks, a value it does not
// take, one that exists already and could not be adopted), rather than
// trouble of the node (out of memory, netlink itself failing), which fails
// the sync.
func refusedByKernel(err error) bool {
	for _, e := range []syscall.Errno{syscall.EINVAL, syscall.ENOENT, syscall.EEXIST, syscall.ESRCH, syscall.EOPNOTSUPP,
		syscall.EAFNOSUPPORT, syscall.EPROTONOSUPPORT, syscall.ERANGE} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// adopt takes over the virtual server the kernel already has at svc's
// address, port and protocol: it is onehop's to program, whoever made it
// (kube-proxy's IPVS mode leaves its virtual servers behind, and a lost
// state file hides onehop's own NodePort ones), as kube-proxy updates an
// existing one. Its settings are updated to v's, and its destinations are
// returned as old ones, so that those v does not have drain and go; a
// destination forwarded otherwise than by masquerade gets weight -1, so
// that it is updated.
func (b *Backend) adopt(svc *libipvs.Service, v *virtualServer) (*virtualServer, error) {
	cur, err := b.ipvs.GetService(svc)
	if err != nil {
		return nil, fmt.Errorf("it exists, but reading it failed: %w", err)
	}
	old := &virtualServer{Key: v.Key, Sched: cur.SchedName, Dests: map[netip.AddrPort]int{}}
	old.Fallback = cur.Flags&svcFlagSchedFallback != 0
	if cur.Flags&svcFlagPersistent != 0 {
		old.Timeout = cur.Timeout
	}
	ds, err := b.ipvs.GetDestinations(cur)
	if err != nil {
		return nil, fmt.Errorf("it exists, but reading its destinations failed: %w", err)
	}
	for _, d := range ds {
		a, ok := netip.AddrFromSlice(d.Address)
		if !ok {
			continue
		}
		w := d.Weight
		if d.ConnectionFlags&libipvs.ConnectionFlagFwdMask != libipvs.ConnectionFlagMasq {
			w = -1
		}
		old.Dests[netip.AddrPortFrom(a.Unmap(), d.Port)] = w
	}
	if !old.sameService(v) || cur.Flags&^(svcFlagPersistent|svcFlagHashed|svcFlagSchedFallback) != 0 {
		if err := b.ipvs.UpdateService(svc); err != nil {
			return nil, fmt.Errorf("it exists, and updating it failed: %w", err)
		}
	}
	b.log.Info("ipvs: adopted an existing virtual server", "service", v.Portal.String(), "virtual_server", v.Key.String(),
		"scheduler", cur.SchedName, "destinations", len(old.Dests))
	return old, nil
}

// applyVIPs binds the wanted VIPs to the dummy interface and removes the others.
func (b *Backend) applyVIPs(have, want *plan) (int, error) {
	l, err := b.ensureDummy()
	if err != nil {
		return 0, err
	}
	msgs := 0
	for a := range want.VIPs {
		if have.VIPs[a] {
			continue
		}
		msgs++
		if err := b.nl.AddrAdd(l, vipAddr(a)); err != nil && !errors.Is(err, syscall.EEXIST) {
			return msgs, fmt.Errorf("ipvs: binding %s to %s: %w", a, DummyInterface, err)
		}
	}
	for a := range have.VIPs {
		if want.VIPs[a] {
			continue
		}
		msgs++
		if err := b.nl.AddrDel(l, vipAddr(a)); err != nil && !errors.Is(err, syscall.EADDRNOTAVAIL) {
			return msgs, fmt.Errorf("ipvs: unbinding %s: %w", a, err)
		}
	}
	return msgs, nil
}

func vipAddr(a netip.Addr) *netlink.Addr {
	pfx := netip.PrefixFrom(a, a.BitLen())
	na := &netlink.Addr{IPNet: &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(pfx.Bits(), a.BitLen())}}
	if a.Is6() {
		na.Flags = syscall.IFA_F_NODAD
	}
	return na
}

func isNotExist(err error) bool {
	return errors.Is(err, syscall.ESRCH) || errors.Is(err, syscall.ENOENT)
}

// Reap deletes drained destinations: those with no connections left, or
// drained for longer than the drain timeout. Check calls it; Sync too.
func (b *Backend) reapLocked(now time.Time) {
	if len(b.drains) == 0 {
		return
	}
	byVS := map[vsKey][]netip.AddrPort{}
	for dk := range b.drains {
		byVS[dk.vs] = append(byVS[dk.vs], dk.dest)
	}
	for k, dests := range byVS {
		v := b.applied.Servers[k]
		svc := &virtualServer{Key: k, Sched: b.sched}
		if v != nil {
			svc = v
		}
		ds, err := b.ipvs.GetDestinations(toService(svc))
		if err != nil {
			b.log.Warn("ipvs: reading draining destinations", "service", k.String(), "err", err)
			continue
		}
		conns := map[netip.AddrPort]int{}
		present := map[netip.AddrPort]bool{}
		for _, d := range ds {
			if a, ok := netip.AddrFromSlice(d.Address); ok {
				ap := netip.AddrPortFrom(a.Unmap(), d.Port)
				conns[ap] = d.ActiveConnections + d.InactiveConnections
				present[ap] = true
			}
		}
		for _, d := range dests {
			dk := drainKey{k, d}
			if present[d] && conns[d] > 0 && now.Sub(b.drains[dk]) < b.drainTimeout {
				continue
			}
			if present[d] {
				if err := b.ipvs.DelDestination(toService(svc), toDest(d, 0)); err != nil && !isNotExist(err) {
					b.log.Warn("ipvs: removing drained destination", "service", k.String(), "dest", d.String(), "err", err)
					continue
				}
			}
			delete(b.drains, dk)
			if v != nil && v.Dests[d] == 0 {
				delete(v.Dests, d)
			}
			b.log.Debug("ipvs: destination drained", "service", k.String(), "dest", d.String(), "connections", conns[d])
		}
	}
}

// Draining returns the destinations currently kept at weight 0.
func (b *Backend) Draining() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for dk := range b.drains {
		out = append(out, dk.vs.String()+" -> "+dk.dest.String())
	}
	slices.Sort(out)
	return out
}

// Check implements dataplane.Dataplane: the dummy interface must still be
// there and up (netlink, every Check), and the iptables jumps and chains
// (`iptables -C`, at most once per canary period, see WithCanaryPeriod, so
// that a Check every second does not compete for the xtables lock). It also
// deletes drained destinations, so that draining is bounded even when no
// Sync comes.
func (b *Backend) Check(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.synced {
		return nil
	}
	b.reapLocked(time.Now())
	b.sets.reap()
	l, err := b.nl.LinkByName(DummyInterface)
	if err != nil {
		return fmt.Errorf("ipvs: %s is gone: %w", DummyInterface, err)
	}
	if l.Attrs().Flags&net.FlagUp == 0 {
		return fmt.Errorf("ipvs: %s is down", DummyInterface)
	}
	if now := time.Now(); b.canaryPeriod <= 0 || now.Sub(b.canaryAt) >= b.canaryPeriod {
		b.canaries++
		for fam, t := range b.activeIPT() {
			if err := t.checkBase(fam, b.sets != nil); err != nil {
				return err // canaryAt stays: the next Check looks again
			}
		}
		b.canaryAt = now
	}
	return nil
}

// Cleanup implements dataplane.Dataplane: it removes onehop's IPVS services
// (those on the dummy's VIPs or recorded in the state file), the dummy
// interface, onehop's iptables chains and jumps, its ipsets, and the state
// file.
func (b *Backend) Cleanup(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	var errs []error
	have, err := b.readKernel()
	if err != nil {
		errs = append(errs, err)
	} else {
		for k, v := range have.Servers {
			if err := b.ipvs.DelService(toService(v)); err != nil && !isNotExist(err) {
				errs = append(errs, fmt.Errorf("ipvs: removing %s: %w", k, err))
			}
		}
	}
	if l, err := b.nl.LinkByName(DummyInterface); err == nil {
		if err := b.nl.LinkDel(l); err != nil {
			errs = append(errs, fmt.Errorf("ipvs: deleting %s: %w", DummyInterface, err))
		}
	}
	for _, t := range b.ipt {
		if err := t.cleanup(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := b.sets.destroyAll(); err != nil { // after the rules that use them
		errs = append(errs, err)
	}
	removeState(b.stateFile)
	b.applied, b.synced, b.drains = nil, false, map[drainKey]time.Time{}
	return errors.Join(errs...)
}

// labels summarises what the state file records for the touched servers
// and the dirty Services' local endpoints, to rewrite it only on change.
func labels(pl *plan, t *touched, dirty []portal.ServiceKey, scratch *plan) string {
	var out []string
	for k := range t.servers {
		if v := pl.Servers[k]; v != nil {
			out = append(out, k.String()+" "+v.Portal.String()+" "+v.Kind)
		}
	}
	ports := map[string]bool{}
	for _, k := range dirty {
		if pt := pl.Parts[k]; pt != nil {
			for _, l := range pt.Local {
				ports[l] = true
			}
		}
	}
	for _, pt := range scratch.Parts {
		for _, l := range pt.Local {
			ports[l] = true
		}
	}
	for p := range ports {
		out = append(out, p+" "+fmt.Sprint(pl.Local[p])+" "+pl.Topology[p])
	}
	slices.Sort(out)
	return fmt.Sprint(out)
}
