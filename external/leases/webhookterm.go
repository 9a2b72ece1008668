package leases

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	typedcoordinationv1 "k8s.io/client-go/kubernetes/typed/coordination/v1"
)

// AnnotationWebhookTerm, on the allocator Lease, is the last leadership
// term a webhook sender claimed. Each new leader raises it by one, with an
// optimistic-concurrency update, before it sends anything; webhook
// generations begin with the term, so a new leader's generations are above
// every earlier leader's, whoever the leaders are and however they stopped.
// Deleting the Lease starts the terms again from 1.
const AnnotationWebhookTerm = "onehop.io/webhook-term"

// ClaimWebhookTerm records the next term on the Lease name, which identity
// must hold, and returns it. It retries conflicts (the elector renews the
// same Lease) and, once a second, other errors (logged), until ctx ends; it
// fails at once when the Lease has another holder.
func ClaimWebhookTerm(ctx context.Context, leases typedcoordinationv1.LeaseInterface, name, identity string, log *slog.Logger) (uint64, error) {
	for {
		term, err := tryClaimWebhookTerm(ctx, leases, name, identity)
		switch {
		case err == nil:
			return term, nil
		case errNotHolder(err):
			return 0, err
		case apierrors.IsConflict(err):
			continue
		}
		log.Warn("external: claiming a webhook term", "lease", name, "err", err)
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("webhook term: %w (last error: %v)", ctx.Err(), err)
		case <-time.After(time.Second):
		}
	}
}

type notHolderError struct{ holder string }

func (e notHolderError) Error() string {
	return fmt.Sprintf("webhook term: the Lease is held by %q", e.holder)
}

func errNotHolder(err error) bool { _, ok := err.(notHolderError); return ok }

func tryClaimWebhookTerm(ctx context.Context, leases typedcoordinationv1.LeaseInterface, name, identity string) (uint64, error) {
	l, err := leases.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return 0, err
	}
	if h := l.Spec.HolderIdentity; h == nil || *h != identity {
		holder := ""
		if h != nil {
			holder = *h
		}
		return 0, notHolderError{holder}
	}
	var last uint64
	if s, ok := l.Annotations[AnnotationWebhookTerm]; ok {
		if last, err = strconv.ParseUint(s, 10, 64); err != nil {
			return 0, fmt.Errorf("webhook term: annotation %s=%q: %w", AnnotationWebhookTerm, s, err)
		}
	}
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	l.Annotations[AnnotationWebhookTerm] = strconv.FormatUint(last+1, 10)
	if _, err := leases.Update(ctx, l, metav1.UpdateOptions{}); err != nil { // fails on a stale resourceVersion
		return 0, err
	}
	return last + 1, nil
}
