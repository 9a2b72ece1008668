package external

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
	stageStart  = "start"
	stageUpdate = "update"
)

// The reasons of the events on this node's Node object.
const (
	reasonProviderFailed    = "ProviderFailed"
	reasonProviderRecovered = "ProviderRecovered"
)

// WithProviderHealth makes the hook report its providers' health in the
// agent's /healthz detail (health) and metrics (m): onehop_provider_up and
// onehop_provider_failures_total. Either may be nil. Events on this node's
// Node object are written regardless.
func WithProviderHealth(health *dataplane.HealthServer, m *dataplane.Metrics) Option {
	return func(h *Hook) { h.phealth.health, h.phealth.metrics = health, m }
}

// providerHealth follows each provider's state: whether it runs and took
// its last update, when a failed start is tried again, and which failure
// was last given an event. It reports every change to /healthz, the
// metrics, the log and (on a node) the Node object, with an event once per
// distinct failure and once on recovery, not on every retry. It is used
// from the hook's one Run goroutine.
type providerHealth struct {
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
	// (retryFirst doubling to retryMax), zero while up; next is when.
	backoff time.Duration
	next    time.Time
}

func (p *providerHealth) status(name string) *providerStatus {
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

// failed records that provider name failed at stage with err at now and
// returns when to try again.
func (p *providerHealth) failed(name, stage string, err error, now time.Time) time.Time {
	s := p.status(name)
	s.failure = stage + ": " + err.Error()
	s.backoff = nextBackoff(s.backoff)
	s.next = now.Add(s.backoff)
	p.log.Warn("provider failed; trying again", "provider", name, "stage", stage, "err", err, "in", s.backoff)
	p.metrics.ProviderFailed(name, stage)
	p.metrics.ProviderUp(name, false)
	if p.health != nil {
		p.health.ProviderFailed(name, fmt.Errorf("%s", s.failure))
	}
	if s.failure != s.evented {
		s.evented = s.failure
		p.event(corev1.EventTypeWarning, reasonProviderFailed, "provider %s failed to %s (retried with back-off): %v", name, stage, err)
	}
	return s.next
}

// ok records that provider name runs and took its last update.
func (p *providerHealth) ok(name string) {
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
		p.event(corev1.EventTypeNormal, reasonProviderRecovered, "provider %s recovered (it had failed with %s)", name, s.failure)
	}
	*s = providerStatus{}
}

// due reports whether a provider's next try may run at now.
func (p *providerHealth) due(name string, now time.Time) bool {
	return !now.Before(p.status(name).next)
}

// pending registers provider name as not started yet: down until it starts.
func (p *providerHealth) pending(name string) {
	p.status(name)
	p.metrics.ProviderUp(name, false)
}

func (p *providerHealth) event(typ, reason, msg string, args ...any) {
	if p.rec == nil || p.node == "" {
		return
	}
	// As the kubelet refers to its Node: events of cluster-scoped
	// objects go to the default namespace.
	ref := &corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: p.node, UID: types.UID(p.node)}
	p.rec.Eventf(ref, typ, reason, msg, args...)
}
