package external

import (
	"context"
	"log/slog"
	"maps"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/onehop/onehop/external/api/v1alpha1"
)

// WithDynamicClient gives the hook the client it watches the onehop.io
// custom resources with, and writes their status with (Config.CRDs).
func WithDynamicClient(c dynamic.Interface) Option { return func(h *Hook) { h.dyn = c } }

// crdWatch follows the custom resources (through the dynamic client: the
// objects are decoded into package v1alpha1's types as they are read) and
// the Secrets of the lease namespace: where the cluster-wide part runs,
// all of them (BGP passwords, the webhook's key), and the webhooks and the
// ConfigMaps of the lease namespace (the webhook's CA); in a node agent of
// a split install, the one Secret in which the controller publishes the
// BGP passwords (BGPPasswordsSecretName).
type crdWatch struct {
	factory dynamicinformer.DynamicSharedInformerFactory
	secrets informers.SharedInformerFactory
	pools   cache.SharedIndexInformer
	peers   cache.SharedIndexInformer
	bgpAds  cache.SharedIndexInformer
	l2Ads   cache.SharedIndexInformer
	secret  cache.SharedIndexInformer
	// webhooks and the ConfigMaps of the lease namespace (the webhook's
	// CA): where the cluster-wide part runs, else nil.
	webhooks, configMap cache.SharedIndexInformer
	// published: secret follows the published BGP passwords alone (a
	// node agent of a split install).
	published bool
	// changed is signalled on every change of those, and of this node's
	// own Node (its labels and addresses pick its peers and settings).
	changed chan struct{}

	// Run's goroutine alone: the last accepted version of each object;
	// in the controller of a split install, the BGP passwords to publish
	// (bgpPasswords) and, after a write, the resourceVersion it replaced
	// ("" for none) until the cache shows another (publishPasswords).
	mem           crdMemory
	passwords     map[string]map[string][]byte
	publishedOver *string
}

// watchCRDs sets up the informers; Run starts them.
func (h *Hook) watchCRDs() error {
	w := &crdWatch{changed: make(chan struct{}, 1)}
	w.factory = dynamicinformer.NewDynamicSharedInformerFactory(h.dyn, 0)
	w.pools = w.factory.ForResource(v1alpha1.LoadBalancerIPPools).Informer()
	w.peers = w.factory.ForResource(v1alpha1.BGPPeers).Informer()
	w.bgpAds = w.factory.ForResource(v1alpha1.BGPAdvertisements).Informer()
	w.l2Ads = w.factory.ForResource(v1alpha1.L2Advertisements).Informer()
	secretOpts := []informers.SharedInformerOption{informers.WithNamespace(h.conf().LeaseNamespace)}
	if h.role == roleNode {
		// The one Secret RBAC lets a node agent read (list and watch name
		// it with the field selector metadata.name, so resourceNames
		// holds).
		w.published = true
		secretOpts = append(secretOpts, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", BGPPasswordsSecretName).String()
		}))
	}
	w.secrets = informers.NewSharedInformerFactoryWithOptions(h.client, 0, secretOpts...)
	w.secret = w.secrets.Core().V1().Secrets().Informer()
	if h.role.controller() {
		w.webhooks = w.factory.ForResource(v1alpha1.LoadBalancerWebhooks).Informer()
		w.configMap = w.secrets.Core().V1().ConfigMaps().Informer()
	}
	signal := func(o any) {
		if cm, ok := o.(*corev1.ConfigMap); ok && cm.Name == GrantsConfigMapName {
			return // the controller's own grants, written on every claim: no configuration
		}
		select {
		case w.changed <- struct{}{}:
		default:
		}
	}
	on := cache.ResourceEventHandlerFuncs{AddFunc: signal, UpdateFunc: func(_, o any) { signal(o) }, DeleteFunc: signal}
	for _, inf := range []cache.SharedIndexInformer{w.pools, w.peers, w.bgpAds, w.l2Ads, w.secret, w.webhooks, w.configMap} {
		if inf == nil {
			continue
		}
		if _, err := inf.AddEventHandler(on); err != nil {
			return err
		}
	}
	if h.role.node() {
		own := func(o any) {
			if n, ok := o.(*corev1.Node); ok && n.Name == h.node {
				signal(o)
			}
		}
		if _, err := h.nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: own, UpdateFunc: func(_, o any) { own(o) }}); err != nil {
			return err
		}
	}
	h.crd = w
	return nil
}

