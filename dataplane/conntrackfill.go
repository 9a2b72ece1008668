package dataplane

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// The conntrack table's fill. When nf_conntrack_count reaches
// nf_conntrack_max the kernel drops every new connection of the node, pods'
// and Services' alike, and nothing in onehop's rules can help: the operator
// must raise the limit (--conntrack-max-per-core, conntrack.maxPerCore) or
// find what opens so many flows. WatchConntrackFill makes that visible: the
// onehop_conntrack_entries and onehop_conntrack_max gauges, and one warning
// when the table passes conntrackFullAt of its limit, one line again when
// it is back under conntrackClearAt. The count is the agent's network
// namespace's; the limit may be the host's (a namespace other than the
// host's cannot set it).
const (
	conntrackFullAt  = 0.90
	conntrackClearAt = 0.80
)

// ConntrackFillPeriod is how often WatchConntrackFill reads the table's fill:
// two small reads of /proc, whatever the size of the table.
const ConntrackFillPeriod = 5 * time.Second

// conntrackFill remembers whether the table was last seen nearly full, so
// that a table that stays full is told once.
type conntrackFill struct {
	log     *slog.Logger
	metrics *Metrics
	procSys string
	full    bool
}

// WatchConntrackFill reads the conntrack table's fill from procSys
// (/proc/sys) every period until ctx ends. It says nothing while the
// nf_conntrack module is not loaded (the files are then missing).
func WatchConntrackFill(ctx context.Context, log *slog.Logger, m *Metrics, procSys string, period time.Duration) {
	w := &conntrackFill{log: log, metrics: m, procSys: procSys}
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		w.check()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// check reads the count and the limit once, sets the gauges, and tells a
// change between nearly full and clear.
func (w *conntrackFill) check() {
	count, err1 := readProcUint(filepath.Join(w.procSys, "net/netfilter/nf_conntrack_count"))
	limit, err2 := readProcUint(filepath.Join(w.procSys, "net/netfilter/nf_conntrack_max"))
	if err1 != nil || err2 != nil || limit == 0 {
		return
	}
	w.metrics.SetConntrackFill(count, limit)
	fill := float64(count) / float64(limit)
	switch {
	case !w.full && fill >= conntrackFullAt:
		w.full = true
		w.log.Warn("conntrack table nearly full: the kernel drops new connections once it is full; raise nf_conntrack_max (--conntrack-max-per-core, conntrack.maxPerCore) or find what opens the flows",
			"entries", count, "max", limit)
	case w.full && fill < conntrackClearAt:
		w.full = false
		w.log.Info("conntrack table no longer nearly full", "entries", count, "max", limit)
	}
}

// readProcUint reads a /proc/sys file holding one unsigned number.
func readProcUint(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
}

// SetConntrackFill records the conntrack table's entries and limit.
func (m *Metrics) SetConntrackFill(entries, limit uint64) {
	if m == nil {
		return
	}
	m.conntrackEntries.Set(float64(entries))
	m.conntrackMax.Set(float64(limit))
}
