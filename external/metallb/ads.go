package metallb

import (
	"strings"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/onehop/onehop/external/api/v1alpha1"
	"github.com/onehop/onehop/external/bgp"
	"github.com/onehop/onehop/external/config"
)

func (s mlbPoolSelection) onehop() v1alpha1.PoolSelection {
	return v1alpha1.PoolSelection{IPAddressPools: s.IPAddressPools, IPAddressPoolSelectors: s.IPAddressPoolSelectors}
}

func (cv *converter) l2Ad(o mlbObject) *ConvertedObject {
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
	return onehopObject(config.KindL2Ad, o, spec)
}

func (cv *converter) bgpAd(o mlbObject) *ConvertedObject {
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
	return onehopObject(config.KindBGPAd, o, spec)
}

// checkAggregation leaves out an aggregation length that the converted
// pools do not fit (onehop would refuse the advertisement: a pool must be
// whole prefixes of that length), with a warning: each address is then
// announced alone. MetalLB checks the CIDRs as written, and avoidBuggyIPs
// or a range can make a pool ragged.
func (cv *converter) checkAggregation(o mlbObject, spec *v1alpha1.BGPAdvertisementSpec) {
	var pools []config.PoolConfig
	poolLabels := map[string]labels.Set{}
	for _, c := range cv.out.Objects {
		if ps, ok := c.Spec.(v1alpha1.LoadBalancerIPPoolSpec); ok && c.Kind == config.KindPool {
			pools = append(pools, config.PoolConfig{Name: c.Metadata.Name, Addresses: ps.Addresses})
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
		err := config.CheckAggregation(o.Metadata.Name, &one, pools, poolLabels)
		if err != nil {
			cv.warn(o, "%s %d left out, each address is announced alone: %v", l.name, **l.v, err)
			*l.v = nil
		}
	}
}
