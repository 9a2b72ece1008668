package metallb

import (
	"math"
	"net/netip"
	"time"

	"github.com/onehop/onehop/external/api/v1alpha1"
	"github.com/onehop/onehop/external/config"
)

func (cv *converter) peer(o mlbObject) (*ConvertedObject, []ConvertedObject) {
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
	if p.VRFName != "" {
		cv.warn(o, "vrf %q: onehop peers from the node's default VRF", p.VRFName)
	}
	if p.DisableMP {
		cv.warn(o, "disableMP: onehop carries both address families over one session")
	}
	if p.BFDProfile != "" {
		spec.BFD = cv.bfdOf(o, p.BFDProfile)
	}
	if p.EnableGracefulRestart {
		// FRR's restart time under MetalLB, 120 s, is onehop's default.
		spec.GracefulRestart = &v1alpha1.GracefulRestart{}
		if spec.BFD != nil {
			cv.warn(o, "enableGracefulRestart with bfdProfile: BFD goes down while the agent restarts, and a router that takes that for a failure drops the stale routes (BIRD: bfd graceful)")
		}
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
	return onehopObject(config.KindPeer, o, spec), extra
}

// bfdOf carries MetalLB's BFD profile name over as far as onehop's one
// interval allows.
func (cv *converter) bfdOf(o mlbObject, name string) *v1alpha1.BFD {
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
