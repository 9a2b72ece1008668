package external

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/netip"
	"reflect"
	"slices"
	"sort"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/onehop/onehop/external/api/v1alpha1"
	"github.com/onehop/onehop/external/bgp"
)

// MetalLB's custom resources, as far as ConvertMetalLB reads them: the
// fields of metallb.io/v1beta1 IPAddressPool, L2Advertisement,
// BGPAdvertisement and BFDProfile and of v1beta2 (or v1beta1) BGPPeer.

type mlbObject struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   mlbMeta           `json:"metadata"`
	Spec       json.RawMessage   `json:"spec"`
	Items      []json.RawMessage `json:"items"` // kind List, as kubectl get -o yaml prints
}

type mlbMeta struct {
	Name      string            `json:"name"`
	Namespace string            `json:"namespace"`
	Labels    map[string]string `json:"labels"`
}

type mlbPool struct {
	Addresses         []string `json:"addresses"`
	AutoAssign        *bool    `json:"autoAssign"`
	AvoidBuggyIPs     bool     `json:"avoidBuggyIPs"`
	ServiceAllocation *struct {
		Priority           *int32                 `json:"priority"`
		Namespaces         []string               `json:"namespaces"`
		NamespaceSelectors []metav1.LabelSelector `json:"namespaceSelectors"`
		ServiceSelectors   []metav1.LabelSelector `json:"serviceSelectors"`
	} `json:"serviceAllocation"`
}

type mlbPoolSelection struct {
	IPAddressPools         []string               `json:"ipAddressPools"`
	IPAddressPoolSelectors []metav1.LabelSelector `json:"ipAddressPoolSelectors"`
	NodeSelectors          []metav1.LabelSelector `json:"nodeSelectors"`
}

type mlbL2Ad struct {
	mlbPoolSelection
	Interfaces []string `json:"interfaces"`
}

type mlbBGPAd struct {
	mlbPoolSelection
	AggregationLength   *int32   `json:"aggregationLength"`
	AggregationLengthV6 *int32   `json:"aggregationLengthV6"`
	LocalPref           *uint32  `json:"localPref"`
	Communities         []string `json:"communities"`
	Peers               []string `json:"peers"`
}

type mlbPeer struct {
	MyASN          int64                  `json:"myASN"`
	PeerASN        int64                  `json:"peerASN"`
	DynamicASN     string                 `json:"dynamicASN"`
	PeerAddress    string                 `json:"peerAddress"`
	SourceAddress  string                 `json:"sourceAddress"`
	Interface      string                 `json:"interface"`
	PeerPort       int32                  `json:"peerPort"`
	HoldTime       *metav1.Duration       `json:"holdTime"`
	KeepaliveTime  *metav1.Duration       `json:"keepaliveTime"`
	ConnectTime    *metav1.Duration       `json:"connectTime"`
	RouterID       string                 `json:"routerID"`
	NodeSelectors  []metav1.LabelSelector `json:"nodeSelectors"`
	Password       string                 `json:"password"`
	PasswordSecret *struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"passwordSecret"`
	BFDProfile            string `json:"bfdProfile"`
	EnableGracefulRestart bool   `json:"enableGracefulRestart"`
	EBGPMultiHop          bool   `json:"ebgpMultiHop"`
	VRFName               string `json:"vrf"`
	DisableMP             bool   `json:"disableMP"`
}

type mlbBFDProfile struct {
	ReceiveInterval  *int32 `json:"receiveInterval"`
	TransmitInterval *int32 `json:"transmitInterval"`
	DetectMultiplier *int32 `json:"detectMultiplier"`
	EchoInterval     *int32 `json:"echoInterval"`
	EchoMode         bool   `json:"echoMode"`
	PassiveMode      bool   `json:"passiveMode"`
	MinimumTTL       *int32 `json:"minimumTtl"`
}

// MetalLBOptions tune ConvertMetalLB.
type MetalLBOptions struct {
	// SecretNamespace is where onehop reads BGP passwords from: the
	// hook's leaseNamespace (default kube-system).
	SecretNamespace string
}

// MetalLBConversion is what ConvertMetalLB made of MetalLB's resources.
type MetalLBConversion struct {
	// Objects are onehop's resources (and the Secrets of passwords that
	// MetalLB kept in a BGPPeer), pools first, then peers, BGP and L2
	// advertisements, each kind in input order.
	Objects []ConvertedObject
	// Warnings say what could not be carried over, one sentence each.
	Warnings []string
}

// ConvertedObject is one output object and what its source lost.
type ConvertedObject struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   convertedMeta     `json:"metadata"`
	Spec       any               `json:"spec,omitempty"`
	StringData map[string]string `json:"stringData,omitempty"` // a Secret's
	// Warnings are those of Conversion.Warnings about this object.
	Warnings []string `json:"-"`
}

type convertedMeta struct {
	Name      string            `json:"name"`
	Namespace string            `json:"namespace,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
}

