package providers

import (
	"fmt"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"

	"github.com/onehop/onehop/dataplane"
)

// The stages a provider fails at (onehop_provider_failures_total's stage).
const (
	StageStart  = "start"
	StageUpdate = "update"
)

// The back-off of a provider's failed start or update: RetryFirst,
// doubling up to RetryMax.
const (
	RetryFirst = time.Second
	RetryMax   = 30 * time.Second
)

// NextBackoff is the back-off after one of d: RetryFirst after none,
// doubling up to RetryMax.
func NextBackoff(d time.Duration) time.Duration {
	if d <= 0 {
		return RetryFirst
	}
	return min(2*d, RetryMax)
}

// The reasons of the events on this node's Node object.
const (
	reasonProviderFailed    = "ProviderFailed"
	reasonProviderRecovered = "ProviderRecovered"
)

// Health follows each provider's state: whether it runs and took
// its last update, when a failed start is tried again, and which failure
// was last given an event. It reports every change to /healthz, the
// metrics, the log and (on a node) the Node object, with an event once per
// distinct failure and once on recovery, not on every retry. It is used
// from the hook's one Run goroutine.
type Health struct {
	node    string // "" in the controller: no Node to put events on
	log     *slog.Logger
	rec     record.EventRecorder // nil: no events
	health  *dataplane.HealthServer
	metrics *dataplane.Metrics
	st      map[string]*providerStatus
}

// providerStatus is one provider's state.
type providerStatus struct {
	// failure is the failure now ("start: ..." or "update: ..."); ""
	// while the provider is up.
	failure string
	// evented is the failure the last ProviderFailed event named.
	evented string
	// backoff is the wait before the next try after the last failure
	// (RetryFirst doubling to RetryMax), zero while up; next is when.
	backoff time.Duration
	next    time.Time
}

// NewHealth reports the providers of node ("" in the controller: no
// Node to put events on) to log, rec (nil: no events), health and metrics
// (either may be nil).
func NewHealth(node string, log *slog.Logger, rec record.EventRecorder, health *dataplane.HealthServer, metrics *dataplane.Metrics) *Health {
	return &Health{node: node, log: log, rec: rec, health: health, metrics: metrics}
}

// Next is when provider name's next try is due.
func (p *Health) Next(name string) time.Time { return p.status(name).next }

func (p *Health) status(name string) *providerStatus {
	if p.st == nil {
		p.st = map[string]*providerStatus{}
	}
	s := p.st[name]
	if s == nil {
		s = &providerStatus{}
		p.st[name] = s
	}
	return s
}

// Failed records that provider name failed at stage with err at now and
// returns when to try again.
func (p *Health) Failed(name, stage string, err error, now time.Time) time.Time {
	s := p.status(name)
	s.failure = stage + ": " + err.Error()
	s.backoff = NextBackoff(s.backoff)
	s.next = now.Add(s.backoff)
	p.log.Warn("provider failed; trying again", "provider", name, "stage", stage, "err", err, "in", s.backoff)
	p.metrics.ProviderFailed(name, stage)
	p.metrics.ProviderUp(name, false)
	if p.health != nil {
		p.health.ProviderFailed(name, fmt.Errorf("%s", s.failure))
	}
	if s.failure != s.evented {
		s.evented = s.failure
		p.Event(corev1.EventTypeWarning, reasonProviderFailed, "provider %s failed to %s (retried with back-off): %v", name, stage, err)
	}
	return s.next
}

// OK records that provider name runs and took its last update.
func (p *Health) OK(name string) {
	s := p.status(name)
	p.metrics.ProviderUp(name, true)
	if s.failure == "" && s.evented == "" {
		return
	}
	p.log.Info("provider recovered", "provider", name, "after", s.failure)
	if p.health != nil {
		p.health.ProviderFailed(name, nil)
	}
	if s.evented != "" {
		p.Event(corev1.EventTypeNormal, reasonProviderRecovered, "provider %s recovered (it had failed with %s)", name, s.failure)
	}
	*s = providerStatus{}
}

// Due reports whether a provider's next try may run at now.
func (p *Health) Due(name string, now time.Time) bool {
	return !now.Before(p.status(name).next)
}

// Pending registers provider name as not started yet: down until it starts.
func (p *Health) Pending(name string) {
	p.status(name)
	p.metrics.ProviderUp(name, false)
}

// Reset forgets provider name's failures and back-off: it is configured
// anew (or no more).
func (p *Health) Reset(name string) {
	if p.st[name] == nil {
		return
	}
	if p.health != nil {
		p.health.ProviderFailed(name, nil)
	}
	delete(p.st, name)
}

// Event puts an event on this node's Node object (none in the
// controller).
func (p *Health) Event(typ, reason, msg string, args ...any) {
	if p.rec == nil || p.node == "" {
		return
	}
	// As the kubelet refers to its Node: events of cluster-scoped
	// objects go to the default namespace.
	ref := &corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: p.node, UID: types.UID(p.node)}
	p.rec.Eventf(ref, typ, reason, msg, args...)
}
