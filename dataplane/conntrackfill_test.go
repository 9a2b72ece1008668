package dataplane

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestConntrackFillToldOnce: a table that passes 90% of its limit is told
// once however long it stays there, the gauges follow every read, and the
// table back under 80% is told once again.
func TestConntrackFillToldOnce(t *testing.T) {
	dir := t.TempDir()
	nf := filepath.Join(dir, "net", "netfilter")
	if err := os.MkdirAll(nf, 0o755); err != nil {
		t.Fatal(err)
	}
	set := func(count, limit int) {
		for name, v := range map[string]int{"nf_conntrack_count": count, "nf_conntrack_max": limit} {
			if err := os.WriteFile(filepath.Join(nf, name), []byte(strconv.Itoa(v)+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	var logs bytes.Buffer
	m := NewMetrics(prometheus.NewRegistry())
	w := &conntrackFill{log: slog.New(slog.NewTextHandler(&logs, nil)), metrics: m, procSys: dir}

	w.check() // no files: nf_conntrack not loaded
	for _, step := range []struct {
		count, limit int
		warns, infos int // lines so far
	}{
		{100, 1000, 0, 0},
		{899, 1000, 0, 0},
		{900, 1000, 1, 0},
		{1000, 1000, 1, 0},
		{1000, 1000, 1, 0},
		{850, 1000, 1, 0}, // under 90%, not yet under 80%
		{950, 1000, 1, 0},
		{799, 1000, 1, 1},
		{10, 1000, 1, 1},
		{990, 1000, 2, 1},
	} {
		set(step.count, step.limit)
		w.check()
		if got := testutil.ToFloat64(m.conntrackEntries); got != float64(step.count) {
			t.Errorf("at %d/%d: onehop_conntrack_entries %v", step.count, step.limit, got)
		}
		if got := testutil.ToFloat64(m.conntrackMax); got != float64(step.limit) {
			t.Errorf("at %d/%d: onehop_conntrack_max %v", step.count, step.limit, got)
		}
		warns := strings.Count(logs.String(), "level=WARN msg=\"conntrack table nearly full")
		infos := strings.Count(logs.String(), "level=INFO msg=\"conntrack table no longer nearly full")
		if warns != step.warns || infos != step.infos {
			t.Fatalf("at %d/%d: %d warnings and %d all-clear lines, want %d and %d; log:\n%s",
				step.count, step.limit, warns, infos, step.warns, step.infos, logs.String())
		}
	}
}