// YAML prints the objects as YAML documents, each preceded by its
// warnings as comments.
func (c MetalLBConversion) YAML() ([]byte, error) {
	var b bytes.Buffer
	for i, o := range c.Objects {
		if i > 0 {
			b.WriteString("---\n")
		}
		for _, w := range o.Warnings {
			fmt.Fprintf(&b, "# warning: %s\n", strings.ReplaceAll(w, "\n", " "))
		}
		y, err := yaml.Marshal(o)
		if err != nil {
			return nil, err
		}
		b.Write(y)
	}
	return b.Bytes(), nil
}

// ConvertMetalLB turns MetalLB's custom resources, read from YAML (several
// inputs, each of documents separated by "---", a document possibly a
// List), into onehop's onehop.io/v1alpha1 resources. Whatever has no
// onehop equivalent is left out with a warning; only input that is not
// YAML, or not a Kubernetes object, is an error.
func ConvertMetalLB(opts MetalLBOptions, inputs ...[]byte) (MetalLBConversion, error) {
	if opts.SecretNamespace == "" {
		opts.SecretNamespace = "kube-system"
	}
	var objs []mlbObject
	for _, in := range inputs {
		r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(in)))
		for {
			doc, err := r.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return MetalLBConversion{}, err
			}
			got, err := decodeMetalLB(doc)
			if err != nil {
				return MetalLBConversion{}, err
			}
			objs = append(objs, got...)
		}
	}
	cv := &metalLBConverter{opts: opts, bfd: map[string]mlbBFDProfile{}, names: map[string]bool{}}
	for _, o := range objs {
		if o.Kind == "BFDProfile" && isMetalLB(o) {
			var p mlbBFDProfile
			if cv.decode(o, &p) {
				cv.bfd[o.Metadata.Name] = p
			}
		}
	}
	order := []string{"IPAddressPool", "BGPPeer", "BGPAdvertisement", "L2Advertisement"}
	slices.SortStableFunc(objs, func(a, b mlbObject) int {
		ia, ib := slices.Index(order, a.Kind), slices.Index(order, b.Kind)
		if ia < 0 {
			ia = len(order)
		}
		if ib < 0 {
			ib = len(order)
		}
		return ia - ib
	})
	for _, o := range objs {
		cv.convert(o)
	}
	return cv.out, nil
}

func decodeMetalLB(doc []byte) ([]mlbObject, error) {
	if len(bytes.TrimSpace(doc)) == 0 {
		return nil, nil
	}
	var o mlbObject
	if err := yaml.Unmarshal(doc, &o); err != nil {
		return nil, fmt.Errorf("not YAML: %w", err)
	}
	if o.Kind == "" && o.APIVersion == "" {
		if bytes.Contains(bytes.TrimSpace(doc), []byte(":")) {
			return nil, fmt.Errorf("a document is not a Kubernetes object (no kind):\n%s", doc)
		}
		return nil, nil // comments only
	}
	if !strings.HasSuffix(o.Kind, "List") {
		return []mlbObject{o}, nil
	}
	var out []mlbObject
	for _, it := range o.Items {
		got, err := decodeMetalLB(it)
		if err != nil {
			return nil, err
		}
		out = append(out, got...)
	}
	return out, nil
}

func isMetalLB(o mlbObject) bool { return strings.HasPrefix(o.APIVersion, "metallb.io/") }

type metalLBConverter struct {
	opts  MetalLBOptions
	bfd   map[string]mlbBFDProfile
	names map[string]bool // kind/name already written
	out   MetalLBConversion
	cur   []string // warnings of the object being converted
}

func srcName(o mlbObject) string {
	if o.Metadata.Namespace != "" {
		return o.Kind + " " + o.Metadata.Namespace + "/" + o.Metadata.Name
	}
	return o.Kind + " " + o.Metadata.Name
}

