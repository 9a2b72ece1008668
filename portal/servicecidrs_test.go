package portal

import (
	"bytes"
	"context"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	fakediscovery "k8s.io/client-go/discovery/fake"
	"k8s.io/client-go/kubernetes/fake"
)

func prefixes(s ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range s {
		out = append(out, netip.MustParsePrefix(p))
	}
	return out
}

func TestUnionCIDRs(t *testing.T) {
	for _, c := range []struct {
		in, want []netip.Prefix
	}{
		{nil, []netip.Prefix{}},
		{prefixes("10.96.0.0/16"), prefixes("10.96.0.0/16")},
		// Held ones go, whatever the order; unmasked ones are masked.
		{prefixes("10.96.5.0/24", "10.96.0.1/16", "10.96.0.0/16"), prefixes("10.96.0.0/16")},
		{prefixes("fd00:96::/112", "10.97.0.0/24", "10.96.0.0/16", "fd00:96::/120"),
			prefixes("10.96.0.0/16", "10.97.0.0/24", "fd00:96::/112")},
		// Adjacent ranges stay two prefixes; the backend merges spans.
		{prefixes("10.96.1.0/24", "10.96.0.0/24"), prefixes("10.96.0.0/24", "10.96.1.0/24")},
		{prefixes("::ffff:10.98.0.0/112"), prefixes("10.98.0.0/16")},
		{[]netip.Prefix{{}}, []netip.Prefix{}},
	} {
		if got := UnionCIDRs(c.in); !slices.Equal(got, c.want) {
			t.Errorf("UnionCIDRs(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}

func serviceCIDR(name string, cidrs ...string) *networkingv1.ServiceCIDR {
	return &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: networkingv1.ServiceCIDRSpec{CIDRs: cidrs}}
}

// TestTrackerServiceCIDRs: the snapshot carries the union of the
// configured ranges and every object's, each change asks for a sync, and a
// range two objects hold stays while one of them does.
func TestTrackerServiceCIDRs(t *testing.T) {
	notified := 0
	tr := NewTracker(Config{NodeName: "n1", ServiceCIDRs: prefixes("10.96.0.0/16")}, nil, func() { notified++ })
	snap := func() []netip.Prefix {
		t.Helper()
		s, _ := tr.Snapshot()
		return s.ServiceCIDRs
	}
	if got := snap(); !slices.Equal(got, prefixes("10.96.0.0/16")) {
		t.Fatalf("flag only: %v", got)
	}
	tr.SetServiceCIDR(serviceCIDR("kubernetes", "10.96.0.0/16", "fd00:96::/112"))
	tr.SetServiceCIDR(serviceCIDR("extra", "10.97.0.0/24", "not-a-cidr"))
	if pending, _ := tr.Pending(); !pending {
		t.Error("a new ServiceCIDR leaves no sync pending")
	}
	if got, want := snap(), prefixes("10.96.0.0/16", "10.97.0.0/24", "fd00:96::/112"); !slices.Equal(got, want) {
		t.Errorf("with two objects: %v, want %v", got, want)
	}
	tr.SetServiceCIDR(serviceCIDR("again", "10.97.0.0/24"))
	if pending, _ := tr.Pending(); pending {
		t.Error("an object that adds no range asks for a sync")
	}
	tr.DeleteServiceCIDR(serviceCIDR("extra"))
	if got, want := snap(), prefixes("10.96.0.0/16", "10.97.0.0/24", "fd00:96::/112"); !slices.Equal(got, want) {
		t.Errorf("a range another object still holds went: %v, want %v", got, want)
	}
	tr.DeleteServiceCIDR(serviceCIDR("again"))
	tr.DeleteServiceCIDR(serviceCIDR("kubernetes"))
	if got := snap(); !slices.Equal(got, prefixes("10.96.0.0/16")) {
		t.Errorf("every object deleted: %v, want the flag's range", got)
	}
	if notified != 6 {
		t.Errorf("notified %d times, want 6", notified)
	}
}

// TestInformersServiceCIDRs: objects reach the snapshot through the
// informers when the API server serves them; without the API the agent
// syncs anyway, on the configured ranges, and says so.
func TestInformersServiceCIDRs(t *testing.T) {
	for _, served := range []bool{true, false} {
		client := fake.NewClientset(serviceCIDR("kubernetes", "10.96.0.0/16"))
		if served {
			client.Discovery().(*fakediscovery.FakeDiscovery).Resources = []*metav1.APIResourceList{{
				GroupVersion: "networking.k8s.io/v1", APIResources: []metav1.APIResource{{Name: "servicecidrs", Kind: "ServiceCIDR"}}}}
		}
		var logs bytes.Buffer
		tr := NewTracker(Config{NodeName: "n1", ServiceCIDRs: prefixes("10.99.0.0/24")}, nil, nil)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		synced, err := (&Informers{Client: client, NodeName: "n1", ServiceCIDRs: true, Log: slog.New(slog.NewTextHandler(&logs, nil))}).Start(ctx, tr)
		if err != nil {
			t.Fatal(err)
		}
		if err := WaitForSync(ctx, synced); err != nil {
			t.Fatalf("served %v: %v", served, err)
		}
		s, _ := tr.Snapshot()
		want := prefixes("10.99.0.0/24")
		if served {
			want = prefixes("10.96.0.0/16", "10.99.0.0/24")
		}
		if !slices.Equal(s.ServiceCIDRs, want) {
			t.Errorf("served %v: snapshot has %v, want %v", served, s.ServiceCIDRs, want)
		}
		if said := strings.Contains(logs.String(), "no ServiceCIDR API"); said == served {
			t.Errorf("served %v: log %q", served, logs.String())
		}
		if served {
			if _, err := client.NetworkingV1().ServiceCIDRs().Create(ctx, serviceCIDR("extra", "10.97.0.0/24"), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			for {
				s, _ := tr.Snapshot()
				if slices.Contains(s.ServiceCIDRs, netip.MustParsePrefix("10.97.0.0/24")) {
					break
				}
				if ctx.Err() != nil {
					t.Fatalf("a ServiceCIDR created at run time never reached the snapshot: %v", s.ServiceCIDRs)
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
		cancel()
	}
}
