package alloc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"

	"github.com/onehop/onehop/external/config"
	"github.com/onehop/onehop/external/ipam"
	"github.com/onehop/onehop/portal"
)

// Allocator is the leader's LoadBalancer IP controller. A new one is built
// for every leadership term: it first rebuilds the allocation state from all
// Services' status, then allocates.
type Allocator struct {
	cfg      *config.Parsed
	client   kubernetes.Interface
	services corelisters.ServiceLister
	rec      record.EventRecorder
	log      *slog.Logger
	alloc    *ipam.Allocator
	queue    workqueue.TypedRateLimitingInterface[portal.ServiceKey]
	// waiting are Services refused for want of addresses or because their
	// requested address is taken; a release retries them.
	waiting map[portal.ServiceKey]bool
	// outside are the addresses outside every pool each Service was told
	// it keeps (ipam.Allocator.Outside), so that it is told once, not at
	// every resync or pool change.
	outside map[portal.ServiceKey]string
}

// New builds the allocator of cfg's pools; it writes Service status with
// client, reads Services from services, and puts events with rec.
func New(cfg *config.Parsed, client kubernetes.Interface, services corelisters.ServiceLister, rec record.EventRecorder, log *slog.Logger) (*Allocator, error) {
	a, err := ipam.New(cfg.IPAMPools)
	if err != nil {
		return nil, err
	}
	return &Allocator{
		cfg: cfg, client: client, services: services, rec: rec, log: log, alloc: a,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[portal.ServiceKey](50*time.Millisecond, 30*time.Second),
			workqueue.TypedRateLimitingQueueConfig[portal.ServiceKey]{Name: "onehop-ipam"}),
		waiting: map[portal.ServiceKey]bool{},
		outside: map[portal.ServiceKey]string{},
	}, nil
}

// Inherit takes over what prev, the allocator of the previous pools in
// this leadership term (nil: none), told Services.
func (a *Allocator) Inherit(prev *Allocator) {
	if a != nil && prev != nil {
		a.outside = prev.outside
	}
}

// Rebuild records every IP that managed Services hold in their status,
// oldest Service first, so that a conflict (which only a bug or a manual
// status edit can cause) is resolved in favour of the older one.
func (a *Allocator) Rebuild() error {
	svcs, err := a.services.List(labels.Everything())
	if err != nil {
		return err
	}
	slices.SortFunc(svcs, OlderFirst)
	for _, svc := range svcs {
		ips := StatusIPs(svc)
		if len(ips) == 0 || !Managed(a.cfg, svc) {
			continue
		}
		req, err := RequestFor(svc)
		if err != nil {
			req = ipam.Request{Service: KeyOf(svc)} // the sync reports the bad annotation
		}
		if err := a.alloc.Restore(req, ips); err != nil {
			a.log.Warn("service status holds addresses that cannot be kept", "service", KeyOf(svc), "ips", ips, "err", err)
			a.rec.Eventf(svc, corev1.EventTypeWarning, reasonOf(err), "status addresses %v cannot be kept: %v; allocating again", ips, err)
		}
	}
	a.log.Info("allocator state rebuilt from service status", "services", len(svcs), "ipsInUse", a.alloc.InUse())
	return nil
}

// OlderFirst orders Services oldest first, then by namespace and name.
func OlderFirst(x, y *corev1.Service) int {
	if c := x.CreationTimestamp.Compare(y.CreationTimestamp.Time); c != 0 {
		return c
	}
	return strings.Compare(x.Namespace+"/"+x.Name, y.Namespace+"/"+y.Name)
}

func reasonOf(err error) string {
	var e *ipam.Error
	if errors.As(err, &e) {
		return string(e.Reason)
	}
	return "AllocationFailed"
}

// Enqueue has svc looked at again.
func (a *Allocator) Enqueue(svc *corev1.Service) { a.queue.Add(KeyOf(svc)) }

// SetReserved tells the allocator who holds an address when that is not a
// load-balancer allocation ("" otherwise): it neither hands out nor keeps
// such addresses.
func (a *Allocator) SetReserved(reserved func(netip.Addr) string) { a.alloc.Reserved = reserved }

// retryAll is the queue item that retries every waiting Service.
var retryAll = portal.ServiceKey{}

// RetryWaiting retries the waiting Services: an address a node, a cluster
// IP, an external IP or a Pod held may have been let go. Safe to call from
// any goroutine.
func (a *Allocator) RetryWaiting() { a.queue.Add(retryAll) }

// Run processes the queue until ctx ends. The caller has synced the
// informer and called Rebuild.
func (a *Allocator) Run(ctx context.Context) {
	go func() {
		<-ctx.Done()
		a.queue.ShutDown()
	}()
	svcs, _ := a.services.List(labels.Everything())
	for _, s := range svcs {
		a.Enqueue(s)
	}
	for {
		key, quit := a.queue.Get()
		if quit {
			return
		}
		err := a.sync(ctx, key)
		if err != nil && ctx.Err() == nil {
			a.log.Info("requeue service", "service", key, "err", err)
			a.queue.AddRateLimited(key)
		} else {
			a.queue.Forget(key)
		}
		a.queue.Done(key)
	}
}