// warn records that src lost something.
func (cv *metalLBConverter) warn(o mlbObject, format string, args ...any) {
	w := srcName(o) + ": " + fmt.Sprintf(format, args...)
	cv.cur = append(cv.cur, w)
	cv.out.Warnings = append(cv.out.Warnings, w)
}

// decode reads o's spec into v, warning of fields it does not know.
func (cv *metalLBConverter) decode(o mlbObject, v any) bool {
	if len(o.Spec) == 0 {
		return true
	}
	if err := json.Unmarshal(o.Spec, v); err != nil {
		cv.warn(o, "spec does not decode, object skipped: %v", err)
		return false
	}
	var keys map[string]json.RawMessage
	if json.Unmarshal(o.Spec, &keys) == nil {
		known := jsonFields(reflect.TypeOf(v).Elem())
		var unknown []string
		for k := range keys {
			if !known[k] {
				unknown = append(unknown, k)
			}
		}
		sort.Strings(unknown)
		for _, k := range unknown {
			cv.warn(o, "spec.%s is unknown to this converter and left out", k)
		}
	}
	return true
}

// jsonFields are the JSON names of t's fields, embedded structs' included.
func jsonFields(t reflect.Type) map[string]bool {
	out := map[string]bool{}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if f.Anonymous && name == "" {
			for k := range jsonFields(f.Type) {
				out[k] = true
			}
			continue
		}
		out[name] = true
	}
	return out
}

func (cv *metalLBConverter) convert(o mlbObject) {
	cv.cur = nil
	if !isMetalLB(o) {
		cv.warn(o, "not a MetalLB resource (apiVersion %q), left out", o.APIVersion)
		return
	}
	var obj *ConvertedObject
	var extra []ConvertedObject
	switch o.Kind {
	case "IPAddressPool":
		obj = cv.pool(o)
	case "BGPPeer":
		obj, extra = cv.peer(o)
	case "BGPAdvertisement":
		obj = cv.bgpAd(o)
	case "L2Advertisement":
		obj = cv.l2Ad(o)
	case "BFDProfile":
		return // read with the peers that name it
	default:
		cv.warn(o, "onehop has no equivalent of MetalLB's %s, left out", o.Kind)
	}
	if obj != nil {
		key := obj.Kind + "/" + obj.Metadata.Name
		if cv.names[key] {
			cv.warn(o, "onehop's %s is cluster-scoped and one of that name was converted already, left out", obj.Kind)
			obj = nil
		}
		cv.names[key] = true
	}
	if obj == nil {
		// The warnings stand alone (stderr); no object carries them.
		return
	}
	obj.Warnings = cv.cur
	cv.out.Objects = append(cv.out.Objects, extra...)
	cv.out.Objects = append(cv.out.Objects, *obj)
}

func onehopObject(kind string, o mlbObject, spec any) *ConvertedObject {
	return &ConvertedObject{APIVersion: v1alpha1.GroupVersion.String(), Kind: kind,
		Metadata: convertedMeta{Name: o.Metadata.Name, Labels: o.Metadata.Labels}, Spec: spec}
}

func (cv *metalLBConverter) pool(o mlbObject) *ConvertedObject {
	var p mlbPool
	if !cv.decode(o, &p) {
		return nil
	}
	// MetalLB hands out every address of a CIDR, network and broadcast
	// addresses included; with avoidBuggyIPs, none ending in .0 or .255.
	spec := v1alpha1.LoadBalancerIPPoolSpec{AutoAssign: p.AutoAssign, AvoidNetworkAndBroadcast: new(false)}
	for _, a := range p.Addresses {
		norm, first, last, err := metalLBAddress(a)
		if err != nil {
			cv.warn(o, "address %q: %v, left out", a, err)
			continue
		}
		if p.AvoidBuggyIPs && first.Is4() {
			f, l := first, last
			if f.As4()[3] == 0 {
				f = f.Next()
			}
			if l.As4()[3] == 255 {
				l = l.Prev()
			}
			if l.Less(f) {
				cv.warn(o, "address %q holds only addresses avoidBuggyIPs avoids, left out", a)
				continue
			}
			if f != first || l != last {
				norm = f.String() + "-" + l.String()
			}
			if f4, l4 := f.As4(), l.As4(); [3]byte(f4[:3]) != [3]byte(l4[:3]) {
				cv.warn(o, "avoidBuggyIPs: onehop hands out the addresses ending in .0 or .255 inside %s", a)
			}
		}
		spec.Addresses = append(spec.Addresses, norm)
	}
	if len(spec.Addresses) == 0 {
		cv.warn(o, "no address onehop can use, pool left out")
		return nil
	}
	if sa := p.ServiceAllocation; sa != nil {
		spec.Priority = sa.Priority
		spec.Namespaces = sa.Namespaces
		spec.ServiceSelectors = sa.ServiceSelectors
		if len(sa.NamespaceSelectors) > 0 {
			cv.warn(o, "serviceAllocation.namespaceSelectors: onehop pools name their namespaces (namespaces), they do not select them by label")
		}
	}
	return onehopObject(kindPool, o, spec)
}

