package ipvs

import (
	"testing"

	"github.com/onehop/onehop/portal"
)

// TestReportOnceWhileItLasts: a Service's problem is reported by the sync
// that finds it, not by the next ones that find it again, and again once it
// went away and came back; Services a sync did not look at keep theirs.
func TestReportOnceWhileItLasts(t *testing.T) {
	b := &Backend{problems: map[portal.ServiceKey]map[string]bool{}}
	web, db := portal.ServiceKey{Namespace: "a", Name: "web"}, portal.ServiceKey{Namespace: "a", Name: "db"}
	sync := func(looked []portal.ServiceKey, found map[portal.ServiceKey]string) int {
		sp := newSyncProblems()
		for _, k := range looked {
			sp.looked[k] = true
		}
		for k, msg := range found {
			sp.add(k, ReasonVirtualServerFailed, "%s", msg)
		}
		return len(b.report(sp))
	}
	steps := []struct {
		looked []portal.ServiceKey
		found  map[portal.ServiceKey]string
		want   int
	}{
		{[]portal.ServiceKey{web, db}, map[portal.ServiceKey]string{web: "refused", db: "refused"}, 2},
		{[]portal.ServiceKey{web, db}, map[portal.ServiceKey]string{web: "refused", db: "refused"}, 0},
		{[]portal.ServiceKey{web}, nil, 0},                                            // web is fine now
		{[]portal.ServiceKey{web}, map[portal.ServiceKey]string{web: "refused"}, 1},   // and back
		{[]portal.ServiceKey{db}, map[portal.ServiceKey]string{db: "refused"}, 0},     // db kept its problem meanwhile
		{[]portal.ServiceKey{db}, map[portal.ServiceKey]string{db: "other error"}, 1}, // another message is new
	}
	for i, s := range steps {
		if got := sync(s.looked, s.found); got != s.want {
			t.Errorf("step %d: %d problems reported, want %d", i, got, s.want)
		}
	}
}
