package vm

import (
	"strings"
	"testing"
)

func TestParseConsole(t *testing.T) {
	lines := []string{
		"SeaBIOS", "ONEHOP-VM-BOOTED uptime=4s",
		"ONEHOP-VM-BEGIN ipvs.test", "=== RUN   TestA", "--- PASS: TestA (1.00s)", "    --- SKIP: TestB/x (0.00s)",
		"--- FAIL: TestC (2.00s)", "FAIL", "ONEHOP-VM-END ipvs.test rc=1",
		"ONEHOP-VM-DONE uptime=9s",
	}
	res, err := parseConsole(lines)
	if err != nil {
		t.Fatal(err)
	}
	r := res["ipvs.test"]
	if r.rc != 1 || r.passed != 1 || r.skipped != 1 || len(r.failed) != 1 {
		t.Errorf("got %+v", r)
	}
	if _, err := parseConsole(lines[:5]); err == nil {
		t.Error("a guest that never finished must be an error")
	}
	if _, err := parseConsole(lines[:len(lines)-1]); err == nil {
		t.Error("a missing DONE marker must be an error")
	}
}

func TestGuestEnv(t *testing.T) {
	got := guestEnv([]string{"PATH=/bin", "ONEHOP_CHURN_SEED=42", "ONEHOP_CHURN_SECONDS=60", "ONEHOP_CHURN_X=a b",
		"ONEHOP_VM_RUN=x", "ONEHOP_DIFFTEST_CASES=5", "ONEHOP_DIFFTEST_SEED=a,b"})
	if got := strings.Join(got, ","); got != "ONEHOP_CHURN_SEED=42,ONEHOP_CHURN_SECONDS=60,ONEHOP_DIFFTEST_CASES=5" {
		t.Errorf("guestEnv: %q", got)
	}
}