// metalLBAddress reads one of MetalLB's pool addresses: a CIDR, a range
// "first-last" (with or without spaces) or an address; norm is it as
// onehop writes it.
func metalLBAddress(a string) (norm string, first, last netip.Addr, err error) {
	a = strings.TrimSpace(a)
	if f, l, ok := strings.Cut(a, "-"); ok {
		if first, err = netip.ParseAddr(strings.TrimSpace(f)); err != nil {
			return "", first, last, err
		}
		if last, err = netip.ParseAddr(strings.TrimSpace(l)); err != nil {
			return "", first, last, err
		}
		switch {
		case first.Is4() != last.Is4():
			return "", first, last, errors.New("a range of two families")
		case last.Less(first):
			return "", first, last, errors.New("a range that ends before it starts")
		}
		return first.String() + "-" + last.String(), first, last, nil
	}
	if p, err := netip.ParsePrefix(a); err == nil {
		m := p.Masked()
		last := m.Addr()
		for b := m.Bits(); b < m.Addr().BitLen(); b++ {
			last = setBit(last, b)
		}
		return p.String(), m.Addr(), last, nil
	}
	if ip, err := netip.ParseAddr(a); err == nil {
		return ip.String(), ip, ip, nil
	}
	return "", first, last, errors.New("neither a CIDR nor a range")
}

// setBit sets bit i (0 the most significant) of a.
func setBit(a netip.Addr, i int) netip.Addr {
	b := a.AsSlice()
	b[i/8] |= 0x80 >> (i % 8)
	out, _ := netip.AddrFromSlice(b)
	return out
}

func (s mlbPoolSelection) onehop() v1alpha1.PoolSelection {
	return v1alpha1.PoolSelection{IPAddressPools: s.IPAddressPools, IPAddressPoolSelectors: s.IPAddressPoolSelectors}
}

func (cv *metalLBConverter) l2Ad(o mlbObject) *ConvertedObject {
	var a mlbL2Ad
	if !cv.decode(o, &a) {
		return nil
	}
	spec := v1alpha1.L2AdvertisementSpec{PoolSelection: a.onehop(), NodeSelectors: a.NodeSelectors}
	for _, i := range a.Interfaces {
		if len(i) > 15 || strings.ContainsAny(i, "/ \t\n") {
			cv.warn(o, "interface %q is not an interface name, left out", i)
			continue
		}
		spec.Interfaces = append(spec.Interfaces, i)
	}
	return onehopObject(kindL2Ad, o, spec)
}

func (cv *metalLBConverter) bgpAd(o mlbObject) *ConvertedObject {
	var a mlbBGPAd
	if !cv.decode(o, &a) {
		return nil
	}
	spec := v1alpha1.BGPAdvertisementSpec{PoolSelection: a.onehop(), NodeSelectors: a.NodeSelectors,
		AggregationLength: a.AggregationLength, AggregationLengthV6: a.AggregationLengthV6, LocalPref: a.LocalPref}
	for _, c := range a.Communities {
		if _, _, err := bgp.ParseCommunities([]string{c}); err != nil {
			// MetalLB also takes the name of an entry of a Community
			// resource; onehop takes the value itself.
			cv.warn(o, "community %q is not a community value (a MetalLB Community resource's name?), left out: write its value", c)
			continue
		}
		spec.Communities = append(spec.Communities, c)
	}
	if len(a.Peers) > 0 {
		cv.warn(o, "peers %v: onehop announces to every peer of a node; pick the nodes of a peer with its nodeSelector", a.Peers)
	}
	cv.checkAggregation(o, &spec)
	return onehopObject(kindBGPAd, o, spec)
}

