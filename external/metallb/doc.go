// Package metallb carries a MetalLB installation over to onehop: Convert
// turns MetalLB's custom resources (IPAddressPool, BGPPeer,
// BGPAdvertisement, L2Advertisement, BFDProfile) into onehop's
// onehop.io/v1alpha1 ones, saying what does not carry over, and the
// *Annotations lists are MetalLB's Service annotations that onehop reads
// as its own (package external/alloc reads them).
//
// It checks what it writes against the hook's own rules (package
// external/config) and knows nothing else of the hook: it must not import
// package external or any of its subpackages but config, api/v1alpha1 and
// bgp, and it talks to no API server.
package metallb
