package dataplane

import (
	"context"
	"net/netip"
	"strings"
	"time"

	"github.com/onehop/onehop/portal"
)

// Dataplane programs the kernel from desired portals. Implementations keep
// what they applied in memory and send only differences; they never read
// Kubernetes objects.
type Dataplane interface {
	// Name is the backend's name, as given to --dataplane.
	Name() string
	// Sync brings the kernel to the snapshot in one atomic step. With full
	// false it may look only at snap.Dirty; with full true (first sync,
	// after a failure, after someone else changed onehop's state) it
	// rewrites everything it owns. On error the kernel keeps its previous
	// state and the next Sync must be full.
	Sync(ctx context.Context, snap *portal.Snapshot, full bool) (SyncStats, error)
	// Check reports an error when the kernel no longer holds what the last
	// Sync applied (for example the table was deleted or flushed by someone
	// else). It must be cheap: the runner calls it every second.
	Check(ctx context.Context) error
	// Dump reads the kernel's state (not the backend's memory).
	Dump(ctx context.Context) (*Dump, error)
	// Cleanup removes everything the backend installed, and nothing else.
	Cleanup(ctx context.Context) error
}

// SyncStats describes one Sync.
type SyncStats struct {
	Full bool
	// ReadBack: this full sync read the kernel's state back and reconciled
	// it; false when the backend could prove the kernel unchanged since its
	// last sync and compared with what it remembers.
	ReadBack bool
	Services int // Services looked at
	Changed  int // portals whose kernel state changed
	Messages int // netlink messages (or commands) sent
	Rules    int // rules in the ruleset after the sync
	Elements int // map/set elements after the sync
	Duration time.Duration
	// CPU is the CPU time the sync's thread spent (the kernel's work on
	// its netlink messages included), without the time it waited for a
	// CPU on a busy node; the Runner fills it in and paces syncs by it.
	CPU time.Duration
	// Panics are the Services left out of this sync because rendering them
	// panicked (see ServicePanic).
	Panics []ServicePanic
	// Problems are Services, or parts of them, that the backend could not
	// program as asked while the sync went on with every other Service
	// (see Runner.OnServiceProblem). A backend lists each problem once while it
	// lasts, even when the sync fails.
	Problems []portal.Problem
}

// Config is the node-level configuration every backend is built with.
type Config struct {
	// ClusterCIDRs are the pod networks; traffic to a cluster IP from
	// outside them is masqueraded. Empty means: never (unless MasqueradeAll).
	ClusterCIDRs []netip.Prefix
	// ServiceCIDRs are cluster-IP ranges configured on the node
	// (--service-cidr). A backend adds them to the snapshot's
	// (portal.Snapshot.ServiceCIDRs, from the ServiceCIDR objects): new
	// connections to an address of either that no Service holds are
	// dropped (nft).
	ServiceCIDRs []netip.Prefix
	// MasqueradeAll masquerades all traffic to Services.
	MasqueradeAll bool
	// MasqueradeBit is the packet mark bit that requests masquerade.
	MasqueradeBit uint
	// SourceRangesOnNodePorts applies loadBalancerSourceRanges to NodePorts too.
	SourceRangesOnNodePorts bool
}

// MasqueradeMark is the mark value of c.MasqueradeBit (default bit 14, as kube-proxy).
func (c Config) MasqueradeMark() uint32 {
	b := c.MasqueradeBit
	if b == 0 || b > 31 {
		b = 14
	}
	return 1 << b
}

// Watcher is a Dataplane that hears at once when someone else changes its
// kernel state: the Runner repairs each change it reports with a full sync,
// without waiting for the next Check, which sees only some changes (the
// nft backend's misses a deleted map element).
type Watcher interface {
	// Watch reports the changes committed to the backend's kernel state
	// by anyone but the backend itself, one KernelChange per burst, until
	// ctx ends. The channel is closed when ctx ends or the watch fails for
	// good; Check remains the fallback.
	Watch(ctx context.Context) (<-chan KernelChange, error)
}

// KernelChange is a burst of changes someone else made to a backend's
// kernel state.
type KernelChange struct {
	// Seen says what changed, as far as the kernel's events tell
	// ("element deleted from endpoints4-01"); a few, not all.
	Seen []string
	// Lost: some events were lost (the socket's buffer overflowed), so
	// anything may have changed.
	Lost bool
}

// String describes the change in one line.
func (c KernelChange) String() string {
	s := strings.Join(c.Seen, "; ")
	if c.Lost {
		if s != "" {
			s += "; "
		}
		s += "events lost"
	}
	return s
}