// checkAggregation leaves out an aggregation length that the converted
// pools do not fit (onehop would refuse the advertisement: a pool must be
// whole prefixes of that length), with a warning: each address is then
// announced alone. MetalLB checks the CIDRs as written, and avoidBuggyIPs
// or a range can make a pool ragged.
func (cv *metalLBConverter) checkAggregation(o mlbObject, spec *v1alpha1.BGPAdvertisementSpec) {
	var pools []PoolConfig
	poolLabels := map[string]labels.Set{}
	for _, c := range cv.out.Objects {
		if ps, ok := c.Spec.(v1alpha1.LoadBalancerIPPoolSpec); ok && c.Kind == kindPool {
			pools = append(pools, PoolConfig{Name: c.Metadata.Name, Addresses: ps.Addresses})
			poolLabels[c.Metadata.Name] = labels.Set(c.Metadata.Labels)
		}
	}
	for _, l := range []struct {
		name string
		v    **int32
	}{{"aggregationLength", &spec.AggregationLength}, {"aggregationLengthV6", &spec.AggregationLengthV6}} {
		if *l.v == nil {
			continue
		}
		one := v1alpha1.BGPAdvertisementSpec{PoolSelection: spec.PoolSelection}
		if l.name == "aggregationLength" {
			one.AggregationLength = *l.v
		} else {
			one.AggregationLengthV6 = *l.v
		}
		r, err := newAdRule(o.Metadata.Name, one.PoolSelection, nil, nil, "")
		if err == nil {
			r.route, err = bgpRouteAttrs(&one)
		}
		if err == nil {
			err = r.aggregationFits(pools, poolLabels)
		}
		if err != nil {
			cv.warn(o, "%s %d left out, each address is announced alone: %v", l.name, **l.v, err)
			*l.v = nil
		}
	}
}

func (cv *metalLBConverter) peer(o mlbObject) (*ConvertedObject, []ConvertedObject) {
	var p mlbPeer
	if !cv.decode(o, &p) {
		return nil, nil
	}
	switch {
	case p.DynamicASN != "":
		cv.warn(o, "dynamicASN %q: onehop needs the peer's AS number (peerASN), peer left out", p.DynamicASN)
		return nil, nil
	case p.Interface != "":
		cv.warn(o, "interface %q (unnumbered BGP): onehop needs the peer's address, peer left out", p.Interface)
		return nil, nil
	}
	if _, err := netip.ParseAddr(p.PeerAddress); err != nil {
		cv.warn(o, "peerAddress %q is not an IP address, peer left out", p.PeerAddress)
		return nil, nil
	}
	if p.MyASN < 1 || p.MyASN > math.MaxUint32 || p.PeerASN < 1 || p.PeerASN > math.MaxUint32 {
		cv.warn(o, "AS numbers %d and %d: onehop takes 1 to 4294967295, peer left out", p.MyASN, p.PeerASN)
		return nil, nil
	}
	spec := v1alpha1.BGPPeerSpec{MyASN: p.MyASN, PeerASN: p.PeerASN, PeerAddress: p.PeerAddress, PeerPort: p.PeerPort}
	if spec.PeerPort == 179 {
		spec.PeerPort = 0
	}
	if p.HoldTime != nil {
		s := int32(math.Round(p.HoldTime.Seconds()))
		switch {
		case s == 0:
			cv.warn(o, "holdTime %v: onehop always offers a hold time (3 s at the least), 90 s here", p.HoldTime.Duration)
		case s < 3:
			cv.warn(o, "holdTime %v: onehop offers 3 s at the least", p.HoldTime.Duration)
			spec.HoldTimeSeconds = 3
		default:
			spec.HoldTimeSeconds = min(s, 65535)
		}
	}
	if p.KeepaliveTime != nil {
		hold := 90 * time.Second
		if spec.HoldTimeSeconds > 0 {
			hold = time.Duration(spec.HoldTimeSeconds) * time.Second
		}
		if p.KeepaliveTime.Duration != hold/3 {
			cv.warn(o, "keepaliveTime %v: onehop sends keepalives at a third of the hold time, %v", p.KeepaliveTime.Duration, hold/3)
		}
	}
	if p.ConnectTime != nil {
		cv.warn(o, "connectTime %v: onehop retries connections on its own schedule", p.ConnectTime.Duration)
	}
	if p.SourceAddress != "" {
		cv.warn(o, "sourceAddress %s: onehop connects from the address the node's routes pick", p.SourceAddress)
	}
	if p.RouterID != "" {
		cv.warn(o, "routerID %s: onehop reads each node's router ID from its Node (spec.routerID: annotation, label or addressType); unset, it is the node's IPv4 next hop", p.RouterID)
	}
	switch len(p.NodeSelectors) {
	case 0:
	case 1:
		spec.NodeSelector = &p.NodeSelectors[0]
	default:
		spec.NodeSelector = &p.NodeSelectors[0]
		cv.warn(o, "nodeSelectors: onehop's BGPPeer has one nodeSelector; only the first is kept (write the others as one selector, or one peer per node set)")
	}
	if p.EBGPMultiHop {
		if p.MyASN == p.PeerASN {
			cv.warn(o, "ebgpMultiHop on an iBGP session: iBGP is multihop in onehop anyway")
		} else {
			spec.EBGPMultihop = 255
		}
	}
	if p.EnableGracefulRestart {
		cv.warn(o, "enableGracefulRestart: onehop does not negotiate graceful restart")
	}
	if p.VRFName != "" {
		cv.warn(o, "vrf %q: onehop peers from the node's default VRF", p.VRFName)
	}
	if p.DisableMP {
		cv.warn(o, "disableMP: onehop carries both address families over one session")
	}
	if p.BFDProfile != "" {
		spec.BFD = cv.bfdOf(o, p.BFDProfile)
	}
	var extra []ConvertedObject
	switch {
	case p.PasswordSecret != nil && p.PasswordSecret.Name != "":
		spec.PasswordSecret = &v1alpha1.SecretKeyRef{Name: p.PasswordSecret.Name, Key: "password"}
		from := p.PasswordSecret.Namespace
		if from == "" {
			from = o.Metadata.Namespace
		}
		if from != cv.opts.SecretNamespace {
			cv.warn(o, "passwordSecret: onehop reads Secret %q (key password) from namespace %s; copy it there from %s", p.PasswordSecret.Name, cv.opts.SecretNamespace, from)
		}
		if p.Password != "" {
			cv.warn(o, "password: passwordSecret is used instead")
		}
	case p.Password != "":
		name := o.Metadata.Name + "-bgp-password"
		spec.PasswordSecret = &v1alpha1.SecretKeyRef{Name: name, Key: "password"}
		extra = append(extra, ConvertedObject{APIVersion: "v1", Kind: "Secret",
			Metadata:   convertedMeta{Name: name, Namespace: cv.opts.SecretNamespace},
			StringData: map[string]string{"password": p.Password}})
	}
	return onehopObject(kindPeer, o, spec), extra
}