func (a *Allocator) release(key portal.ServiceKey) {
	if len(a.alloc.Holds(key)) == 0 {
		return
	}
	a.alloc.Release(key)
	a.log.Info("released load-balancer IPs", "service", key)
	for k := range a.waiting {
		a.queue.Add(k)
	}
}

func (a *Allocator) sync(ctx context.Context, key portal.ServiceKey) error {
	if key == retryAll {
		for k := range a.waiting {
			a.queue.Add(k)
		}
		return nil
	}
	svc, err := a.services.Services(key.Namespace).Get(key.Name)
	if apierrors.IsNotFound(err) {
		delete(a.waiting, key)
		delete(a.outside, key)
		a.release(key)
		return nil
	}
	if err != nil {
		return err
	}
	if !Managed(a.cfg, svc) {
		owned := a.ownsStatus(svc)
		delete(a.waiting, key)
		delete(a.outside, key)
		a.release(key)
		if svc.Spec.Type != corev1.ServiceTypeLoadBalancer && svc.DeletionTimestamp == nil && owned {
			return a.writeStatus(ctx, svc, nil)
		}
		return nil
	}
	if svc.DeletionTimestamp != nil {
		// Served until it is gone: it keeps what it holds and is given
		// nothing new; its deletion releases the addresses.
		delete(a.waiting, key)
		return nil
	}
	for _, msg := range overriddenAliases(svc) {
		a.rec.Event(svc, corev1.EventTypeWarning, "AnnotationIgnored", msg) // the recorder folds repeats
	}
	req, err := RequestFor(svc)
	if err != nil {
		a.rec.Event(svc, corev1.EventTypeWarning, "BadAnnotation", err.Error())
		return nil
	}
	ips, err := a.alloc.Assign(req)
	if err != nil {
		var e *ipam.Error
		if errors.As(err, &e) && (e.Reason == ipam.ReasonExhausted || e.Reason == ipam.ReasonConflict) {
			a.waiting[key] = true // a release may make room
		}
		a.rec.Event(svc, corev1.EventTypeWarning, reasonOf(err), err.Error()) // the recorder folds repeats
		a.log.Info("load-balancer IP refused", "service", key, "err", err)
		return nil
	}
	delete(a.waiting, key)
	a.tellOutside(svc)
	if slices.Equal(sortedAddrs(StatusIPs(svc)), ips) {
		return nil
	}
	if err := a.writeStatus(ctx, svc, ips); err != nil {
		return err
	}
	a.rec.Eventf(svc, corev1.EventTypeNormal, "IPAllocated", "load-balancer IPs %v", ips)
	a.log.Info("load-balancer IPs allocated", "service", key, "ips", ips)
	return nil
}

// tellOutside puts a Warning event on svc when it keeps addresses that no
// pool holds any more (a pool shrank or went away), once for each set of
// such addresses.
func (a *Allocator) tellOutside(svc *corev1.Service) {
	key := KeyOf(svc)
	out := a.alloc.Outside(key)
	if len(out) == 0 {
		delete(a.outside, key)
		return
	}
	s := fmt.Sprint(out)
	if a.outside[key] == s {
		return
	}
	a.outside[key] = s
	a.rec.Eventf(svc, corev1.EventTypeWarning, string(ipam.ReasonOutsidePools),
		"load-balancer IPs %v are outside every address pool now; this Service keeps them, and they are handed to no one else while it holds them", out)
	a.log.Info("service keeps load-balancer IPs outside every pool", "service", key, "ips", out)
}

// ownsStatus: the Service's status holds addresses from onehop's pools, or
// addresses it keeps outside them.
func (a *Allocator) ownsStatus(svc *corev1.Service) bool {
	if len(a.alloc.Holds(KeyOf(svc))) > 0 {
		return true
	}
	for _, ip := range StatusIPs(svc) {
		if a.alloc.PoolOf(ip) != nil {
			return true
		}
	}
	return false
}

// writeStatus sets svc's status.loadBalancer.ingress to ips with a merge
// patch of that list alone, not an update of the whole object: a node
// agent's cache (portal.TrimForSharedCache) lacks the status conditions
// other controllers write, which an update would erase. The patch carries
// svc's resourceVersion, so that, like an update, it fails on a Service
// changed since it was read.
func (a *Allocator) writeStatus(ctx context.Context, svc *corev1.Service, ips []netip.Addr) error {
	var ingress []corev1.LoadBalancerIngress // null in the patch: none
	vip := corev1.LoadBalancerIPModeVIP
	for _, ip := range ips {
		ingress = append(ingress, corev1.LoadBalancerIngress{IP: ip.String(), IPMode: &vip})
	}
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"resourceVersion": svc.ResourceVersion},
		"status":   map[string]any{"loadBalancer": map[string]any{"ingress": ingress}},
	})
	if err != nil {
		return err
	}
	_, err = a.client.CoreV1().Services(svc.Namespace).Patch(ctx, svc.Name, types.MergePatchType, patch, metav1.PatchOptions{}, "status")
	return err
}

func sortedAddrs(a []netip.Addr) []netip.Addr {
	a = slices.Clone(a)
	slices.SortFunc(a, netip.Addr.Compare)
	return a
}