// waitSynced waits until the caches hold complete listings, or ctx ends.
// Nothing of the hook runs before (the registry must know the pools), so
// while the API server does not serve the CRDs (deploy/base/crds not
// installed) or refuses the listings, it says so every 30 s.
func (w *crdWatch) waitSynced(ctx context.Context, log *slog.Logger) bool {
	warn := time.NewTicker(30 * time.Second)
	defer warn.Stop()
	done := make(chan bool, 1)
	go func() {
		synced := []cache.InformerSynced{w.pools.HasSynced, w.peers.HasSynced, w.bgpAds.HasSynced, w.l2Ads.HasSynced, w.secret.HasSynced}
		if w.webhooks != nil {
			synced = append(synced, w.webhooks.HasSynced, w.configMap.HasSynced)
		}
		done <- cache.WaitForCacheSync(ctx.Done(), synced...)
	}()
	for {
		select {
		case ok := <-done:
			return ok
		case <-warn.C:
			log.Error("external: still waiting for the onehop.io custom resources and the Secrets of the lease namespace (a node agent: the BGP passwords' Secret alone); are deploy/base/crds installed and the RBAC applied? Nothing of the cloud hook runs until then")
		}
	}
}

// objects reads the caches. An object that does not decode (the API
// server validated it, so only a newer schema can do that) is logged and
// left out.
func (w *crdWatch) objects(log *slog.Logger) crdObjects {
	in := crdObjects{
		pools:   decodeAll[v1alpha1.LoadBalancerIPPool](w.pools, log),
		peers:   decodeAll[v1alpha1.BGPPeer](w.peers, log),
		bgpAds:  decodeAll[v1alpha1.BGPAdvertisement](w.bgpAds, log),
		l2Ads:   decodeAll[v1alpha1.L2Advertisement](w.l2Ads, log),
		secrets: w.secretData(log),
	}
	if w.webhooks != nil {
		in.webhooks = decodeAll[v1alpha1.LoadBalancerWebhook](w.webhooks, log)
		in.configMaps = map[string]map[string][]byte{}
		for _, o := range w.configMap.GetStore().List() {
			cm := o.(*corev1.ConfigMap)
			data := maps.Clone(cm.BinaryData)
			if data == nil {
				data = map[string][]byte{}
			}
			for k, v := range cm.Data {
				data[k] = []byte(v)
			}
			in.configMaps[cm.Name] = data
		}
	}
	return in
}

func decodeAll[T any](inf cache.SharedIndexInformer, log *slog.Logger) []*T {
	var out []*T
	for _, o := range inf.GetStore().List() {
		u, ok := o.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		t := new(T)
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, t); err != nil {
			log.Warn("external: a custom resource does not decode; left out", "kind", u.GetKind(), "name", u.GetName(), "err", err)
			continue
		}
		out = append(out, t)
	}
	return out
}

// object returns the cached object of a verdict, for its status.
func (w *crdWatch) object(kind, name string) (*unstructured.Unstructured, bool) {
	inf := map[string]cache.SharedIndexInformer{kindPool: w.pools, kindPeer: w.peers, kindBGPAd: w.bgpAds, kindL2Ad: w.l2Ads, kindWebhook: w.webhooks}[kind]
	if inf == nil {
		return nil, false
	}
	o, ok, _ := inf.GetStore().GetByKey(name)
	if !ok {
		return nil, false
	}
	u, ok := o.(*unstructured.Unstructured)
	return u, ok
}
