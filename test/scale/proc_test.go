package scale

import (
	"io"
	"testing"

	"github.com/onehop/onehop/test/procstat"
)

// cpuSeconds is the user+system CPU time process pid has used.
func cpuSeconds(t *testing.T, pid int) float64 {
	t.Helper()
	s, err := procstat.CPUSeconds(pid)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// memory returns pid's memory figures from /proc/<pid>/status, in bytes:
// VmRSS (resident), VmHWM (its peak), RssAnon (heap, stacks, buffers) and
// RssFile (the binary's pages).
func memory(t *testing.T, pid int) map[string]float64 {
	t.Helper()
	m, err := procstat.Memory(pid)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// loadAvg is the machine's 1, 5 and 15 minute load.
func loadAvg() string { return procstat.LoadAvg() }

// parseMetrics reads the Prometheus text format: name (with its labels,
// if any, as written) -> value.
func parseMetrics(r io.Reader) map[string]float64 {
	m, _ := procstat.ParseMetrics(r)
	return m
}
