package config

import (
	"encoding/json"
	"net/netip"
	"time"

	"github.com/onehop/onehop/portal"
)

// The kinds a --config file may hold, one YAML document each.
const (
	kubeProxyConfigAPIVersion = "kubeproxy.config.k8s.io/v1alpha1"
	kubeProxyConfigKind       = "KubeProxyConfiguration"
	onehopConfigAPIVersion    = "onehop.io/v1alpha1"
	onehopConfigKind          = "OnehopConfiguration"
)

// The dataplane names a config file resolves to: the values of --dataplane.
// OnehopConfiguration's dataplane also takes "nftables" for "nft".
const (
	DataplaneNFTables = "nft"
	DataplaneIPVS     = "ipvs"
)

// kube-proxy's default ports, used when a bind address has no port.
const (
	healthzPort = "10256"
	metricsPort = "10249"
)

// File is what a --config file resolved to. A nil pointer (or nil
// slice) means the file did not set the value, so that flags given
// explicitly on the command line override the file and the file overrides
// the flags' defaults. kube-proxy's "zero means default" fields (0s, null,
// "") count as not set.
type File struct {
	Path string

	// From the KubeProxyConfiguration.
	HostnameOverride    *string // lower-cased and trimmed, as kube-proxy does
	HealthzBindAddress  *string // host:port; from healthzBindAddress, else from bindAddress
	MetricsBindAddress  *string // host:port; from metricsBindAddress, else from bindAddress
	Profiling           *bool   // enableProfiling (only when true)
	ClusterCIDRs        []netip.Prefix
	NodePortAddresses   *NodePortAddresses
	BindAddressHardFail *bool // only when true
	// Dataplane is "nft" or "ipvs" (as --dataplane): OnehopConfiguration.dataplane,
	// else the kube-proxy mode (iptables, the default, becomes nftables).
	Dataplane *string
	// MasqueradeBit, MasqueradeAll, SyncPeriod and MinSyncPeriod come from
	// the section kube-proxy itself used with this file's mode: iptables.*
	// for mode "" and iptables, nftables.* for nftables, and for ipvs
	// ipvs.syncPeriod/minSyncPeriod with iptables.masqueradeBit/All.
	MasqueradeBit *int32
	MasqueradeAll *bool // only when true
	SyncPeriod    *time.Duration
	MinSyncPeriod *time.Duration
	IPVSScheduler *string
	Conntrack     FileConntrack
	// DetectLocalMode is ClusterCIDR or NodeCIDR (the others are refused).
	DetectLocalMode    *string
	Kubeconfig         *string
	QPS                *float32
	Burst              *int32
	ContentType        *string
	AcceptContentTypes *string
	OOMScoreAdj        *int32
	// IPVSTimeouts names the ipvs.*Timeout fields that are set: refused
	// with the IPVS dataplane, not applicable with nftables.
	IPVSTimeouts   []string
	LogVerbosity   *uint32 // logging.verbosity
	LogFormat      *string // logging.format: text or json
	KubeProxyFound bool    // the file held a KubeProxyConfiguration

	// From the OnehopConfiguration.
	ExternalIPCIDRs         []netip.Prefix
	ServiceProxyName        *string
	SourceRangesOnNodePorts *bool
	// Balancing is balancing (--balancing): random or maglev.
	Balancing *string
	// ServiceLimits are the serviceLimits given; zero fields take the
	// defaults (portal.DefaultLimits).
	ServiceLimits portal.Limits
	// External is the cloud hook's section, as JSON, for package external
	// to decode (strictly); nil when absent.
	External    json.RawMessage
	OnehopFound bool // the file held an OnehopConfiguration
}

// FileConntrack is the conntrack section; nil means kube-proxy's default
// (maxPerCore 32768, min 131072, tcpEstablishedTimeout 24h,
// tcpCloseWaitTimeout 1h, others: leave the kernel's value).
type FileConntrack struct {
	MaxPerCore            *int32
	Min                   *int32
	TCPEstablishedTimeout *time.Duration
	TCPCloseWaitTimeout   *time.Duration
	TCPBeLiberal          *bool // only when true
	UDPTimeout            *time.Duration
	UDPStreamTimeout      *time.Duration
}
