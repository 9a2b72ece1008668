package config

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
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/onehop/onehop/external/api/v1alpha1"
)

// WatchOptions say what a Watch follows.
type WatchOptions struct {
	// Dynamic reads the custom resources and writes their status;
	// Client reads the Secrets and ConfigMaps of Namespace, the lease
	// namespace, and writes the published BGP passwords.
	Dynamic   dynamic.Interface
	Client    kubernetes.Interface
	Namespace string
	Log       *slog.Logger
	// ClusterWide: the process runs the hook's cluster-wide part. It reads
	// the LoadBalancerWebhooks and the ConfigMaps of the lease namespace
	// (the webhook's CA).
	ClusterWide bool
	// NodeAgent: a node agent of a split install, which reads the one
	// Secret in which the controller publishes the BGP passwords
	// (BGPPasswordsSecretName) and no other; Publisher: that controller,
	// which publishes them (PublishPasswords).
	NodeAgent, Publisher bool
	// Node names this node, whose own Node object (Nodes' informer) picks
	// its peers and settings by its labels and addresses: a change of it is
	// a change too. Nil Nodes in the controller.
	Node  string
	Nodes cache.SharedIndexInformer
	// Unwatched names a ConfigMap of the lease namespace that is no
	// configuration (the controller's own grants, written on every claim).
	Unwatched string
}

// Watch follows the custom resources (through the dynamic client: the
// objects are decoded into package v1alpha1's types as they are read) and
// the Secrets of the lease namespace: where the cluster-wide part runs,
// all of them (BGP passwords, the webhook's key), and the webhooks and the
// ConfigMaps of the lease namespace (the webhook's CA); in a node agent of
// a split install, the one Secret in which the controller publishes the
// BGP passwords (BGPPasswordsSecretName).
type Watch struct {
	o       WatchOptions
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

	// The hook's Run goroutine alone: the last accepted version of each
	// object; in the controller of a split install, the BGP passwords to
	// publish (bgpPasswords) and, after a write, the resourceVersion it
	// replaced ("" for none) until the cache shows another
	// (PublishPasswords); the status last written to each object
	// (WriteStatus).
	mem           Memory
	passwords     map[string]map[string][]byte
	publishedOver *string
	statusSent    map[string]status
}

// NewWatch sets up the informers; Start starts them.
func NewWatch(o WatchOptions) (*Watch, error) {
	w := &Watch{o: o, changed: make(chan struct{}, 1)}
	w.factory = dynamicinformer.NewDynamicSharedInformerFactory(o.Dynamic, 0)
	w.pools = w.factory.ForResource(v1alpha1.LoadBalancerIPPools).Informer()
	w.peers = w.factory.ForResource(v1alpha1.BGPPeers).Informer()
	w.bgpAds = w.factory.ForResource(v1alpha1.BGPAdvertisements).Informer()
	w.l2Ads = w.factory.ForResource(v1alpha1.L2Advertisements).Informer()
	secretOpts := []informers.SharedInformerOption{informers.WithNamespace(o.Namespace)}
	if o.NodeAgent {
		// The one Secret RBAC lets a node agent read (list and watch name
		// it with the field selector metadata.name, so resourceNames
		// holds).
		w.published = true
		secretOpts = append(secretOpts, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", BGPPasswordsSecretName).String()
		}))
	}
	w.secrets = informers.NewSharedInformerFactoryWithOptions(o.Client, 0, secretOpts...)
	w.secret = w.secrets.Core().V1().Secrets().Informer()
	if o.ClusterWide {
		w.webhooks = w.factory.ForResource(v1alpha1.LoadBalancerWebhooks).Informer()
		w.configMap = w.secrets.Core().V1().ConfigMaps().Informer()
	}
	signal := func(obj any) {
		if cm, ok := obj.(*corev1.ConfigMap); ok && cm.Name == o.Unwatched {
			return // no configuration
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
			return nil, err
		}
	}
	if o.Nodes != nil {
		own := func(obj any) {
			if n, ok := obj.(*corev1.Node); ok && n.Name == o.Node {
				signal(obj)
			}
		}
		if _, err := o.Nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: own, UpdateFunc: func(_, obj any) { own(obj) }}); err != nil {
			return nil, err
		}
	}
	return w, nil
}

// Start starts the informers until stop is closed.
func (w *Watch) Start(stop <-chan struct{}) {
	w.factory.Start(stop)
	w.secrets.Start(stop)
}

// Shutdown waits for the informers to stop.
func (w *Watch) Shutdown() {
	w.secrets.Shutdown()
	w.factory.Shutdown()
}

// Changed is signalled when something the configuration is made of
// changed.
func (w *Watch) Changed() <-chan struct{} { return w.changed }

// Convert converts the objects as the caches hold them now (Convert),
// remembering what it accepted for the next time; the controller of a
// split install keeps the passwords to publish.
func (w *Watch) Convert(base Config) Converted {
	cc, mem := Convert(base, w.objects(w.o.Log), w.mem)
	w.mem = mem
	if w.o.Publisher {
		w.passwords = cc.passwords
	}
	return cc
}

// WaitSynced waits until the caches hold complete listings, or ctx ends.
// Nothing of the hook runs before (the registry must know the pools), so
// while the API server does not serve the CRDs (deploy/base/crds not
// installed) or refuses the listings, it says so every 30 s.
func (w *Watch) WaitSynced(ctx context.Context) bool {
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
			w.o.Log.Error("external: still waiting for the onehop.io custom resources and the Secrets of the lease namespace (a node agent: the BGP passwords' Secret alone); are deploy/base/crds installed and the RBAC applied? Nothing of the cloud hook runs until then")
		}
	}
}

// objects reads the caches. An object that does not decode (the API
// server validated it, so only a newer schema can do that) is logged and
// left out.
func (w *Watch) objects(log *slog.Logger) Objects {
	in := Objects{
		Pools:   decodeAll[v1alpha1.LoadBalancerIPPool](w.pools, log),
		Peers:   decodeAll[v1alpha1.BGPPeer](w.peers, log),
		BGPAds:  decodeAll[v1alpha1.BGPAdvertisement](w.bgpAds, log),
		L2Ads:   decodeAll[v1alpha1.L2Advertisement](w.l2Ads, log),
		Secrets: w.secretData(log),
	}
	if w.webhooks != nil {
		in.Webhooks = decodeAll[v1alpha1.LoadBalancerWebhook](w.webhooks, log)
		in.ConfigMaps = map[string]map[string][]byte{}
		for _, o := range w.configMap.GetStore().List() {
			cm := o.(*corev1.ConfigMap)
			data := maps.Clone(cm.BinaryData)
			if data == nil {
				data = map[string][]byte{}
			}
			for k, v := range cm.Data {
				data[k] = []byte(v)
			}
			in.ConfigMaps[cm.Name] = data
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
func (w *Watch) object(kind, name string) (*unstructured.Unstructured, bool) {
	inf := map[string]cache.SharedIndexInformer{KindPool: w.pools, KindPeer: w.peers, KindBGPAd: w.bgpAds, KindL2Ad: w.l2Ads, KindWebhook: w.webhooks}[kind]
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