// bfdOf carries MetalLB's BFD profile name over as far as onehop's one
// interval allows.
func (cv *metalLBConverter) bfdOf(o mlbObject, name string) *v1alpha1.BFD {
	p, ok := cv.bfd[name]
	if !ok {
		cv.warn(o, "bfdProfile %q is not in the input: BFD is on with onehop's default interval, 300 ms", name)
		return &v1alpha1.BFD{}
	}
	b := &v1alpha1.BFD{}
	rx, tx := int32(300), int32(300)
	if p.ReceiveInterval != nil {
		rx = *p.ReceiveInterval
	}
	if p.TransmitInterval != nil {
		tx = *p.TransmitInterval
	}
	if rx != tx {
		cv.warn(o, "bfdProfile %q: onehop has one interval for sending and receiving; %d ms, the longer of %d and %d", name, max(rx, tx), rx, tx)
	}
	if iv := max(rx, tx); iv != 300 {
		b.IntervalMillis = min(max(iv, 10), 60000)
	}
	if p.DetectMultiplier != nil && *p.DetectMultiplier != 3 {
		cv.warn(o, "bfdProfile %q: detectMultiplier %d: onehop declares a session down after 3 missed intervals", name, *p.DetectMultiplier)
	}
	if p.EchoMode || p.EchoInterval != nil {
		cv.warn(o, "bfdProfile %q: onehop sends no BFD echo packets", name)
	}
	if p.PassiveMode {
		cv.warn(o, "bfdProfile %q: passiveMode: onehop's BFD has no passive mode", name)
	}
	if p.MinimumTTL != nil {
		cv.warn(o, "bfdProfile %q: minimumTtl %d: onehop runs single-hop BFD (TTL 255)", name, *p.MinimumTTL)
	}
	return b
}
