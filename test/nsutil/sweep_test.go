package nsutil

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

func TestOwner(t *testing.T) {
	for name, want := range map[string]int{
		"oh1234-9f3a-n1":           1234,
		"oh1234-9f3a":              1234,
		"ohx1c281d-cp":             0, // someone else's naming
		"ohc-07e9f4":               0,
		"oh-1234":                  0,
		"other1234-9f3a-n1":        0,
		"oh99999999999999999999-x": 0,
	} {
		if got := owner(name); got != want {
			t.Errorf("owner(%q) = %d, want %d", name, got, want)
		}
	}
}

func TestRunIDIsOwnedByThisProcess(t *testing.T) {
	id := RunID()
	if !strings.HasPrefix(id, Prefix+strconv.Itoa(os.Getpid())+"-") {
		t.Fatalf("RunID %q does not carry pid %d", id, os.Getpid())
	}
	if owner(id) != os.Getpid() || OwnerGone(id) {
		t.Fatalf("RunID %q: owner %d, gone %v", id, owner(id), OwnerGone(id))
	}
	// A pid that cannot exist (beyond pid_max) counts as gone.
	if !OwnerGone(Prefix + "2147483647-abcd") {
		t.Fatal("a dead owner is not reported gone")
	}
}
