package nft

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"time"

	"github.com/google/nftables"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/portal"
)

// Backend is the nftables Dataplane. It is not safe for concurrent use:
// the sync runner calls it from one goroutine.
type Backend struct {
	cfg     dataplane.Config
	log     *slog.Logger
	netnsFD int
	// ruleDumpPerChainFrom overrides perChainRuleDumpFrom (tests).
	ruleDumpPerChainFrom int

	table *nftables.Table
	sets  map[string]*nftables.Set

	// What the kernel holds, as far as this process applied it.
	synced   bool
	services map[portal.ServiceKey]*appliedService
	owners   map[string]portal.PortKey // elem id -> portal that owns it
	refs     map[string]int            // shared element id -> portals using it
	affSets  map[string]uint32         // affinity maps in the table -> their timeout (s)
	npIPs    []netip.Addr
	podIPs   []portal.PodExternalIP
	svcCIDRs []netip.Prefix // in the service-cidrs sets (portal.UnionCIDRs)
	// ids number the chains that pick from the endpoint maps: an endpoint
	// element's key is chain id . index.
	ids      map[string]uint32
	freeIDs  []uint32
	nextID   uint32
	chains   int // per-portal chains
	elements int
	lastUse  uint32 // the table's use count after our last sync
	gen      genTracker
	socks    sockets
	events   eventsGate // the Watch socket, out of its group for large own transactions
	// beforeCommit, when set (by tests), runs between a sync's diff and
	// its commit: where another program's change races the sync.
	beforeCommit func()
	// cfgKeyText is cfgKey, formatted once in New.
	cfgKeyText string
}

type appliedService struct {
	svc  *portal.Service
	objs map[portal.PortKey]*objects
}

// Option configures a Backend.
type Option func(*Backend)

// WithNetNS makes the backend program the network namespace behind fd
// instead of the caller's (used by tests).
func WithNetNS(fd int) Option { return func(b *Backend) { b.netnsFD = fd } }

// WithLogger sets the logger.
func WithLogger(l *slog.Logger) Option { return func(b *Backend) { b.log = l } }

// New returns an nftables backend. It changes nothing until the first Sync.
func New(cfg dataplane.Config, opts ...Option) *Backend {
	b := &Backend{cfg: cfg, log: slog.Default(), netnsFD: -1}
	for _, o := range opts {
		o(b)
	}
	b.socks = sockets{netnsFD: b.netnsFD, own: &ownPorts{}}
	b.cfgKeyText = b.formatCfgKey()
	b.table = &nftables.Table{Name: TableName, Family: nftables.TableFamilyINet}
	b.sets = map[string]*nftables.Set{}
	for _, s := range fixedSets(b.table) {
		b.sets[s.Name] = s
	}
	b.reset()
	return b
}

func (b *Backend) reset() {
	b.synced = false
	b.services = map[portal.ServiceKey]*appliedService{}
	b.owners = map[string]portal.PortKey{}
	b.refs = map[string]int{}
	b.affSets = map[string]uint32{}
	b.npIPs, b.podIPs, b.svcCIDRs = nil, nil, nil
	b.ids, b.freeIDs, b.nextID = map[string]uint32{}, nil, 1
	b.chains, b.elements = 0, 0
}

// Name implements dataplane.Dataplane.
func (b *Backend) Name() string { return "nft" }

// chainID returns the id of a chain, allocating one if needed. A failed
// transaction resets the backend, so ids can be taken before commit.
func (b *Backend) chainID(name string) uint32 {
	if id, ok := b.ids[name]; ok {
		return id
	}
	var id uint32
	if n := len(b.freeIDs); n > 0 {
		id, b.freeIDs = b.freeIDs[n-1], b.freeIDs[:n-1]
	} else {
		id = b.nextID
		b.nextID++
	}
	b.ids[name] = id
	return id
}

func (b *Backend) releaseID(name string) {
	if id, ok := b.ids[name]; ok {
		delete(b.ids, name)
		b.freeIDs = append(b.freeIDs, id)
	}
}

