package procstat

import (
	"os"
	"strings"
	"testing"
)

func TestOwnProcess(t *testing.T) {
	pid := os.Getpid()
	mem, err := Memory(pid)
	if err != nil {
		t.Fatal(err)
	}
	if mem["VmRSS"] <= 0 || mem["VmHWM"] < mem["VmRSS"] {
		t.Errorf("VmRSS %v, VmHWM %v", mem["VmRSS"], mem["VmHWM"])
	}
	before, err := FDs(pid)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if after, err := FDs(pid); err != nil || after != before+1 {
		t.Errorf("fds %d after opening one more than %d (%v)", after, before, err)
	}
	if _, err := CPUSeconds(pid); err != nil {
		t.Error(err)
	}
	if l := LoadAvg(); len(strings.Fields(l)) != 3 {
		t.Errorf("LoadAvg() = %q", l)
	}
}

func TestParseMetrics(t *testing.T) {
	m, err := ParseMetrics(strings.NewReader(`# HELP go_goroutines Number of goroutines.
# TYPE go_goroutines gauge
go_goroutines 42
onehop_syncs_total{mode="full"} 3
onehop_syncs_total{mode="partial"} 1.5e+03
onehop_syncs_totally 7
`))
	if err != nil {
		t.Fatal(err)
	}
	if m["go_goroutines"] != 42 || m[`onehop_syncs_total{mode="full"}`] != 3 {
		t.Errorf("parsed %v", m)
	}
	if s := m.Sum("onehop_syncs_total"); s != 1503 {
		t.Errorf("Sum = %v, want 1503", s)
	}
}
