package ipvs

import (
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	libipvs "github.com/moby/ipvs"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/portal"
)

// Schedulers are the IPVS schedulers the backend accepts.
var Schedulers = []string{"rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "mh", "fo", "ovf", "twos"}

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