// Sync implements dataplane.Dataplane.
//
// A full sync reads the table back and reconciles it in place, unless the
// kernel's nftables generation shows that nothing was committed since this
// process's last sync: then the kernel holds what the backend remembers,
// and the full sync compares every Service with that memory instead (the
// same outcome, without reading 100k elements back).
func (b *Backend) Sync(ctx context.Context, snap *portal.Snapshot, full bool) (dataplane.SyncStats, error) {
	start := time.Now()
	full = full || !b.synced
	gen0, genErr := generation(&b.socks)
	memoryKnown := b.synced && b.gen.known && genErr == nil && gen0 == b.gen.gen
	readBack := full && !memoryKnown
	conn, err := b.socks.queryConn()
	if err != nil {
		return dataplane.SyncStats{}, err
	}
	txConn, sender, err := newTxConn(&b.socks)
	if err != nil {
		return dataplane.SyncStats{}, err
	}
	if readBack {
		b.ids, b.freeIDs, b.nextID = map[string]uint32{}, nil, 1
	}
	t := b.newTx(txConn, sender, readBack)
	if readBack {
		t.presize(snap)
		if err := b.prepareFull(t, conn); err != nil {
			b.socks.dropQuery()
			b.gen.known = false
			return dataplane.SyncStats{}, err
		}
	}
	keys := snap.Dirty
	if full {
		keys = keys[:0:0]
		for k := range snap.Services {
			keys = append(keys, k)
		}
		if !readBack { // Services the kernel still holds and the snapshot lost
			for k := range b.services {
				if snap.Services[k] == nil {
					keys = append(keys, k)
				}
			}
		}
		slices.SortFunc(keys, func(a, b portal.ServiceKey) int {
			if a.Namespace != b.Namespace {
				return compareStrings(a.Namespace, b.Namespace)
			}
			return compareStrings(a.Name, b.Name)
		})
	}
	for _, k := range keys {
		if err := ctx.Err(); err != nil {
			return dataplane.SyncStats{}, err
		}
		t.serviceSafely(k, snap.Services[k])
	}
	t.nodePortIPs(snap.Node.NodePortAddrs)
	t.podExternalIPs(snap.Node.PodExternalIPs)
	t.serviceCIDRs(snap.ServiceCIDRs)
	quiet := t.pendingElems() > quietAbove && b.events.pause()
	if b.beforeCommit != nil {
		b.beforeCommit()
	}
	stats, err := t.commit()
	stats.Full, stats.ReadBack = full, readBack
	stats.Services = len(keys)
	stats.Duration = time.Since(start)
	if err != nil {
		b.reset() // the kernel rolled back; only a full sync is safe now
		b.gen.known = false
		if quiet {
			b.events.resume(false)
		}
		return stats, err
	}
	b.gen.after(&b.socks, gen0, genErr, stats.Messages > 0, readBack || memoryKnown)
	if quiet {
		// A full sync that read the table back started from the kernel's
		// state, so the generation tells any other commit since.
		b.events.resume(b.gen.known)
	}
	if tb, err := conn.ListTableOfFamily(TableName, nftables.TableFamilyINet); err == nil {
		b.lastUse = tb.Use
	} else {
		b.socks.dropQuery()
	}
	return stats, nil
}

// prepareFull starts a full sync: it reads the table the kernel holds and
// reconciles it in place, keeping chain ids (and so the endpoint maps'
// keys), affinity entries and counters. Only a table that cannot be read
// as this version lays it out is replaced as a whole.
func (b *Backend) prepareFull(t *tx, conn *nftables.Conn) error {
	state, err := b.readState(conn, func(set string) int { return cap(t.addElems[set]) }, t.flatBound > flatReadBackMax)
	switch {
	case err != nil:
		b.log.Warn("replacing the onehop table as a whole", "err", err)
		return t.writeFixed(true)
	case state == nil:
		return t.writeFixed(false)
	}
	t.kernel = state
	for chain, tag := range state.tags {
		if id, ok := parseTag(tag); ok && id > 0 {
			b.ids[chain] = id
			b.nextID = max(b.nextID, id+1)
		}
	}
	return t.reconcileFixed()
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Check implements dataplane.Dataplane: it notices when the table was
// deleted, or chains, sets or base rules were removed or added by someone
// else. It costs a few netlink round trips.
func (b *Backend) Check(ctx context.Context) error {
	if !b.synced {
		return nil
	}
	conn, err := b.socks.queryConn()
	if err != nil {
		return err
	}
	err = b.check(conn)
	if err != nil {
		b.socks.dropQuery()
	}
	return err
}

func (b *Backend) check(conn *nftables.Conn) error {
	tb, err := conn.ListTableOfFamily(TableName, nftables.TableFamilyINet)
	if err != nil {
		return fmt.Errorf("table inet %s is gone: %w", TableName, err)
	}
	if tb.Use != b.lastUse {
		return fmt.Errorf("table inet %s holds %d objects, onehop left %d: changed by someone else", TableName, tb.Use, b.lastUse)
	}
	want := fixedRules(b.cfg)
	for _, c := range []string{chainServices, chainNatPrerouting, chainNatPostrouting, chainNoEndpoints, chainNoEndpointsNP} {
		rules, err := conn.GetRules(b.table, &nftables.Chain{Name: c, Table: b.table})
		if err != nil {
			return fmt.Errorf("chain %s: %w", c, err)
		}
		if len(rules) != len(want[c]) {
			return fmt.Errorf("chain %s has %d rules, onehop left %d: changed by someone else", c, len(rules), len(want[c]))
		}
	}
	return nil
}

// Close closes the netlink sockets the backend keeps between syncs. The
// backend stays usable: the next request opens them again.
func (b *Backend) Close() error { return b.socks.close() }

// Cleanup implements dataplane.Dataplane: it deletes the onehop table, and
// nothing else. A missing table is not an error. It closes the sockets the
// backend keeps.
func (b *Backend) Cleanup(ctx context.Context) error {
	defer b.socks.close()
	conn, err := newConn(b.netnsFD)
	if err != nil {
		return err
	}
	if _, err := conn.ListTableOfFamily(TableName, nftables.TableFamilyINet); err != nil {
		b.reset()
		return nil
	}
	conn.DelTable(b.table)
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("delete table inet %s: %w", TableName, err)
	}
	b.reset()
	return nil
}
