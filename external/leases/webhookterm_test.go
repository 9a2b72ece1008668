package leases

import (
	"log/slog"
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// TestClaimWebhookTerm: each claim raises the Lease's term by one, also
// for the same holder again; another holder's Lease is left alone.
func TestClaimWebhookTerm(t *testing.T) {
	ctx := t.Context()
	c := fake.NewClientset(&coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: AllocatorLeaseName},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: new("n1"), LeaseTransitions: new(int32(9))},
	})
	leases := c.CoordinationV1().Leases("ns")
	for want := uint64(1); want <= 3; want++ {
		got, err := ClaimWebhookTerm(ctx, leases, AllocatorLeaseName, "n1", slog.Default())
		if err != nil || got != want {
			t.Fatalf("claim %d: %d, %v", want, got, err)
		}
	}
	if _, err := ClaimWebhookTerm(ctx, leases, AllocatorLeaseName, "n2", slog.Default()); !errNotHolder(err) {
		t.Fatalf("n2 claimed n1's Lease: %v", err)
	}
	l, err := leases.Get(ctx, AllocatorLeaseName, metav1.GetOptions{})
	if err != nil || l.Annotations[AnnotationWebhookTerm] != "3" || *l.Spec.HolderIdentity != "n1" || *l.Spec.LeaseTransitions != 9 {
		t.Fatalf("Lease after the claims: %+v (%v)", l, err)
	}
	l.Annotations[AnnotationWebhookTerm] = "x"
	if _, err := leases.Update(ctx, l, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := tryClaimWebhookTerm(ctx, leases, AllocatorLeaseName, "n1"); err == nil {
		t.Fatal("a malformed term was overwritten")
	}
}
